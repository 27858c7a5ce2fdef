"""Training on TPU: the public helpers (see ``docs/training.md``).

- :class:`BucketCollator` wraps a data collator so that its batches have static shapes (the policy
  is :mod:`transformers_tpu_ext.training.buckets`). On TPU the ``transformers_trainer`` patch puts it
  under every Trainer data loader; a plain Accelerate or PyTorch loop can wrap its own collator.
- :func:`warmup` (in :mod:`transformers_tpu_ext.training.warm_up`) compiles, before training, the
  programs every bucket needs, without changing the model, the optimizer, the schedule or the random streams.

Importing this module imports nothing heavy; torch is imported when a batch is padded.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from . import buckets as batch_buckets

__all__ = ["BucketCollator", "PaddedBatch", "crop", "original_of"]

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
        ``length`` and ``rows`` rows (what :func:`warmup` runs); ``None`` if such batches are left alone.
        Every key the plan pads is cut (a packed row's sequence boundaries end at ``length``)."""
        plan = self._plan(batch, used=self.used, batch_size=rows or self.batch_size)
        if isinstance(plan, str):
            return None
        values = _cut(dict(batch), plan, length, self.model.encoder_decoder)
        plan = self._plan(values, used=self.used, length=length, batch_size=rows or self.batch_size)
        return None if isinstance(plan, str) else _apply(values, plan, self.pad_token_id, self.model.per_token_labels)

    def pad(self, batch: Any) -> Any:
        """``batch`` padded to its bucket (a :class:`PaddedBatch`), or ``batch`` itself."""
        if not self.settings.enabled:
            return batch
        if not isinstance(batch, Mapping):  # a trainer that makes its tensors itself (TRL's RLOO, GRPO)
            if self.source.custom_loss:
                what = self.source.own_loss or "a loss of your own (compute_loss or compute_loss_func)"
                _tell(f"batches left as the trainer makes them: {batch_buckets.own_loss_reason(what)}")
            return batch
        plan = self._plan(batch, used=self.used)
        if isinstance(plan, str):
            _tell(f"batches left as the collator made them: {plan}")
            return batch
        self.used.update(plan.buckets)
        return _apply(batch, plan, self.pad_token_id, self.model.per_token_labels)


def _cut(values: dict[str, Any], plan: batch_buckets.BatchPlan, length: int, encoder_decoder: bool) -> dict[str, Any]:
    """The keys ``plan`` pads on the encoder (or only) side, and on every side of a library trainer's batch
    (``plan.fills``), cut to ``length``; a packed row's boundaries (``cu_seq_lens_*``) end at ``length``."""
    import torch

    decoder = set(batch_buckets.DECODER_KEYS) | ({"labels"} if encoder_decoder else set())
    for key in plan.lengths:
        tensor = values.get(key)
        if (key in plan.fills or key not in decoder) and isinstance(tensor, torch.Tensor) and tensor.shape[1] > length:
            values[key] = tensor[:, :length]
    for side in ("q", "k"):
        bounds = values.get(f"cu_seq_lens_{side}")
        if isinstance(bounds, torch.Tensor) and bounds.dim() == 1 and bounds.numel() >= 2 and int(bounds[-1]) > length:
            kept = bounds[bounds < length]
            values[f"cu_seq_lens_{side}"] = torch.cat([kept, kept.new_tensor([length])])
            if isinstance(values.get(f"max_length_{side}"), int):
                values[f"max_length_{side}"] = int(values[f"cu_seq_lens_{side}"].diff().max())
    return values


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
            fill = plan.fills.get(key, batch_buckets.SEQUENCE_PADDING.get(key))
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
