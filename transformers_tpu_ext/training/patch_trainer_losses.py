"""Transformers: a training step of a library trainer's loss, or of a loss declared padding-safe, on TPU.

On TPU, and only for the trainers below, around ``Trainer.training_step`` (every trainer's step, TRL's
included, goes through it):

- a library trainer whose loss :func:`transformers_tpu_ext.training.losses.library_loss` knows and whose
  step makes tensors whose length is a count in the data (``LibraryLoss.counts``: TRL's DPO, KTO, GRPO,
  GMPO): the step runs under :class:`~transformers_tpu_ext.training.host_counts.HostCounts`, which keeps
  the selections written in the library's own code on the host (no program per count);
- a loss declared with :func:`~transformers_tpu_ext.training.losses.ignores_padding`: the first padded
  training batch checks the declaration before the step. The loss is computed, in evaluation mode and
  without gradients, on the batch as the collator made it and on the same batch padded further (16 more
  positions, and one more ignored row when rows are declared); if the two differ
  (:func:`~transformers_tpu_ext.training.losses.declared_check`) the step raises ``ValueError`` saying
  so. The random streams are put back: the run is the one it would have been.

Everything else calls the original at once.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable

from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps, fail_safe, user_error

NAME = "trainer_losses"
TARGET = "transformers.trainer"
DISTRIBUTION = "transformers"
RELIES_ON = (
    Signature("Trainer.training_step", positional=("model", "inputs", "num_items_in_batch")),
    Signature("Trainer.compute_loss", ("model", "inputs", "return_outputs", "num_items_in_batch")),
    Signature("Trainer._prepare_inputs", positional=("inputs",)),
    Attribute("Trainer.compute_loss_context_manager"),
)

logger = logging.getLogger("transformers_tpu_ext")

_wraps = Wraps()
#: The trainer's path, decided at its first step on TPU: ``("counts", package)``, ``("declared", declaration)`` or None.
_PATH = "_tpu_ext_loss_path"
#: Set once the declaration held on a padded batch.
_CHECKED = "_tpu_ext_declaration_checked"


def _path(trainer: Any) -> Any:
    if _PATH in trainer.__dict__:
        return trainer.__dict__[_PATH]
    from .facts import declared, known_loss

    path = None
    declaration = declared(trainer)
    if declaration is not None:
        path = ("declared", declaration)
    else:
        loss = known_loss(trainer)
        if not isinstance(loss, str) and loss.counts:
            path = ("counts", loss.trainer.split(".", 1)[0])
    trainer.__dict__[_PATH] = path
    return path


def _training_step(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for ``training_step(model, inputs, num_items_in_batch=None)``."""
    from .patch_transformers_trainer import trains_on_tpu

    if not trains_on_tpu(instance):
        return wrapped(*args, **kwargs)
    path = _path(instance)
    if path is None:
        return wrapped(*args, **kwargs)
    kind, value = path
    if kind == "declared":
        if not instance.__dict__.get(_CHECKED):
            _check(instance, value, args, kwargs)
        return wrapped(*args, **kwargs)
    from .host_counts import host_counts

    mode = host_counts(value)
    if mode is None:
        return wrapped(*args, **kwargs)
    with mode:
        return wrapped(*args, **kwargs)


def _check(trainer: Any, declaration: Any, args: tuple, kwargs: dict) -> None:
    """The declaration on the first padded batch: the loss as collated and padded further must agree."""
    from .collator import crop, original_of
    from .losses import declared_check
    from .patch_transformers_trainer import TRAIN_COLLATOR

    model = args[0] if args else kwargs["model"]
    inputs = args[1] if len(args) > 1 else kwargs["inputs"]
    items = args[2] if len(args) > 2 else kwargs.get("num_items_in_batch")
    original = original_of(inputs)
    collator = trainer.__dict__.get(TRAIN_COLLATOR)
    if original is None or collator is None:
        return  # not padded: nothing to check yet
    collated = crop(inputs, original)
    rows = original["rows"] + (1 if declaration.rows else 0)
    longest = max(int(v.shape[1]) for k, v in inputs.items() if k in original["lengths"])
    further = collator.pad_to(collated, longest + 16, rows)
    if further is None:
        return
    as_collated, padded = _losses(trainer, model, (collated, further), items)
    key = next(k for k in further.original["lengths"])
    shape = f"{'x'.join(map(str, collated[key].shape))} padded to {'x'.join(map(str, further[key].shape))}"
    what = f"{type(trainer).__name__}.compute_loss"
    problem = declared_check(what, as_collated, padded, shape)
    if problem is not None:
        raise user_error(ValueError(f"transformers-tpu-ext: {problem}"))
    trainer.__dict__[_CHECKED] = True
    logger.info("transformers-tpu-ext: %s ignores padding on the first batch (%.6g as collated, %.6g padded)", what, as_collated, padded)


def _losses(trainer: Any, model: Any, batches: tuple, items: Any) -> list[float]:
    """The loss of each batch, in evaluation mode, without gradients, with the random streams put back."""
    import random

    torch = sys.modules["torch"]
    from .. import backend

    state = (random.getstate(), torch.random.get_rng_state(), backend.rng_state())
    training = model.training
    model.eval()
    try:
        values = []
        for batch in batches:
            batch = trainer._prepare_inputs(batch)
            with torch.no_grad(), trainer.compute_loss_context_manager():
                loss = trainer.compute_loss(model, batch, num_items_in_batch=items)
            loss = loss[0] if isinstance(loss, tuple) else loss
            values.append(float(loss.detach().float().mean()))
        return values
    finally:
        model.train(training)
        python, cpu, tpu = state
        random.setstate(python)
        torch.random.set_rng_state(cpu)
        backend.set_rng_state(tpu)


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "Trainer.training_step", fail_safe(_training_step))


def revert() -> None:
    _wraps.unwrap_all()
