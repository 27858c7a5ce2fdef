"""LoRA with PEFT on the (simulated) TPU: the losses of a CPU run, adapters that save and reload (docs/training.md)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

import _training  # noqa: E402
from _training import losses, max_diff, requires_trainer, trainer  # noqa: E402

from transformers_tpu_ext.testing.tiny import tiny_model  # noqa: E402


def _lora(seed: int = 0):
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                             init_lora_weights="gaussian")  # non-zero B: the adapter changes the output from step 1
    torch.manual_seed(seed)
    return peft.get_peft_model(tiny_model("qwen3", seed=0), config)


@requires_trainer
def test_lora_trains_on_tpu_like_cpu_and_the_adapter_saves_and_reloads(simulated_tpu, tmp_path):
    torch.set_num_threads(1)
    cpu = trainer(str(tmp_path / "cpu"), use_cpu=True, model=_lora(), max_steps=6)
    cpu.train()
    model = _lora()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    tpu = trainer(str(tmp_path / "tpu"), use_cpu=False, model=model, max_steps=6)
    tpu.train()
    assert next(model.parameters()).device.type == "tpu"
    assert max_diff(losses(tpu), losses(cpu)) < 1e-3
    # only the adapter trained
    assert all(torch.equal(p.detach().cpu(), frozen[n]) for n, p in model.named_parameters() if n in frozen)

    model.save_pretrained(tmp_path / "adapter")
    reloaded = peft.PeftModel.from_pretrained(tiny_model("qwen3", seed=0).to("tpu"), tmp_path / "adapter")
    ids = torch.tensor([[5, 9, 17, 33, 2, 8]])
    model.eval()
    with torch.no_grad():
        expected = model(ids.to("tpu")).logits.cpu()
        got = reloaded(ids.to("tpu")).logits.cpu()
    assert reloaded.device.type == "tpu" and torch.allclose(got, expected, atol=1e-6)
    _training.reset_accelerate()
