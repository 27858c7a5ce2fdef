"""Shared training workload of the tests: a tiny context-sensitive Qwen3, varied lengths, Trainer runs."""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from typing import Any

import pytest

from transformers_tpu_ext import activation, config

STEPS = 24
BATCH = 4


def _trainer_runs() -> bool:
    from accelerate import Accelerator

    return "keep_torch_compile" in inspect.signature(Accelerator.unwrap_model).parameters


#: Transformers 5.24's Trainer calls ``unwrap_model(..., keep_torch_compile=False)``, which Accelerate
#: 1.1 lacks: there the Trainer fails on any device, CPU included (the matrix's oldest combination).
requires_trainer = pytest.mark.skipif(
    not _trainer_runs(), reason="Transformers 5.24's Trainer needs Accelerate >= 1.2 (unwrap_model(keep_torch_compile=...)), on any device"
)


def reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@contextlib.contextmanager
def patches_disabled(*names: str) -> Iterator[None]:
    """Run the block with some patches switched off (``TRANSFORMERS_TPU_EXT_DISABLE``), in-process."""
    before = os.environ.get(config.DISABLE_ENV)
    os.environ[config.DISABLE_ENV] = ",".join(names)
    activation.deactivate()
    activation.activate()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(config.DISABLE_ENV, None)
        else:
            os.environ[config.DISABLE_ENV] = before
        activation.deactivate()
        activation.activate()


def collator() -> Any:
    from transformers import DataCollatorForLanguageModeling

    from transformers_tpu_ext.testing.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"
    return DataCollatorForLanguageModeling(tokenizer, mlm=False)


def trainer(tmp: str, *, use_cpu: bool, data: Any = None, eval_data: Any = None, callbacks: Any = (),
            model: Any = None, **overrides: Any) -> Any:
    """A Trainer on the tiny Qwen3 (seed 0) with the issue's settings: batch 4, linear schedule."""
    from transformers import Trainer, TrainingArguments

    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset, tiny_model

    reset_accelerate()
    settings = dict(
        output_dir=tmp, per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH, max_steps=STEPS,
        logging_steps=1, report_to=[], learning_rate=1e-3, lr_scheduler_type="linear", save_strategy="no",
        seed=0, disable_tqdm=True, use_cpu=use_cpu,
    )
    settings.update(overrides)
    return Trainer(
        model=model if model is not None else tiny_model("qwen3", seed=0),
        args=TrainingArguments(**settings),
        train_dataset=data if data is not None else tiny_lm_dataset(),
        eval_dataset=eval_data,
        data_collator=collator(),
        callbacks=list(callbacks),
    )


def losses(trainer: Any) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a, (a, b)
    return max(abs(x - y) for x, y in zip(a, b))


def step_counter(sim: Any) -> Any:
    """A TrainerCallback recording the programs each optimizer step compiled."""
    from transformers import TrainerCallback

    class Counter(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[Any] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._before = sim.counters()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.steps.append(sim.counters() - self._before)

    return Counter()
