"""Training on TPU: the public helpers (see ``docs/training.md``).

- :class:`BucketCollator` wraps a data collator so that its batches have static shapes (the policy
  is :mod:`transformers_tpu_ext.training.buckets`). On TPU the ``transformers_trainer`` patch puts it
  under every Trainer data loader; a plain Accelerate or PyTorch loop can wrap its own collator.
- :func:`warmup` compiles, before training, the programs every bucket needs, without changing the
  model, the optimizer, the schedule or the random streams.

Importing this module imports nothing heavy; torch is imported when a batch is padded.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import buckets as batch_buckets
from ..compilation import recompile

__all__ = ["BucketCollator", "PaddedBatch", "crop", "original_of", "warmup"]

logger = logging.getLogger("transformers_tpu_ext")


_told: set[str] = set()


def _tell(message: str, level: int = logging.WARNING) -> None:
    """Say a batch decision once per process (collators are rebuilt with every data loader)."""
    if message not in _told:
        _told.add(message)
        logger.log(level, "transformers-tpu-ext: %s", message)


class BucketCollator:
    """A collate function whose batches are padded to a few static shapes.

    ``collate_fn(features)`` makes the batch (a mapping of tensors, e.g. what
    ``DataCollatorForLanguageModeling`` returns); its per-token tensors are then padded on the right
    to a rung of the sequence ladder, and (``pad_rows=True``, training) a partial batch is completed
    to ``batch_size`` rows whose labels are ignored, where :func:`batch_buckets.plan_batch` proves
    the result unchanged for ``model`` (a Transformers model, or its
    :class:`~transformers_tpu_ext.training.buckets.ModelFacts`). Without ``model``, a decoder-only
    language model is assumed (said once in the log). Other batches pass unchanged, with one log
    line saying why. A padded batch is a :class:`PaddedBatch`, which knows what it was
    (:func:`original_of`).

    ``settings`` defaults to the environment (:func:`batch_buckets.settings`); ``used`` is the set of
    padded lengths already produced (shared between collators that feed one model).
    """

    def __init__(
        self,
        collate_fn: Callable[[Any], Any],
        *,
        batch_size: int | None = None,
        pad_token_id: int | None = None,
        pad_rows: bool = True,
        add_attention_mask: bool = True,
        settings: batch_buckets.Settings | None = None,
        used: set[int] | None = None,
        model: Any = None,
        source: batch_buckets.SourceFacts | None = None,
    ) -> None:
        self.collate_fn = collate_fn
        self.batch_size = batch_size
        self.pad_token_id = 0 if pad_token_id is None else int(pad_token_id)
        self.pad_rows = pad_rows
        self.settings = settings if settings is not None else batch_buckets.settings()
        self.used: set[int] = used if used is not None else set()
        if model is None:
            facts = batch_buckets.ModelFacts()
            _tell("BucketCollator without model=: padding as for a decoder-only language model", logging.INFO)
        elif isinstance(model, batch_buckets.ModelFacts):
            facts = model
        else:
            from .facts import model_facts

            facts = model_facts(model)
        if not add_attention_mask:
            facts = dataclasses.replace(facts, accepts_attention_mask=False)
        self.model = facts
        self.source = source if source is not None else batch_buckets.SourceFacts(training=pad_rows, cuts_outputs=True)

    def __call__(self, features: Any) -> Any:
        return self.pad(self.collate_fn(features))

    def __repr__(self) -> str:
        return f"BucketCollator({self.collate_fn!r}, batch_size={self.batch_size}, ladder={self.settings.ladder[:8]}...)"

    def _plan(self, batch: Mapping[str, Any], batch_size: int | None = None, **kwargs: Any) -> batch_buckets.BatchPlan | str:
        import torch

        shapes = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else None for k, v in batch.items()}
        dtypes = {k: _dtype(v) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        return batch_buckets.plan_batch(
            shapes,
            ladder=self.settings.ladder,
            reuse=self.settings.reuse,
            batch_size=batch_size or self.batch_size,
            pad_rows=self.pad_rows,
            dtypes=dtypes,
            model=self.model,
            source=self.source,
            **kwargs,
        )

    def pad_to(self, batch: Mapping[str, Any], length: int, rows: int | None = None) -> Any:
        """``batch`` padded as training pads it, with its encoder (or only) side cut or padded to exactly
        ``length`` and ``rows`` rows (what :func:`warmup` runs); ``None`` if such batches are left alone."""
        import torch

        values = dict(batch)
        for key in batch_buckets.ENCODER_KEYS + (() if self.model.encoder_decoder else ("labels",)):
            tensor = values.get(key)
            if isinstance(tensor, torch.Tensor) and tensor.dim() >= 2 and tensor.shape[1] > length:
                values[key] = tensor[:, :length]
        plan = self._plan(values, used=self.used, length=length, batch_size=rows or self.batch_size)
        return None if isinstance(plan, str) else _apply(values, plan, self.pad_token_id, self.model.per_token_labels)

    def pad(self, batch: Any) -> Any:
        """``batch`` padded to its bucket (a :class:`PaddedBatch`), or ``batch`` itself."""
        if not self.settings.enabled or not isinstance(batch, Mapping):
            return batch
        plan = self._plan(batch, used=self.used)
        if isinstance(plan, str):
            _tell(f"batches left as the collator made them: {plan}")
            return batch
        self.used.update(plan.buckets)
        return _apply(batch, plan, self.pad_token_id, self.model.per_token_labels)


def _dtype(tensor: Any) -> str:
    import torch

    if tensor.dtype == torch.bool:
        return "bool"
    return "float" if tensor.is_floating_point() or tensor.is_complex() else "int"


class PaddedBatch(dict):
    """A batch :class:`BucketCollator` padded, which knows what it was (:attr:`original`):

    ``rows`` and ``lengths`` (per padded key) before padding, ``added_mask`` (the attention mask is
    the plugin's), and ``cut``: the ``(padded, original)`` length of each side whose per-position
    outputs evaluation cuts back. It keeps that through ``.to()`` (Accelerate's ``send_to_device``),
    copies and pickling (data-loader workers, pinned memory); a batch rebuilt as a plain mapping
    (``type(batch)({...})``) has ``original = None``. Keys read as attributes too, as on a
    ``BatchEncoding``.
    """

    def __init__(self, values: Any = (), original: Mapping[str, Any] | None = None) -> None:
        super().__init__(values)
        self.original = dict(original) if original is not None else None

    def to(self, *args: Any, **kwargs: Any) -> PaddedBatch:
        moved = {k: (v.to(*args, **kwargs) if hasattr(v, "to") and not isinstance(v, type) else v) for k, v in self.items()}
        return PaddedBatch(moved, self.original)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name not in self:
            raise AttributeError(name)
        return self[name]

    def __reduce__(self) -> Any:
        return (PaddedBatch, (dict(self), self.original))

    def __copy__(self) -> PaddedBatch:
        return PaddedBatch(self, self.original)


def original_of(batch: Any) -> dict[str, Any] | None:
    """What a batch :class:`BucketCollator` padded was before (see :class:`PaddedBatch`), or ``None``."""
    return batch.original if isinstance(batch, PaddedBatch) else None


def crop(batch: Mapping[str, Any], original: Mapping[str, Any]) -> dict[str, Any]:
    """``batch`` cut back to what the collator made: its rows, each key's length, no mask of ours."""
    rows, lengths = original["rows"], original["lengths"]
    values: dict[str, Any] = {}
    for key, value in batch.items():
        if key == "attention_mask" and original["added_mask"]:
            continue
        if key in lengths:
            value = value[:rows, : lengths[key]]
        elif getattr(value, "dim", None) is not None and value.dim() >= 1 and value.shape[0] > rows:
            value = value[:rows]
        values[key] = value
    return values


def _apply(batch: Mapping[str, Any], plan: batch_buckets.BatchPlan, pad_token_id: int, cut_outputs: bool) -> PaddedBatch:
    import torch
    import torch.nn.functional as F

    values = dict(batch)
    first = next(iter(plan.lengths))
    original = {
        "rows": values[first].shape[0] if first in values else plan.rows,
        "lengths": {k: values[k].shape[1] for k in plan.lengths if k in values},
        "added_mask": False,
        "cut": tuple(plan.sides) if cut_outputs else (),
        "buckets": plan.buckets,
    }
    if plan.add_mask and "attention_mask" not in values:
        ids = values["input_ids"]
        values["attention_mask"] = torch.ones(ids.shape[:2], dtype=torch.long, device=ids.device)
        original["added_mask"] = True
        original["lengths"]["attention_mask"] = ids.shape[1]
    if plan.pad_token_id is not None:
        pad_token_id = plan.pad_token_id
    for key, length in plan.lengths.items():
        tensor = values.get(key)
        if tensor is None:
            continue
        extra = length - tensor.shape[1]
        if extra > 0:
            fill = batch_buckets.SEQUENCE_PADDING[key]
            if fill == batch_buckets.LAST_VALUE:
                values[key] = torch.cat([tensor, tensor[:, -1:].expand(-1, extra, *tensor.shape[2:])], dim=1)
                continue
            value = pad_token_id if fill == batch_buckets.PAD_TOKEN else fill
            values[key] = F.pad(tensor, (0, 0) * (tensor.dim() - 2) + (0, extra), value=value)
    _extend_last_sequence(values, plan.lengths.get("input_ids"))
    rows = values[first].shape[0]
    if plan.rows > rows:
        missing = plan.rows - rows
        for key, tensor in values.items():
            filler = tensor[:1].expand(missing, *tensor.shape[1:])
            if key == "labels":
                filler = torch.full_like(filler, batch_buckets.IGNORE_INDEX)
            values[key] = torch.cat([tensor, filler])
    return PaddedBatch(values, original)


def _extend_last_sequence(values: dict[str, Any], length: int | None) -> None:
    """A packed row's sequence boundaries (``cu_seq_lens_*``, ``max_length_*``) with the padding in
    its last sequence: the same shapes, and a causal model's real tokens see what they saw."""
    for side in ("q", "k"):
        bounds = values.get(f"cu_seq_lens_{side}")
        if bounds is None or length is None or bounds.dim() != 1 or bounds.numel() < 2 or int(bounds[-1]) >= length:
            continue
        bounds = bounds.clone()
        bounds[-1] = length
        values[f"cu_seq_lens_{side}"] = bounds
        longest = values.get(f"max_length_{side}")
        if isinstance(longest, int):
            values[f"max_length_{side}"] = max(longest, int(bounds.diff().max()))


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
