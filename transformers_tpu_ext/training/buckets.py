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

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ..ladders import geometric_ladder, round_up
from ..core.length_readers import ModelLengths, padding_limit

__all__ = [
    "IGNORE_INDEX",
    "PAD_TOKEN",
    "SEQUENCE_PADDING",
    "ENV",
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
    "position_ids": 0,
    "special_tokens_mask": 1,
    "decoder_input_ids": PAD_TOKEN,
    "decoder_attention_mask": 0,
    "completion_mask": 0,  # TRL: 1 on the tokens the loss counts
    "assistant_masks": 0,  # TRL (assistant_only_loss): 1 on the assistant's tokens
    "seq_idx": LAST_VALUE,  # packed rows (DataCollatorWithFlattening(return_seq_idx=True), TRL's padding-free)
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


#: Keys of the encoder side of an encoder-decoder model (and of the only side of any other).
ENCODER_KEYS: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "special_tokens_mask")
#: Keys of the decoder side of an encoder-decoder model (``labels`` belong to it there).
DECODER_KEYS: tuple[str, ...] = ("decoder_input_ids", "decoder_attention_mask")
#: Keys a packed batch (``DataCollatorWithFlattening``, TRL's padding-free collator) may hold for it
#: to be padded. The sequence boundaries (``cu_seq_lens_q`` / ``cu_seq_lens_k``, and the
#: ``max_length_q`` / ``max_length_k`` numbers) keep their shape: the padding joins the last sequence.
PACKED_KEYS: tuple[str, ...] = ("input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k")


@dataclass(frozen=True)
class ModelFacts:
    """What the padding of a batch must know about the model it feeds (plain data, read off the model
    by the glue: :func:`transformers_tpu_ext.training.facts.model_facts`).

    - ``known``: a Transformers model of a task whose inputs and labels have known semantics (causal
      LM, masked LM, sequence-to-sequence LM, token or sequence classification);
    - ``causal``: every attention layer is causal (a decoder-only model): a position never sees a
      later one, so padding on the right is invisible to the real tokens without a mask;
    - ``encoder_decoder``: two sides (``input_ids`` / ``labels`` and ``decoder_*``), each with its length;
    - ``per_token_labels``: its loss takes one label per position (LM, MLM, token classification,
      seq2seq) and ignores -100;
    - ``pools_last_token``: a sequence classifier that pools the last token that is not ``pad_token_id``;
    - ``pad_token_id``: the config's; ``max_positions`` / ``max_decoder_positions``: the size of a
      position table no padding may exceed (``None``: no limit known);
    - ``accepts_attention_mask``: its forward takes ``attention_mask``;
    - ``extra_outputs``: it returns more than logits per position (hidden states, attentions,
      router logits), whose axes evaluation could not cut back;
    - ``aux_loss``: a loss term over every token the mask lets through (MoE load balancing): no rows added.

    The defaults describe a decoder-only language model (what :class:`BucketCollator` assumes
    without a model).
    """

    known: bool = True
    causal: bool = True
    encoder_decoder: bool = False
    per_token_labels: bool = True
    pools_last_token: bool = False
    pad_token_id: int | None = None
    max_positions: int | None = None
    max_decoder_positions: int | None = None
    accepts_attention_mask: bool = True
    extra_outputs: bool = False
    aux_loss: bool = False
    #: What in it reads the length of the forward pass (rotary types whose frequencies depend on it).
    lengths: ModelLengths = ModelLengths()


@dataclass(frozen=True)
class SourceFacts:
    """What the padding of a batch must know about where it comes from and where it goes.

    - ``training``: a training batch (rows may be added); otherwise evaluation or prediction;
    - ``packed``: the collator packs sequences into one row told apart by ``position_ids``
      (``DataCollatorWithFlattening``);
    - ``generates``: the batch holds prompts for ``generate()`` (``predict_with_generate``);
    - ``custom_loss``: a loss of the user's (a ``compute_loss`` override, ``compute_loss_func``):
      whether it ignores padding is unknown;
    - ``cuts_outputs``: evaluation outputs are cut back to the collator's lengths (the Trainer's own
      ``prediction_step``);
    - ``returns_inputs``: the inputs themselves go to the metrics (``include_for_metrics=["inputs"]``);
    - ``keeps_rows``: the loss or its logged metrics read every row of the batch (TRL's trainers: DPO
      pairs the first and second halves of the rows, SFT counts the attention mask's tokens): no rows added.

    The defaults describe a user's own training loop.
    """

    training: bool = True
    packed: bool = False
    generates: bool = False
    custom_loss: bool = False
    cuts_outputs: bool = False
    returns_inputs: bool = False
    keeps_rows: bool = False
    neftune: bool = False  # NEFTune noise on the input embeddings (neftune_noise_alpha)


@dataclass(frozen=True)
class BatchPlan:
    """How to pad one batch: rows to ``rows``, and each key in ``lengths`` (on the right) to its length.

    ``add_mask``: add an ``attention_mask`` to the plan (ones on the real tokens, zeros on the
    padding). ``pad_token_id``: the id ``input_ids`` are padded with when it must be the model's
    (``None``: the collator's). ``sides``: ``(padded, original)`` length of each side that is padded
    (the encoder or only side first), what evaluation outputs are cut back with. ``sequence`` is the
    longest padded length (the buckets used are the first items of ``sides``).
    """

    rows: int
    lengths: Mapping[str, int]
    sequence: int
    add_mask: bool = False
    pad_token_id: int | None = None
    sides: tuple[tuple[int, int], ...] = ()

    @property
    def buckets(self) -> tuple[int, ...]:
        """The padded length of each side (what :func:`choose_length` reuses)."""
        return tuple(padded for padded, _ in self.sides) or (self.sequence,)


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
    if source.custom_loss:
        return "a loss of your own (compute_loss or compute_loss_func): whether it ignores padding is unknown"
    if not model.known:
        return "not a Transformers model of a known task: what its inputs and labels mean is unknown"
    if "input_ids" in present and not _integer(dtypes.get("input_ids")):
        return "input_ids that are not integer token ids"
    if source.generates:
        return "prompts for generate() (predict_with_generate): generate() pads them to its own buckets"
    if not source.training:
        if not source.cuts_outputs:
            return "evaluation with a prediction_step of your own: its outputs could not be cut back"
        if source.returns_inputs:
            return "evaluation with include_for_metrics=['inputs']: the metrics read the inputs themselves"
        if model.extra_outputs:
            return "evaluation of a model returning hidden states, attentions or router logits"

    labels = shapes.get("labels")
    label_int = _integer(dtypes.get("labels")) and integer_labels
    per_token = labels is not None and len(labels) >= 2 and model.per_token_labels
    if per_token and not label_int:
        return "labels with a second axis that are not integer per-token labels"
    if labels is not None and model.per_token_labels and not per_token:
        return "per-example labels on a model whose loss is per token"

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

    sides = [[k for k in keys if k not in decoder], [k for k in keys if k in decoder]]
    caps = (model.max_positions, model.max_decoder_positions if model.encoder_decoder else None)
    lengths: dict[str, int] = {}
    padded_sides: list[tuple[int, int]] = []
    for index, (side, cap) in enumerate(zip(sides, caps)):
        if not side:
            continue
        longest = max(shapes[k][1] for k in side)
        seen = {shapes[k][1] for k in side}
        for key in present - set(SEQUENCE_PADDING) - {"labels"}:
            shape = shapes[key]
            if len(shape) >= 2 and shape[0] == rows and shape[1] in seen:
                return f"{key!r} has a sequence axis and no known padding value"
        if cap is not None and longest > cap:
            return f"sequences of {longest} tokens are longer than the model's {cap} positions"
        # What reads the padded length (rotary thresholds, NEFTune): a rung that keeps it exact, or none.
        limit = padding_limit(model.lengths, longest, neftune=source.neftune and source.training)
        if isinstance(limit, str):
            return limit
        if index == 0 and length is not None:
            target = max(length, longest)
        else:
            target = choose_length(longest, ladder, used, reuse)
        if cap is not None:
            target = min(target, cap)
        if limit is not None:
            target = min(target, limit)
        lengths.update({k: target for k in side})
        padded_sides.append((target, longest))
    if add_mask:
        lengths["attention_mask"] = lengths["input_ids"]
    if not source.training and len(padded_sides) == 2:
        (encoder, encoder_len), (decoder_pad, decoder_len) = padded_sides
        if encoder == decoder_pad and encoder_len != decoder_len:
            return "evaluation: encoder and decoder padded to one length, their outputs could not be told apart"

    padded_rows = rows
    ignorable = per_token or (labels is not None and len(labels) == 1 and label_int)
    can_pad_rows = (
        source.training
        and pad_rows
        and not packed
        and not source.keeps_rows
        and not model.aux_loss
        and batch_size is not None
        and batch_size > rows
        and ignorable
        and all(shape is not None and len(shape) >= 1 and shape[0] == rows for shape in shapes.values())
    )
    if can_pad_rows:
        padded_rows = round_up(rows, [batch_size])
    return BatchPlan(
        rows=padded_rows,
        lengths=lengths,
        sequence=max(padded for padded, _ in padded_sides),
        add_mask=add_mask,
        pad_token_id=model.pad_token_id if model.pools_last_token else None,
        sides=tuple(padded_sides),
    )


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
