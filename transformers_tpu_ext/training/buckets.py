"""Static shapes for training batches on TPU: plain functions over key names, sizes and lengths.

A TPU compiles one program per input shape: a training loop fed batches padded to "the longest
sequence in the batch" (what every Transformers data collator does) compiles a new forward and
backward for almost every step, and the last, partial batch of an epoch compiles another. This
module decides the shape each batch is padded to; :class:`transformers_tpu_ext.training.BucketCollator`
applies it and the ``transformers_trainer`` patch puts that collator under every Trainer data loader
on TPU.

- **Sequence length**: rounded up to a rung of a geometric ladder (:func:`sequence_ladder`, reusing
  :func:`transformers_tpu_ext.ladders.geometric_ladder`: multiples of 16 from 16, ``steps_per_octave`` rungs per
  doubling, so a batch is padded by at most ``1 + 1 / steps_per_octave``). A length whose own rung
  has not been used yet reuses the smallest rung already used that costs at most ``reuse`` times
  more (:func:`choose_length`): a rare short batch runs in a program that exists instead of
  compiling a new one. The number of shapes over an epoch is at most the number of rungs.
- **Rows** (training only): a partial batch is completed to the batch size with copies of its
  first row whose labels are all ignored (``-100``), so the loss and the gradients are those of the
  real rows. Evaluation keeps its real rows (metrics and the per-batch loss weighting see them).
- **Which tensors**: the per-token keys Transformers' collators produce, each with its padding
  value (:data:`SEQUENCE_PADDING`); padding goes on the right, after every real token, so causal
  models see the same prefix and masked models mask it. A batch with another tensor along the
  same sequence axis is left as it is (its padding value is unknown).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ..ladders import geometric_ladder, round_up

__all__ = [
    "IGNORE_INDEX",
    "PAD_TOKEN",
    "SEQUENCE_PADDING",
    "ENV",
    "BatchPlan",
    "Settings",
    "choose_length",
    "plan_batch",
    "sequence_ladder",
    "settings",
]

#: Label value every Transformers loss ignores.
IGNORE_INDEX = -100
#: Stands for the tokenizer's (or model's) pad token id in :data:`SEQUENCE_PADDING`.
PAD_TOKEN = "pad_token_id"

#: Per-token keys and the value their padding takes.
SEQUENCE_PADDING: dict[str, int | str] = {
    "input_ids": PAD_TOKEN,
    "attention_mask": 0,
    "labels": IGNORE_INDEX,
    "token_type_ids": 0,
    "position_ids": 0,
    "special_tokens_mask": 1,
    "decoder_input_ids": PAD_TOKEN,
    "decoder_attention_mask": 0,
}

_MINIMUM = 16
_MULTIPLE = 16  # bf16 sublane tile: the hardware pads that far anyway
_TOP = 1 << 20


def sequence_ladder(steps_per_octave: int = 2, minimum: int = _MINIMUM, multiple: int = _MULTIPLE) -> tuple[int, ...]:
    """Sequence-length rungs: ``(16, 32, 48, 64, 96, 128, 192, 256, ...)`` with 2 steps per octave."""
    return geometric_ladder(minimum, _TOP, steps_per_octave, multiple)


def choose_length(length: int, ladder: Sequence[int], used: Collection[int], reuse: float = 1.5) -> int:
    """The padded length of a batch whose longest sequence has ``length`` tokens.

    Its rung of ``ladder``, unless that rung is not in ``used`` and a used rung at most ``reuse``
    times longer exists: then the shortest such rung (no new program for a rare short batch).
    ``reuse <= 1`` always takes the batch's own rung.
    """
    own = round_up(length, ladder)
    if own in used or reuse <= 1:
        return own
    larger = [rung for rung in used if own < rung <= own * reuse]
    return min(larger) if larger else own


@dataclass(frozen=True)
class BatchPlan:
    """How to pad one batch: rows to ``rows``, and each key in ``lengths`` to its length."""

    rows: int
    lengths: Mapping[str, int]
    sequence: int


def plan_batch(
    shapes: Mapping[str, Sequence[int] | None],
    *,
    ladder: Sequence[int],
    used: Collection[int] = (),
    reuse: float = 1.5,
    batch_size: int | None = None,
    pad_rows: bool = True,
    integer_labels: bool = True,
) -> BatchPlan | str:
    """The :class:`BatchPlan` of a batch, or the reason it cannot be bucketed.

    ``shapes`` maps each key of the batch to its tensor's shape (``None`` for anything that is not
    a tensor). Rows are added only with ``pad_rows``, a ``batch_size`` larger than the batch, integer
    ``labels`` (so the added rows can be ignored) and every value a tensor with the batch's rows.
    """
    sequence_keys = [k for k in SEQUENCE_PADDING if shapes.get(k) is not None and len(shapes[k]) >= 2]
    if not sequence_keys:
        return "no per-token tensor (input_ids, attention_mask, labels, ...) in the batch"
    first = shapes[sequence_keys[0]]
    rows = first[0]
    if any(shapes[k][0] != rows for k in sequence_keys):
        return "per-token tensors with different numbers of rows"
    # Keys padded to one length share a padded length (input_ids and labels of a causal LM).
    longest = max(shapes[k][1] for k in sequence_keys)
    lengths_seen = {shapes[k][1] for k in sequence_keys}
    for key, shape in shapes.items():
        if key in SEQUENCE_PADDING or shape is None or len(shape) < 2:
            continue
        if shape[0] == rows and shape[1] in lengths_seen:
            return f"{key!r} has a sequence axis and no known padding value"
    target = choose_length(longest, ladder, used, reuse)
    lengths = {k: target for k in sequence_keys}

    padded_rows = rows
    can_pad_rows = (
        pad_rows
        and batch_size is not None
        and batch_size > rows
        and integer_labels
        and shapes.get("labels") is not None
        and all(shape is not None and len(shape) >= 1 and shape[0] == rows for shape in shapes.values())
    )
    if can_pad_rows:
        padded_rows = round_up(rows, [batch_size])
    return BatchPlan(rows=padded_rows, lengths=lengths, sequence=target)


#: The environment variables of :func:`settings`.
ENV = {
    "buckets": "TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS",
    "steps_per_octave": "TRANSFORMERS_TPU_EXT_TRAIN_STEPS_PER_OCTAVE",
    "reuse": "TRANSFORMERS_TPU_EXT_TRAIN_REUSE",
}
_OFF = {"0", "false", "no", "off"}
_ON = {"", "1", "true", "yes", "on"}


@dataclass(frozen=True)
class Settings:
    """Bucketing of training batches: on or off, the length ladder, the reuse factor."""

    enabled: bool = True
    ladder: tuple[int, ...] = sequence_ladder()
    reuse: float = 1.5


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings from the environment (read at each call; ``ValueError`` names a bad variable).

    - ``TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS``: ``1`` (default) buckets with the geometric ladder, ``0``
      turns bucketing off, a comma list (``128,256,512``) gives the ladder (past its last rung:
      multiples of it).
    - ``TRANSFORMERS_TPU_EXT_TRAIN_STEPS_PER_OCTAVE``: rungs per doubling of the default ladder (2).
    - ``TRANSFORMERS_TPU_EXT_TRAIN_REUSE``: how much longer a rung already used may be and still be
      reused for a shorter batch (1.5; 1 turns reuse off).
    """
    env = os.environ if environ is None else environ
    raw = env.get(ENV["buckets"], "").strip().lower()
    steps_raw = env.get(ENV["steps_per_octave"], "").strip()
    reuse_raw = env.get(ENV["reuse"], "").strip()
    try:
        steps = int(steps_raw) if steps_raw else 2
        if steps < 1:
            raise ValueError
    except ValueError:
        raise ValueError(f"{ENV['steps_per_octave']}={steps_raw!r}: expected a positive integer") from None
    try:
        reuse = float(reuse_raw) if reuse_raw else 1.5
        if reuse < 1:
            raise ValueError
    except ValueError:
        raise ValueError(f"{ENV['reuse']}={reuse_raw!r}: expected a number >= 1 (1 turns reuse off)") from None
    if raw in _OFF:
        return Settings(enabled=False, ladder=(), reuse=reuse)
    if raw in _ON:
        return Settings(enabled=True, ladder=sequence_ladder(steps), reuse=reuse)
    try:
        ladder = tuple(sorted({int(part) for part in raw.split(",") if part.strip()}))
        if not ladder or ladder[0] < 1:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"{ENV['buckets']}={raw!r}: expected 1, 0 or a comma list of sequence lengths (e.g. 128,256,512)"
        ) from None
    return Settings(enabled=True, ladder=ladder, reuse=reuse)
