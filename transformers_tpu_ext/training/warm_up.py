"""Training's warm-up: compile, when ``trainer.train()`` begins, the programs of every sequence bucket
(:func:`warmup`, also ``transformers_tpu_ext.training.warmup`` and ``transformers_tpu_ext.warmup(trainer, ...)``),
leaving the model, the optimizer, the schedule, the random streams and the trainer's own bookkeeping as
they were (:mod:`.warm_state`).

One optimizer step per bucket, as the Trainer's loop makes it: a collated batch of the first examples
padded to the bucket (packed rows, a library trainer's own keys included), or for TRL's ``GRPOTrainer`` a
generation batch whose prompts take that rung (generation, scoring, forward, backward and loss). The
first bucket's step also runs every number of micro-batches the run accumulates (gradient accumulation,
the shorter last step of an epoch).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from .collator import BucketCollator
from .warm_state import Snapshot
from ..compilation import recompile, recompile_limit

__all__ = ["warmup", "warmup_train"]

logger = logging.getLogger("transformers_tpu_ext")


def _trainer_collator(train_dataloader: Any) -> tuple[BucketCollator | None, Any]:
    base = vars(train_dataloader).get("base_dataloader", train_dataloader)
    collate = getattr(base, "collate_fn", None)
    return (collate if isinstance(collate, BucketCollator) else None), getattr(base, "dataset", None)


def _track_loss(loss: Any, args: Any) -> None:
    """What the Trainer does with each step's loss: its NaN/Inf filter and on-device running sum, and
    what logging does with that sum (gathered over processes, averaged, then zeroed in place)."""
    import torch

    torch.isnan(loss)
    torch.isinf(loss)
    running = torch.zeros((), dtype=loss.dtype, device=loss.device).add_(loss)
    try:
        from transformers.trainer import nested_gather
    except ImportError:  # another Transformers release: the logging ops compile at the first log
        return
    nested_gather(running, args.parallel_mode).mean()
    running -= running


class _Warmup:
    """Runs :func:`warmup`'s steps when training begins (the model, optimizer and schedule exist)."""

    def __init__(self, trainer: Any, max_length: int | None, lengths: Iterable[int] | None) -> None:
        self.trainer = trainer
        self.max_length = max_length
        self.requested = None if lengths is None else sorted({int(n) for n in lengths})
        #: the sequence lengths warmed up (filled when training begins)
        self.lengths: list[int] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.lengths or state.global_step:  # once, and not when resuming mid-run
            return
        trainer = self.trainer
        loader = kwargs["train_dataloader"]
        collator, dataset = _trainer_collator(loader)
        if collator is None or dataset is None:
            logger.info("transformers-tpu-ext: warmup skipped: the training batches are not bucketed")
            return
        from ..ladders import round_up

        ladder = collator.settings.ladder
        lengths = self.requested or [r for r in ladder if r <= round_up(self.max_length, ladder)]
        rows = collator.batch_size or args.per_device_train_batch_size
        features = [dataset[i % len(dataset)] for i in range(rows)]
        steps = _grpo_steps(trainer, features, lengths) or _batch_steps(collator, features, lengths, rows)
        if isinstance(steps, str):
            logger.info("transformers-tpu-ext: warmup skipped: %s", steps)
            return
        accumulations = _accumulations(trainer, args, loader)
        if getattr(args, "torch_compile", False):
            recompile_limit.require("train", len(steps))  # each bucket a recompilation of the compiled frames
        model = trainer.model_wrapped
        snapshot = Snapshot(model, trainer.optimizer, trainer.lr_scheduler, trainer)
        from ..core.progress import Progress

        bar = Progress(len(steps), desc="transformers-tpu-ext: warming up training buckets", unit="bucket")
        recompile.begin_warmup("train", trainer)  # the recompile guard ignores these steps, then watches training
        completed = False
        try:
            for index, (buckets, batch, context) in enumerate(steps):
                # The first bucket also runs every number of micro-batches an optimizer step accumulates
                # (gradients added to gradients, the loss divided by that number); the others one each.
                for count in accumulations if index == 0 else accumulations[:1]:
                    _optimizer_step(trainer, model, args, batch, context, count)
                bar.step(f"compiled a training step of {rows} x {' + '.join(map(str, buckets))} tokens")
            completed = True
        finally:
            recompile.end_warmup("train", trainer, {"lengths": lengths, "rows": rows}, completed)
            bar.close()
            model.zero_grad()
            snapshot.restore()
        warmed = [bucket for buckets, _, _ in steps for bucket in buckets]
        collator.used.update(warmed)
        self.lengths = sorted({buckets[0] for buckets, _, _ in steps})


def _batch_steps(collator: BucketCollator, features: list, lengths: list[int], rows: int) -> list | str:
    """One collated batch per bucket: ``(buckets, batch, context)``."""
    import contextlib

    base = collator.collate_fn(features)
    batches: dict[tuple[int, ...], Any] = {}
    for length in lengths:
        batch = collator.pad_to(base, length, rows)
        if batch is None:
            return "the training batches are left unpadded"
        batches.setdefault(batch.original["buckets"], batch)  # a length past a position table is capped
    return [(buckets, batch, contextlib.nullcontext) for buckets, batch in batches.items()]


def _grpo_steps(trainer: Any, features: list, lengths: list[int]) -> list | None:
    """A ``GRPOTrainer`` whose batches are planned (``trl_grpo``): one generation batch per prompt rung, its
    prompts padded (or cut) to that rung; ``None`` for any other trainer."""
    import functools
    import sys

    grpo_patch = sys.modules.get(__package__ + ".patch_trl_grpo")
    plan = grpo_patch.plan(trainer) if grpo_patch is not None and "GRPOTrainer" in {c.__name__ for c in type(trainer).__mro__} else None
    if plan is None:
        return None
    from .grpo import prompt_length

    generations = int(getattr(trainer.args, "num_generations", 1) or 1)
    batch = [features[(i // generations) % len(features)] for i in range(len(features))]  # each prompt repeated
    # The longest first: generate() keeps the largest static cache it has used, so every rung after it
    # decodes with the cache the run's generations will all use.
    rungs = sorted({prompt_length(n, plan, ()) for n in lengths}, reverse=True)
    steps = [((rung,), batch, functools.partial(grpo_patch.warming_prompts, rung)) for rung in rungs]
    # and a batch whose completions all run to max_completion_length: TRL's metrics of no terminated completion
    return [*steps, ((rungs[-1],), batch, functools.partial(grpo_patch.warming_prompts, rungs[-1], truncated=True))]


def _accumulations(trainer: Any, args: Any, loader: Any) -> list[int]:
    """The numbers of micro-batches an optimizer step of this run accumulates: gradient accumulation's,
    and the last step of an epoch's when fewer batches are left."""
    steps = max(int(getattr(args, "gradient_accumulation_steps", 1) or 1), 1)
    try:
        remainder = len(loader) % steps
    except TypeError:  # an iterable dataset: no known length
        remainder = 0
    return [steps] + ([remainder] if remainder else [])


def _optimizer_step(trainer: Any, model: Any, args: Any, batch: Any, context: Any, count: int) -> None:
    """What the Trainer's loop does for one optimizer step of ``count`` micro-batches of ``batch``."""
    grpo = isinstance(batch, list)  # a GRPOTrainer's generation batch: it makes its tensors itself
    trainer.current_gradient_accumulation_steps = count
    with context():
        for _ in range(count):
            if grpo:
                trainer._step, trainer._buffered_inputs = 0, None  # generate in this step
                inputs, items = batch, None
            else:
                inputs = trainer._prepare_inputs(batch)
                items = trainer._get_num_items_in_batch([inputs] * count, args.device)
            loss = trainer.training_step(model, inputs, items)
            _track_loss(loss, args)
    if args.max_grad_norm and args.max_grad_norm > 0:
        trainer._clip_grad_norm(model)
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    model.zero_grad()


def warmup(trainer: Any, max_length: int | None = None, lengths: Iterable[int] | None = None) -> Any:
    """Compile, when ``trainer.train()`` begins, the programs of every sequence bucket up to ``max_length``.

    One training step (forward, backward, gradient clipping, optimizer and schedule) runs per bucket
    on a batch built from the first examples of the training set, then parameters, optimizer state,
    schedule and random streams are put back exactly as they were: the run itself is unchanged, and
    compiles nothing new for batches of those buckets. ``lengths`` names the buckets instead. Call it
    once, before ``train()``; every process of a multi-chip run does the same steps (their
    collectives match). Returns the callback, whose ``lengths`` lists the buckets warmed up.
    """
    if max_length is None and lengths is None:
        raise ValueError("warmup(trainer, max_length=...) needs the longest sequence length to warm up (or lengths=[...])")
    from transformers import TrainerCallback

    callback = type("TPUWarmupCallback", (_Warmup, TrainerCallback), {})(trainer, max_length, lengths)
    trainer.add_callback(callback)
    return callback


def warmup_train(trainer: Any, max_length: int | None = None, lengths: Iterable[int] | None = None) -> Any:
    """One training step per bucket up to ``max_length`` when ``trainer.train()`` begins (see
    ``docs/training.md``); returns the callback."""
    return warmup(trainer, max_length=max_length, lengths=lengths)
