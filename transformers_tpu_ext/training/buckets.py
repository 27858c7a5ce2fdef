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
- **Which batches** (:func:`plan_batch`, the predicate): only where padding provably leaves the
  result unchanged, from plain facts of the model (:class:`ModelFacts`: a known task, causal or not,
  per-token labels, position tables) and of the loop (:class:`SourceFacts`: training or evaluation,
  packed sequences, ``generate()`` prompts, a loss of the user's). The per-token keys Transformers'
  collators produce each have their padding value (:data:`SEQUENCE_PADDING`); padding goes on the
  right, after every real token, so causal models see the same prefix and a mask (added where a
  model that is not causal has none) hides it from the others. Anything else is left as the
  collator made it, with the reason; docs/training.md's table is rendered from this function
  (:mod:`.paths`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from ..ladders import round_up
from ..core.length_readers import padding_limit
from .bucket_settings import ENV, Settings, sequence_ladder, settings, settings_problems  # re-exported here
from .batch_facts import BatchLayout, BatchPlan, ModelFacts, SourceFacts  # the plan's facts, re-exported here
from .layouts import layout_sides
from .losses import own_loss_reason

__all__ = [
    "IGNORE_INDEX",
    "PAD_TOKEN",
    "SEQUENCE_PADDING",
    "ENV",
    "BatchLayout",
    "BatchPlan",
    "DECODER_KEYS",
    "ENCODER_KEYS",
    "ModelFacts",
    "PACKED_KEYS",
    "Settings",
    "SourceFacts",
    "choose_length",
    "cut_length",
    "plan_batch",
    "sequence_ladder",
    "settings",
]

#: Label value every Transformers loss ignores.
IGNORE_INDEX = -100
#: Stands for the tokenizer's (or model's) pad token id in :data:`SEQUENCE_PADDING`.
PAD_TOKEN = "pad_token_id"
#: Stands for "the row's last value" in :data:`SEQUENCE_PADDING` (a packed row's sequence index:
#: the padding joins the row's last sequence, after every real token).
LAST_VALUE = "last"

#: Per-token keys and the value their padding takes.
SEQUENCE_PADDING: dict[str, int | str] = {
    "input_ids": PAD_TOKEN,
    "attention_mask": 0,
    "labels": IGNORE_INDEX,
    "token_type_ids": 0,
    "mm_token_type_ids": 0,  # vision-language models (Qwen-VL): 0 is text; get_rope_index reads the masked tokens only
    "position_ids": 0,
    "special_tokens_mask": 1,
    "decoder_input_ids": PAD_TOKEN,
    "decoder_attention_mask": 0,
    "completion_mask": 0,  # TRL: 1 on the tokens the loss counts
    "assistant_masks": 0,  # TRL (assistant_only_loss): 1 on the assistant's tokens
    "seq_idx": LAST_VALUE,  # packed rows (DataCollatorWithFlattening(return_seq_idx=True), TRL's padding-free)
}

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


#: Keys of the encoder side of an encoder-decoder model (and of the only side of any other).
ENCODER_KEYS: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "special_tokens_mask")
#: Keys of the decoder side of an encoder-decoder model (``labels`` belong to it there).
DECODER_KEYS: tuple[str, ...] = ("decoder_input_ids", "decoder_attention_mask")
#: Keys a packed batch (``DataCollatorWithFlattening``, TRL's padding-free collator) may hold for it
#: to be padded. The sequence boundaries (``cu_seq_lens_q`` / ``cu_seq_lens_k``, and the
#: ``max_length_q`` / ``max_length_k`` numbers) keep their shape: the padding joins the last sequence.
PACKED_KEYS: tuple[str, ...] = ("input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k")


def _integer(dtype: str | None) -> bool:
    return dtype in (None, "int", "bool")


def plan_batch(
    shapes: Mapping[str, Sequence[int] | None],
    *,
    ladder: Sequence[int],
    used: Collection[int] = (),
    reuse: float = 1.5,
    batch_size: int | None = None,
    pad_rows: bool = True,
    integer_labels: bool = True,
    dtypes: Mapping[str, str] | None = None,
    model: ModelFacts | None = None,
    source: SourceFacts | None = None,
    length: int | None = None,
) -> BatchPlan | str:
    """The :class:`BatchPlan` of a batch, or why it is left as the collator made it.

    ``shapes`` maps each key of the batch to its tensor's shape (``None`` for anything that is not a
    tensor), ``dtypes`` each tensor key to ``"int"``, ``"float"`` or ``"bool"``. A batch is padded
    only where the result is provably the one of the unpadded batch (docs/training.md shows the
    table): a known model kind, token ids, labels every loss of that kind ignores the padding of, a
    mask that covers the padding (or a causal model that cannot see it), no position past the
    model's table, and in evaluation outputs that are cut back. ``length`` pads the encoder (or
    only) side to exactly that length (``warmup()``). Rows are added only in training
    (``pad_rows``), up to ``batch_size``, when every added row's labels can be ignored.
    """
    model = model or ModelFacts()
    source = source or SourceFacts(training=pad_rows, cuts_outputs=True)
    dtypes = dtypes or {}
    present = {k for k, shape in shapes.items() if shape is not None}
    why = _refused_source(model, source, present, dtypes) or _refused_labels(shapes, model, dtypes, integer_labels)
    if why:
        return why
    found = _sides(shapes, present, model, source)
    if isinstance(found, str):
        return found
    keys, sides, fills, rows = found
    found = _packing(present, keys, model, source)
    if isinstance(found, str):
        return found
    packed, add_mask = found
    if packed:  # positions restart with each packed sequence (the padding's are 0): the row may be longer than the table
        sides = [(keys_of_side, None, exact) for keys_of_side, _, exact in sides]
    found = _padded_lengths(shapes, present, sides, fills, rows, model, source, ladder, used, reuse, length)
    if isinstance(found, str):
        return found
    lengths, padded_sides = found
    if add_mask:
        lengths["attention_mask"] = lengths["input_ids"]
    padded_rows = _padded_rows(shapes, rows, model, source, packed, pad_rows, batch_size, dtypes, integer_labels)
    return BatchPlan(
        rows=padded_rows,
        lengths=lengths,
        sequence=max(padded for padded, _ in padded_sides),
        add_mask=add_mask,
        pad_token_id=model.pad_token_id if model.pools_last_token else None,
        sides=tuple(padded_sides),
        fills=fills if source.layout is not None else {},
    )


# The steps of :func:`plan_batch`, in its order; each returns why the batch is left alone (a str) or its part of the plan.


def _refused_source(model: ModelFacts, source: SourceFacts, present: set[str], dtypes: Mapping[str, str]) -> str | None:
    """Why a batch from this model and source is never padded (or ``None``)."""
    if source.custom_loss:
        return own_loss_reason(source.own_loss or "a loss of your own (compute_loss or compute_loss_func)")
    if not model.known:
        return "not a Transformers model of a known task: what its inputs and labels mean is unknown"
    if model.unknown_recurrent is not None:
        return (f"recurrent layers of a family the plugin has no proof for ({model.unknown_recurrent}): "
                "whether padding reaches their state is unknown")
    if "input_ids" in present and not _integer(dtypes.get("input_ids")):
        return "input_ids that are not integer token ids"
    if source.layout is not None and (model.encoder_decoder or not model.causal):
        return "a trainer whose own batches were read for decoder-only models, on a model that is not one"
    if source.generates:
        return "prompts for generate() (predict_with_generate): generate() pads them to its own buckets"
    if not source.training:
        if not source.cuts_outputs:
            return "evaluation with a prediction_step of your own: its outputs could not be cut back"
        if source.returns_inputs:
            return "evaluation with include_for_metrics=['inputs']: the metrics read the inputs themselves"
        if model.extra_outputs:
            return "evaluation of a model returning hidden states, attentions or router logits"
    return None


def _refused_labels(shapes: Mapping[str, Sequence[int] | None], model: ModelFacts, dtypes: Mapping[str, str], integer_labels: bool) -> str | None:
    """Why the batch's labels keep it unpadded (or ``None``)."""
    labels = shapes.get("labels")
    label_int = _integer(dtypes.get("labels")) and integer_labels
    per_token = labels is not None and len(labels) >= 2 and model.per_token_labels
    if per_token and not label_int:
        return "labels with a second axis that are not integer per-token labels"
    if labels is not None and model.per_token_labels and not per_token:
        return "per-example labels on a model whose loss is per token"
    return None


def _sequence_keys(shapes: Mapping[str, Sequence[int] | None], present: set[str], model: ModelFacts) -> tuple[list[str], set[str], int] | str:
    """The per-token keys that are padded, the decoder's keys, and the batch's rows."""
    unknown = sorted(present - set(SEQUENCE_PADDING) - model.media_keys) if model.media_keys else []
    if unknown:
        return f"inputs of a vision-language model whose padding is not known: {', '.join(unknown)}"
    labels = shapes.get("labels")
    per_token = labels is not None and len(labels) >= 2 and model.per_token_labels
    decoder = set(DECODER_KEYS) | ({"labels"} if model.encoder_decoder else set())
    if not model.encoder_decoder and present & set(DECODER_KEYS):
        return "decoder_* tensors for a model that is not an encoder-decoder"
    keys = [k for k in SEQUENCE_PADDING if k in present and len(shapes[k]) >= 2 and (k != "labels" or per_token)]
    if "input_ids" in present and len(shapes["input_ids"]) != 2:
        return "input_ids that are not (batch, sequence)"
    if not keys:
        return "no per-token tensor (input_ids, attention_mask, labels, ...) in the batch"
    rows = shapes[keys[0]][0]
    if any(shapes[k][0] != rows for k in keys):
        return "per-token tensors with different numbers of rows"
    if model.pools_last_token and model.pad_token_id is None:
        return "a sequence classifier without a pad token pools the last position: set model.config.pad_token_id"
    return keys, decoder, rows


def _sides(
    shapes: Mapping[str, Sequence[int] | None], present: set[str], model: ModelFacts, source: SourceFacts
) -> tuple[list[str], list[tuple[list[str], int | None, bool]], dict[str, int | str], int] | str:
    """The padded keys, the sides they are padded on (keys, the positions that cap them, padded to exactly
    the warm-up's length), each key's padding value, and the batch's rows."""
    if source.layout is not None:
        found = layout_sides(shapes, source.layout, SEQUENCE_PADDING)
        if isinstance(found, str):
            return found
        groups, fills, rows = found
        return [k for group in groups for k in group], [(group, model.max_positions, True) for group in groups], fills, rows
    found = _sequence_keys(shapes, present, model)
    if isinstance(found, str):
        return found
    keys, decoder, rows = found
    sides = [
        ([k for k in keys if k not in decoder], model.max_positions, True),
        ([k for k in keys if k in decoder], model.max_decoder_positions if model.encoder_decoder else None, False),
    ]
    return keys, [side for side in sides if side[0]], {k: SEQUENCE_PADDING[k] for k in keys}, rows


def _packing(present: set[str], keys: list[str], model: ModelFacts, source: SourceFacts) -> tuple[bool, bool] | str:
    """Whether the batch holds packed sequences, and whether an attention mask is added."""
    packed = source.packed or ("position_ids" in present and "attention_mask" not in present)
    if packed:
        if not model.causal:
            return "packed sequences (position_ids, no attention_mask) on a model that is not causal"
        if not present <= set(PACKED_KEYS):
            unknown = sorted(present - set(PACKED_KEYS))
            return f"packed sequences with {', '.join(unknown)}: their padding is unknown"
    add_mask = False
    if "attention_mask" not in present and not packed and "input_ids" in keys and (not model.causal or model.aux_loss):
        if not model.accepts_attention_mask:
            return "a model that is not causal and takes no attention_mask would see the padding"
        add_mask = True
    return packed, add_mask


def _padded_lengths(
    shapes: Mapping[str, Sequence[int] | None],
    present: set[str],
    sides: list[tuple[list[str], int | None, bool]],
    fills: Mapping[str, int | str],
    rows: int,
    model: ModelFacts,
    source: SourceFacts,
    ladder: Sequence[int],
    used: Collection[int],
    reuse: float,
    length: int | None,
) -> tuple[dict[str, int], list[tuple[int, int]]] | str:
    """The length each padded key gets, side by side (encoder or only side, then decoder; or a layout's groups)."""
    lengths: dict[str, int] = {}
    padded_sides: list[tuple[int, int]] = []
    for side, cap, exact in sides:
        longest = max(shapes[k][1] for k in side)
        seen = {shapes[k][1] for k in side}
        for key in () if source.layout is not None else present - set(SEQUENCE_PADDING) - {"labels"} - model.media_keys:
            shape = shapes[key]
            if len(shape) >= 2 and shape[0] == rows and shape[1] in seen:
                return f"{key!r} has a sequence axis and no known padding value"
        if cap is not None and longest > cap:
            return f"sequences of {longest} tokens are longer than the model's {cap} positions"
        # What reads the padded length (rotary thresholds, NEFTune): a rung that keeps it exact, or none.
        limit = padding_limit(model.lengths, longest, neftune=source.neftune and source.training)
        if isinstance(limit, str):
            return limit
        if exact and length is not None:
            target = max(length, longest)
        else:
            target = choose_length(longest, ladder, used, reuse)
        if cap is not None:
            target = min(target, cap)
        if limit is not None:
            target = min(target, limit)
        lengths.update({k: target for k in side})
        padded_sides.append((target, longest))
    if not source.training and len(padded_sides) == 2 and source.layout is None:
        (encoder, encoder_len), (decoder_pad, decoder_len) = padded_sides
        if encoder == decoder_pad and encoder_len != decoder_len:
            return "evaluation: encoder and decoder padded to one length, their outputs could not be told apart"
    return lengths, padded_sides


def _padded_rows(
    shapes: Mapping[str, Sequence[int] | None],
    rows: int,
    model: ModelFacts,
    source: SourceFacts,
    packed: bool,
    pad_rows: bool,
    batch_size: int | None,
    dtypes: Mapping[str, str],
    integer_labels: bool,
) -> int:
    """The rows of the padded batch: ``rows``, or ``batch_size`` in training when every added row's labels can be ignored."""
    labels = shapes.get("labels")
    label_int = _integer(dtypes.get("labels")) and integer_labels
    per_token = labels is not None and len(labels) >= 2 and model.per_token_labels
    padded_rows = rows
    ignorable = per_token or (labels is not None and len(labels) == 1 and label_int)
    can_pad_rows = (
        source.training
        and pad_rows
        and not packed
        and not source.keeps_rows
        and not model.aux_loss
        and not (model.media_keys & set(shapes))
        and batch_size is not None
        and batch_size > rows
        and ignorable
        and all(shape is not None and len(shape) >= 1 and shape[0] == rows for shape in shapes.values())
    )
    if can_pad_rows:
        padded_rows = round_up(rows, [batch_size])
    return padded_rows


def cut_length(shape: Sequence[int], sides: Sequence[tuple[int, int]]) -> int | None:
    """The length an evaluation output of ``shape`` is cut back to, or ``None`` (left as it is).

    ``sides`` holds the ``(padded, original)`` length of each padded side of the batch. An output's
    axis 1 is a position axis of the side whose padded length it has (logits, per-token labels,
    an encoder's last hidden state); :func:`plan_batch` pads an evaluation batch only when the
    sides cannot be confused and the model returns nothing else with a second axis.
    """
    if len(shape) < 2:
        return None
    for padded, original in sides:
        if shape[1] == padded and original < padded:
            return original
    return None
