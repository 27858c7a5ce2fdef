"""QLoRA-style fine-tuning on the simulated TPU: PEFT LoRA adapters on an int8 or FP8 base, with the Trainer.

Each base trains the same adapter (saved once, before training, and loaded on both sides: PEFT draws
LoRA's initial weights differently over ``FP8Linear`` than over ``nn.Linear``) for a few steps on the
TPU and on the CPU (the same script in a process that sees no TPU; FP8's CPU side is the checkpoint
loaded with ``dequantize=True``). Losses must agree; the base must stay quantized on the TPU; the
trained adapter must save and load back with the same logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

pytest.importorskip("torchao")
pytest.importorskip("peft")

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("qlora_worker.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    shared = str(tmp_path_factory.mktemp("qlora"))
    out = {}
    for base in ("int8", "fp8"):
        for where in ("cpu", "tpu"):  # the CPU run first: it saves the checkpoints and the initial adapter
            env = {"WHERE": where, "BASE": base, "SHARED": shared, "OMP_NUM_THREADS": "1"}
            out[base, where] = run_python(SCRIPT, env=env, timeout=900)[0]
    return out


@pytest.mark.parametrize("base", ["int8", "fp8"])
def test_lora_on_a_quantized_base_trains_on_the_tpu_like_on_the_cpu(runs, base):
    tpu, cpu = runs[base, "tpu"], runs[base, "cpu"]
    assert tpu["lora_device"] == "tpu:0"
    assert len(tpu["losses"]) == len(cpu["losses"]) == 6
    assert tpu["losses"] == pytest.approx(cpu["losses"], rel=1e-4)
    assert tpu["losses"][-1] < tpu["losses"][0]  # it learns


def test_the_base_stays_quantized_on_the_tpu(runs):
    assert runs["int8", "tpu"]["base"] == ["Linear", "Int8Tensor", ["torch.float32", "torch.int8"], "tpu:0"]
    assert runs["fp8", "tpu"]["base"] == ["FP8Linear", "TpuTensor", ["torch.float8_e4m3fn"], "tpu:0"]
    assert runs["int8", "tpu"]["lora_layer"] == "TorchaoLoraLinear"  # PEFT's layer for torchao bases
    for base in ("int8", "fp8"):
        assert runs[base, "tpu"]["base_after"] == runs[base, "tpu"]["base"][2:]  # frozen, still 8-bit


@pytest.mark.parametrize("base", ["int8", "fp8"])
def test_adapters_save_and_load_back(runs, base):
    tpu = runs[base, "tpu"]
    assert tpu["reload_equal"]
    assert "adapter_model.safetensors" in tpu["adapter_files"] and "adapter_config.json" in tpu["adapter_files"]
