"""Patch: the recompile guard around training steps on TPU (``Trainer.training_step``).

A training step of a model on a TPU runs inside :func:`recompile.guarded` (``work="train"``); the
training warm-up (``transformers_tpu_ext.training.warmup``) marks its own steps, and when it ends
training is in steady state. The report names the batch's shape and the warm-up or bucket setting
that covers it (:func:`guard.train_advice`).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..compilation import guard, recompile
from ..backend import is_tpu
from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps, fail_safe

NAME = "recompile_guard_train"
TARGET = "transformers.trainer"
DISTRIBUTION = "transformers"
RELIES_ON = (
    Signature("Trainer.training_step", ("inputs",), positional=("model", "inputs")),  # args[1] / inputs=
    Attribute("TrainingArguments.device"),
)

_wraps = Wraps()


def apply(module: Any) -> None:
    _wraps.wrap(module.Trainer, "training_step", _training_step)


def revert() -> None:
    _wraps.unwrap_all()


@fail_safe
def _training_step(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not is_tpu(getattr(getattr(instance, "args", None), "device", None)):
        return wrapped(*args, **kwargs)
    inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
    with recompile.guarded("train", instance, lambda covered: _facts(inputs, covered)):
        return wrapped(*args, **kwargs)


def _facts(inputs: Any, covered: Mapping[str, Any]) -> recompile.CallFacts:
    # A mapping of tensors (a collated batch), or a trainer's own inputs: TRL's GRPOTrainer passes the raw
    # examples (a list of dicts) and builds its tensors inside training_step.
    batch = inputs if isinstance(inputs, Mapping) else {}
    shapes = {k: tuple(v.shape) for k, v in batch.items() if hasattr(v, "shape")}
    if not shapes and isinstance(inputs, (list, tuple)):
        advice = ("The trainer builds its tensors from these examples itself (TRL's GRPOTrainer: docs/training.md, "
                  "\"GRPOTrainer\", says which of its shapes are planned and which still compile)")
        return recompile.CallFacts(call=f"a batch of {len(inputs)} examples", advice=advice, signature=(("examples", len(inputs)),))
    main = shapes.get("input_ids") or next((s for s in shapes.values() if len(s) >= 2), None)
    rows = main[0] if main else 0
    length = main[1] if main and len(main) >= 2 else None
    call = "a batch of " + ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s in shapes.items())
    warmed = [int(n) for n in covered.get("lengths", ())]
    return recompile.CallFacts(call=call, advice=guard.train_advice(rows, length, warmed), signature=tuple(sorted(shapes.items())))
