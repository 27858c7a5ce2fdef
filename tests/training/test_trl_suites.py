"""What TRL's own test suites found on the simulated TPU (``scripts/peer_trl.sh``; docs/training.md, "Checked
against TRL's own tests"): each test here failed with the plugin active and passes with
``TRANSFORMERS_TPU_EXT_DISABLE=1``."""

from __future__ import annotations

import copy
import pickle

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from transformers_tpu_ext.testing.tiny import tiny_model  # noqa: E402


@pytest.mark.parametrize("kind", ["prompt_tuning", "lora"])
def test_a_peft_model_deep_copies_with_the_plugin_active(simulated_tpu, kind):
    # TRL's test_sft_trainer.py::TestPatchChunkedCELMHead::test_forward_matches_reference_with_peft[prompt_tuning]
    # (and [prompt_encoder], [prefix_tuning]) deep-copy a PEFT model on the TPU. PeftModelForCausalLM keeps
    # `base_model.prepare_inputs_for_generation`, a GenerationMixin method the plugin wraps, and wrapt's bound
    # wrapper refused to be copied: "object proxy must define __deepcopy__()".
    if kind == "lora":
        config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    else:
        config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    model = peft.get_peft_model(tiny_model("qwen3", seed=0).to("tpu"), config)
    assert hasattr(model.base_model_prepare_inputs_for_generation, "__wrapped__")  # through the plugin's wrapper
    copied = copy.deepcopy(model)
    bound = copied.base_model_prepare_inputs_for_generation
    assert bound.__self__ is not model.base_model_prepare_inputs_for_generation.__self__  # bound to the copy
    assert hasattr(bound, "__wrapped__")  # and still through the plugin's wrapper
    ids = torch.tensor([[5, 9, 17, 33, 2, 8]], device="tpu")
    with torch.no_grad():
        assert torch.equal(copied(input_ids=ids).logits.cpu(), model(input_ids=ids).logits.cpu())


def test_a_wrapped_method_copies_and_pickles_as_a_bound_method(simulated_tpu):
    model = tiny_model("qwen3", seed=0)  # on the CPU: pickling goes through its state, not the device's
    method = model.prepare_inputs_for_generation
    assert hasattr(method, "__wrapped__")
    assert copy.copy(method).__self__ is model
    restored = pickle.loads(pickle.dumps(method))
    assert type(restored.__self__) is type(model) and restored.__self__ is not model
    assert hasattr(restored, "__wrapped__")
