"""Training's warm-up: compile, when ``trainer.train()`` begins, the programs of every sequence bucket
(:func:`warmup`, also ``transformers_tpu_ext.training.warmup`` and ``transformers_tpu_ext.warmup(trainer, ...)``),
leaving the model, the optimizer, the schedule and the random streams as they were.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from .collator import BucketCollator
from ..compilation import recompile

__all__ = ["warmup", "warmup_train"]

logger = logging.getLogger("transformers_tpu_ext")


def _trainer_collator(train_dataloader: Any) -> tuple[BucketCollator | None, Any]:
    base = vars(train_dataloader).get("base_dataloader", train_dataloader)
    collate = getattr(base, "collate_fn", None)
    return (collate if isinstance(collate, BucketCollator) else None), getattr(base, "dataset", None)


class _Snapshot:
    """What one training step changes (parameters, buffers, optimizer, schedule, random streams),
    copied to the host so that :meth:`restore` puts it back in place."""

    def __init__(self, model: Any, optimizer: Any, scheduler: Any) -> None:
        import copy
        import random

        import torch

        from .. import backend

        self.optimizer = getattr(optimizer, "optimizer", optimizer)
        self.scheduler = scheduler
        self.tensors = [(t, _host_copy(t)) for t in [*model.parameters(), *model.buffers()]]
        self.state = {p: {k: (v, _host_copy(v)) for k, v in s.items()} for p, s in self.optimizer.state.items()}
        self.groups = [
            {k: ((v, _host_copy(v)) if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in g.items() if k != "params"}
            for g in self.optimizer.param_groups
        ]
        self.schedule = copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None
        self.rng = (random.getstate(), torch.random.get_rng_state(), backend.rng_state())

    def restore(self) -> None:
        import random

        import torch

        from .. import backend

        with torch.no_grad():
            for tensor, saved in self.tensors:
                _local(tensor).copy_(saved)
            for param in list(self.optimizer.state):
                if param not in self.state:
                    if _zero_is_fresh(self.optimizer, self.optimizer.state[param]):
                        # A zeroed state is a fresh one, and keeping its tensors keeps a compiled
                        # step's guards (an emptied state would be traced again).
                        for value in self.optimizer.state[param].values():
                            _local(value).zero_()
                    else:
                        del self.optimizer.state[param]
            for param, entries in self.state.items():
                state = self.optimizer.state[param]
                for key in list(state):
                    if key not in entries:
                        del state[key]
                for key, (original, saved) in entries.items():
                    if isinstance(original, torch.Tensor):
                        _local(original).copy_(saved)
                    state[key] = original
            for group, saved in zip(self.optimizer.param_groups, self.groups):
                for key, value in saved.items():
                    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], torch.Tensor):
                        _local(value[0]).copy_(value[1])
                        group[key] = value[0]
                    else:
                        group[key] = value
        if self.schedule is not None:
            self.scheduler.load_state_dict(self.schedule)
        python, cpu, tpu = self.rng
        random.setstate(python)
        torch.random.set_rng_state(cpu)
        backend.set_rng_state(tpu)


#: Optimizers whose state, all zeros (step count included), is exactly a fresh one.
_ZERO_INITIALISED = ("Adam", "AdamW")


def _zero_is_fresh(optimizer: Any, state: Mapping[str, Any]) -> bool:
    import torch

    return type(optimizer).__name__ in _ZERO_INITIALISED and all(isinstance(v, torch.Tensor) for v in state.values())


def _local(tensor: Any) -> Any:
    to_local = getattr(tensor, "to_local", None)  # a DTensor (FSDP2): its shard
    return (to_local() if to_local is not None else tensor).detach()


def _host_copy(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return _local(value).to("cpu", copy=True)
    return value


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
        collator, dataset = _trainer_collator(kwargs["train_dataloader"])
        if collator is None or dataset is None:
            logger.info("transformers-tpu-ext: warmup skipped: the training batches are not bucketed")
            return
        from ..ladders import round_up

        ladder = collator.settings.ladder
        lengths = self.requested or [r for r in ladder if r <= round_up(self.max_length, ladder)]
        rows = collator.batch_size or args.per_device_train_batch_size
        features = [dataset[i % len(dataset)] for i in range(rows)]
        base = collator.collate_fn(features)
        batches = {}
        for length in lengths:
            batch = collator.pad_to(base, length, rows)
            if batch is None:
                logger.info("transformers-tpu-ext: warmup skipped: the training batches are left unpadded")
                return
            batches.setdefault(batch.original["buckets"], batch)  # a length past a position table is capped
        model = trainer.model_wrapped
        snapshot = _Snapshot(model, trainer.optimizer, trainer.lr_scheduler)
        from ..core.progress import Progress

        bar = Progress(len(batches), desc="transformers-tpu-ext: warming up training buckets", unit="bucket")
        recompile.begin_warmup("train", trainer)  # the recompile guard ignores these steps, then watches training
        completed = False
        try:
            for buckets, batch in batches.items():
                batch = trainer._prepare_inputs(batch)
                items = trainer._get_num_items_in_batch([batch], args.device)
                loss = trainer.training_step(model, batch, items)
                _track_loss(loss, args)
                if args.max_grad_norm and args.max_grad_norm > 0:
                    trainer._clip_grad_norm(model)
                trainer.optimizer.step()
                trainer.lr_scheduler.step()
                model.zero_grad()
                bar.step(f"compiled a training step of {rows} x {' + '.join(map(str, buckets))} tokens")
            completed = True
        finally:
            recompile.end_warmup("train", trainer, {"lengths": lengths, "rows": rows}, completed)
            bar.close()
            model.zero_grad()
            snapshot.restore()
        warmed = [bucket for buckets in batches for bucket in buckets]
        collator.used.update(warmed)
        self.lengths = [buckets[0] for buckets in batches]


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
