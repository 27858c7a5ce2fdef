"""Quantized models on the simulated TPU, against the same quantized model on the CPU.

One fresh interpreter loads context-sensitive tiny models (float32: the simulator matches the CPU bit for
bit there) and reports what a user would see:

- int8 weight-only (torchao ``Int8WeightOnlyConfig``): where the weights are and in what, bytes, tokens of
  ``generate()`` and of continuous batching, programs compiled against the unquantized model's, placement
  under a budget that holds the int8 model only, the bytes the serving cache budget subtracts;
- FineGrainedFP8 checkpoints (:func:`~transformers_tpu_ext.testing.tiny.save_tiny_fp8_model`): kept float8 on
  the TPU, tokens equal to the CPU model loaded with ``dequantize=True``, on-the-fly quantization, offload,
  the messages of the loads that cannot stay 8-bit;
- ``load_in_8bit`` / ``load_in_4bit``: one message naming the TPU alternative.

A second interpreter with the quantization patches disabled shows the FP8 and bitsandbytes facts come
from them (upstream: FP8 dequantized to bf16, bitsandbytes' own import error).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

# Its scenarios run in a fresh interpreter (a worker script): the everyday loop (-m "not slow") skips them.
pytestmark = pytest.mark.slow

pytest.importorskip("torchao")

SCRIPT = Path(__file__).with_name("quantized_models_worker.py")


#: Small serving ladders (two step shapes) keep the continuous-batching warm-up short.
ENV = {"TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "32", "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "8"}


@pytest.fixture(scope="module")
def seen():
    return run_python(SCRIPT, env=ENV, timeout=900)[0]


@pytest.fixture(scope="module")
def disabled():
    env = {"MODE": "disabled", "TRANSFORMERS_TPU_EXT_DISABLE": "quantizers,finegrained_fp8"}
    return run_python(SCRIPT, env=env, timeout=900)[0]


def test_the_references_are_quantized_and_context_sensitive(seen):
    # The int8 and FP8 models compute other logits than the unquantized one: their tokens prove the quantized path.
    assert seen["logits_differ"]["int8"] > 1e-3 and seen["logits_differ"]["fp8"] > 1e-3
    assert seen["cpu_fp8_is_plain_linear"]


def test_int8_weights_stay_int8_on_the_tpu_and_give_the_cpu_tokens(seen):
    int8 = seen["int8"]
    assert int8["where"] == ["Linear", "Int8Tensor", "torch.float32", "tpu:0", ["torch.float32", "torch.int8"]]
    assert int8["match"]
    # Eager logits: the simulator's attention is decomposed (not the CPU's fused kernel); far closer than int8's change.
    assert int8["logits"] < 1e-4 < 1e-2 < seen["logits_differ"]["int8"]
    assert int8["bytes"] <= 0.6 * int8["bf16"]


def test_int8_compiles_no_more_programs_than_the_unquantized_model(seen):
    plain, int8 = seen["plain"], seen["int8"]
    assert plain["match"]
    assert int8["programs"]["graphs_compiled"] <= plain["programs"]["graphs_compiled"]
    assert int8["programs"]["eager_programs"] <= plain["programs"]["eager_programs"]
    assert int8["second"]["graphs_compiled"] == int8["second"]["eager_programs"] == 0


def test_placement_counts_quantized_bytes(seen):
    placed = seen["placement"]["placed"]
    assert placed["int8"] == ["tpu"]  # wholly on the TPU
    assert "cpu" in placed["plain"]  # the unquantized model offloads under the same budget


def test_serving_budget_counts_the_inner_tensors_of_quantized_weights(seen):
    int8 = seen["int8"]
    # torchao's wrappers report data_ptr() 0 and their outer dtype: counted by their inner tensors, each once.
    assert int8["resident"] == int8["resident_truth"]
    assert int8["resident"] < int8["plain_resident"]
    assert seen["int8_cb"]["resident"] == int8["resident"]


def test_int8_continuous_batching_matches_per_request_generate(seen):
    assert seen["int8_cb"]["match"]


def test_fp8_checkpoint_stays_8bit_and_matches_the_dequantized_cpu_model(seen):
    fp8 = seen["fp8"]
    assert fp8["where"] == ["FP8Linear", "TpuTensor", "torch.float8_e4m3fn", "tpu:0", ["torch.float8_e4m3fn"]]
    assert fp8["match"]
    assert fp8["logits"] < 1e-4 < 1e-2 < seen["logits_differ"]["fp8"]
    assert fp8["bytes"] <= 0.6 * fp8["bf16"]
    assert fp8["programs"]["graphs_compiled"] <= seen["plain"]["programs"]["graphs_compiled"]
    assert fp8["programs"]["eager_programs"] <= seen["plain"]["programs"]["eager_programs"]
    assert fp8["second"]["graphs_compiled"] == fp8["second"]["eager_programs"] == 0


def test_fp8_on_the_fly_and_offload(seen):
    assert seen["fp8_on_the_fly"]["where"][0] == "FP8Linear" and seen["fp8_on_the_fly"]["where"][3] == "tpu:0"
    assert seen["fp8_on_the_fly"]["same_as_checkpoint"]  # Transformers' quantization, bit for bit
    assert seen["fp8_offload"]["map"] == ["cpu", "tpu"] and seen["fp8_offload"]["match"]


def test_fp8_loads_that_cannot_stay_8bit(seen):
    assert seen["fp8_no_device_map"][:4] == ["Linear", "Parameter", "torch.float32", "cpu"]  # upstream's rule
    assert seen["fp8_dequantize"][:4] == ["Linear", "TpuTensor", "torch.float32", "tpu:0"]  # as asked
    message = seen["fp8_all_on_host"]
    assert message.startswith("ValueError: FP8 weights were kept 8-bit for the TPU") and "dequantize=True" in message


def test_bitsandbytes_on_a_tpu_is_one_message_naming_the_alternative(seen):
    for key in ("8bit", "4bit"):
        message = seen["bnb"][key]
        assert message.startswith(f"ValueError: bitsandbytes (load_in_{key}) has no TPU backend")
        assert "TorchAoConfig(Int8WeightOnlyConfig())" in message
    # On the host, and without a TPU, upstream's own check runs (bitsandbytes is not installed here).
    assert "requires bitsandbytes" in seen["bnb"]["host"] or seen["bnb"]["host"] is None
    assert "requires bitsandbytes" in seen["bnb_off_tpu"] or seen["bnb_off_tpu"] is None


def test_deactivate_restores_the_originals(seen):
    assert seen["reverted"] and seen["reapplied"]


def test_without_the_patches_fp8_is_dequantized_and_bitsandbytes_fails_its_own_way(disabled):
    assert disabled["fp8"]["where"][:3] == ["Linear", "TpuTensor", "torch.float32"]  # 2x (here 4x) the bytes
    assert disabled["fp8"]["bytes"] > disabled["fp8"]["bf16"]
    assert "has no TPU backend" not in (disabled["bnb"]["8bit"] or "")
