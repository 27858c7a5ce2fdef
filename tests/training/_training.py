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


def gated_model() -> Any:
    """The tiny Qwen3 (seed 0) with two parameters DDP sees unused: ``gate`` scales the loss in every
    other step of a rank (rank 0 the even steps, rank 1 the odd ones: each step one rank uses it),
    ``never`` is in no step. Under DDP it trains only with ``find_unused_parameters=True``."""
    import torch
    import torch.distributed as dist
    from transformers import Qwen3ForCausalLM

    from transformers_tpu_ext.testing.tiny import tiny_model

    class GatedQwen3(Qwen3ForCausalLM):
        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.gate = torch.nn.Parameter(torch.ones(()))
            self.never = torch.nn.Linear(2, 2)
            self.calls = 0

        def forward(self, input_ids: Any = None, attention_mask: Any = None, labels: Any = None, **kwargs: Any) -> Any:
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)
            rank = dist.get_rank() if dist.is_initialized() else 0
            if self.training and (self.calls + rank) % 2 == 0:
                out.loss = out.loss * self.gate
            self.calls += 1
            return out

    base = tiny_model("qwen3", seed=0)
    torch.manual_seed(0)
    model = GatedQwen3(base.config)
    model.load_state_dict(base.state_dict(), strict=False)
    model.generation_config = base.generation_config
    return model


def accelerate_finds_the_tpu() -> bool:
    """Whether the installed Accelerate picks ``torch.accelerator``'s device itself (1.16 and newer)."""
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version("accelerate")) >= Version("1.16")
