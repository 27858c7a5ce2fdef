"""fp16 mixed precision on TPU: ``fp16=True`` (most GPU fine-tuning scripts) trains in bf16 with one
warning naming ``bf16=True`` (``training_policy.mixed_precision``, glued by ``accelerate_state``)."""

from __future__ import annotations

import logging

import pytest

from transformers_tpu_ext.core import wrapping
from transformers_tpu_ext.training import policy as training_policy


def test_fp16_becomes_bf16_on_tpu_only():
    assert training_policy.mixed_precision("fp16", on_tpu=True) == ("bf16", training_policy.FP16_NOTE)
    assert training_policy.mixed_precision("FP16", on_tpu=True)[0] == "bf16"
    assert "bf16=True" in training_policy.FP16_NOTE and "\n" not in training_policy.FP16_NOTE
    for requested in ("no", "bf16", "fp8", None):
        assert training_policy.mixed_precision(requested, on_tpu=True) == (requested, None)
    assert training_policy.mixed_precision("fp16", on_tpu=False) == ("fp16", None)
    assert training_policy.mixed_precision("fp16", on_tpu=True, deepspeed=True) == ("fp16", None)


torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

import _training  # noqa: E402


@pytest.fixture
def warnings_seen(monkeypatch, caplog):
    monkeypatch.setattr(wrapping, "_warned", set())
    caplog.set_level(logging.WARNING, logger="transformers_tpu_ext")
    return lambda: [r.getMessage() for r in caplog.records if "fp16" in r.getMessage()]


def test_accelerator_fp16_trains_in_bf16_on_tpu_with_one_warning(simulated_tpu, warnings_seen):
    from accelerate import Accelerator

    _training.reset_accelerate()
    accelerator = Accelerator(mixed_precision="fp16")  # upstream: ValueError "requires a device in (...)"
    assert accelerator.device.type == "tpu" and accelerator.mixed_precision == "bf16"
    assert accelerator.scaler is None
    model = torch.nn.Linear(4, 4).to(accelerator.device)
    with accelerator.autocast():
        out = model(torch.ones(2, 4, device=accelerator.device))
    assert out.dtype == torch.bfloat16  # torch_tpu's autocast
    again = Accelerator(mixed_precision="fp16")  # the state is shared: no "already initialized" error
    assert again.mixed_precision == "bf16"
    seen = warnings_seen()
    assert len(seen) == 1 and "bf16=True" in seen[0], seen


def test_accelerate_config_fp16_from_the_environment(simulated_tpu, warnings_seen, monkeypatch):
    from accelerate import Accelerator

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    _training.reset_accelerate()
    assert Accelerator().mixed_precision == "bf16"
    assert len(warnings_seen()) == 1


def test_an_explicit_precision_wins_over_the_environment_and_later_states_keep_it(simulated_tpu, warnings_seen, monkeypatch):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # e.g. from `accelerate launch`
    _training.reset_accelerate()
    accelerator = Accelerator(mixed_precision="no")
    # Accelerate's own later AcceleratorState() calls pass no precision: upstream keeps "no" and checks nothing
    assert AcceleratorState().mixed_precision == "no" and accelerator.mixed_precision == "no"
    assert warnings_seen() == []


def test_fp16_on_the_cpu_is_upstream_s(simulated_tpu, warnings_seen):
    from accelerate import Accelerator

    _training.reset_accelerate()
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    assert accelerator.device.type == "cpu" and accelerator.mixed_precision == "fp16"
    assert warnings_seen() == []


@_training.requires_trainer
def test_trainer_fp16_true_trains_like_bf16_true_on_tpu(simulated_tpu, warnings_seen, tmp_path):
    fp16 = _training.trainer(str(tmp_path / "fp16"), use_cpu=False, max_steps=3, fp16=True)
    fp16.train()
    bf16 = _training.trainer(str(tmp_path / "bf16"), use_cpu=False, max_steps=3, bf16=True)
    bf16.train()
    assert fp16.accelerator.mixed_precision == "bf16" and fp16.model.device.type == "tpu"
    assert _training.losses(fp16) == _training.losses(bf16)
    assert len(warnings_seen()) == 1
