"""Which forward passes of batch inference may be padded to a bucket and cut back: plain data in, plain data out.

A TPU compiles one program per input shape: a pipeline or an embedding loop fed texts of random
lengths pads each batch to its longest text and compiles a new program for almost every batch.
:func:`plan_call` decides, from plain facts of the model (:class:`ModelFacts`) and the shapes of
one call's inputs, whether the call may run padded on the right to a rung of the sequence ladder
(and with its rows completed to a rung of the row ladder) with its per-position outputs cut back
to the unpadded shapes, so that the caller sees exactly the unpadded result. Anything it does not
positively recognise runs unpadded, with the reason.

What reads the padded length, and how each is handled:

- **Attention**: padding is hidden by an attention mask (zeros on the padding; one is added where
  the batch has none) or, for causal models, by causality itself (a position never sees a later
  one). A model that is not causal and takes no mask is refused.
- **Pooling** (:data:`POOLING`): the first token (``[CLS]``, BERT's pooler) and the last token that
  is not the pad token (decoder-only sequence classifiers; the padding is the config's pad token)
  are unchanged by padding on the right; per-position heads and hidden states are cut back before
  anyone pools them (sentence-transformers' mean pooling runs on the cut outputs). A pooling the
  facts do not name, and last-token pooling without a pad token, are refused.
- **Absolute position tables**: the padded length never passes the table (``max_positions``);
  sequences already longer are left to upstream (its error or truncation).
- **RoPE**: only rope types whose angles do not depend on the sequence length (:data:`SAFE_ROPE`, from
  ``length_readers``, shared with generation and training).
- **``token_type_ids``**, ``position_ids``: padded with 0 under the mask.
- **Rows**: a row is independent of the others in evaluation, so a batch is completed with copies
  of its first row (to a power of two, or to a larger row count already run), cut off again; models whose rows or tokens share a budget (mixture-of-experts
  routers with an expert capacity) are refused, as is a model in training mode (dropout).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ..ladders import geometric_ladder, round_up
from ..core.length_readers import ROPE_TYPES
from ..training.buckets import choose_length, sequence_ladder

__all__ = [
    "PADDING",
    "PATIENCE",
    "POOLING",
    "SAFE_ROPE",
    "TASKS",
    "CallPlan",
    "ModelFacts",
    "PIPELINES",
    "ENCODER_MODULES",
    "ENCODER_POOLING",
    "LM_EVAL_SUPPORTED",
    "cut_fields",
    "encoder_facts",
    "lm_eval_path",
    "pipeline_path",
    "plan_call",
    "row_ladder",
    "sequence_ladder",
]

#: Per-token inputs a call may be padded in, and their padding value (``None``: the pad token id).
PADDING: dict[str, int | None] = {"input_ids": None, "attention_mask": 0, "token_type_ids": 0, "position_ids": 0}

#: What a model's head pools: ``first`` ([CLS]), ``last_non_pad`` (the last token that is not the
#: pad token), ``none`` (per-position outputs only, cut back), ``unknown``.
POOLING = ("first", "last_non_pad", "none", "unknown")

#: Tasks whose outputs have known per-position fields (:func:`cut_fields`).
TASKS = ("sequence_classification", "token_classification", "masked_lm", "question_answering", "base", "causal_lm")

#: RoPE types whose frequencies never depend on the sequence length (``length_readers.ROPE_TYPES``, the one
#: place that knows what reads the length; ``None``: no RoPE). ``dynamic`` and ``longrope`` read it: a padded
#: forward could switch their frequencies, so such calls are not padded.
SAFE_ROPE = frozenset({None} | {name for name, kind in ROPE_TYPES.items() if kind.threshold is None})

_ROWS_TOP = 1 << 16


def row_ladder() -> tuple[int, ...]:
    """Row rungs: powers of two (``1, 2, 4, 8, ...``)."""
    return geometric_ladder(1, _ROWS_TOP, 1)


@dataclass(frozen=True)
class ModelFacts:
    """What padding a call must know about the model (read off it by :func:`.facts.model_facts`).

    - ``task``: one of :data:`TASKS`, or ``None`` (unknown: never padded);
    - ``causal``: every attention layer is causal; ``encoder_decoder``: two sides (not padded);
    - ``pooling``: one of :data:`POOLING`; ``pad_token_id``: the config's;
    - ``max_positions``: an absolute position table no padding may pass (``None``: none);
    - ``rope_type``: the config's RoPE type (``None``: no RoPE or the default);
    - ``accepts``: the per-token inputs its forward takes by name;
    - ``experts``: a mixture-of-experts router; ``training``: the model is in training mode;
    - ``returns_cache``: its outputs hold a KV cache by default (``config.use_cache``).
    """

    task: str | None = None
    causal: bool = False
    encoder_decoder: bool = False
    pooling: str = "unknown"
    pad_token_id: int | None = None
    max_positions: int | None = None
    rope_type: str | None = None
    accepts: frozenset[str] = frozenset(PADDING)
    experts: bool = False
    training: bool = False
    returns_cache: bool = False


@dataclass(frozen=True)
class CallPlan:
    """Pad the inputs in ``lengths`` on the right to ``length`` and the rows to ``rows``; cut outputs
    back to ``original_rows`` x ``original_length``. ``add_mask``: add an attention mask (ones on the
    real tokens). ``pad_token_id``: the id ``input_ids`` are padded with. ``no_cache``: call with
    ``use_cache=False`` (a KV cache of the padded length could not be cut back)."""

    rows: int
    length: int
    original_rows: int
    original_length: int
    keys: tuple[str, ...]
    pad_token_id: int
    add_mask: bool = False
    no_cache: bool = False
    deferred: int | None = None


#: How many calls whose own rung was never run, and is shorter than a rung that was, pad to that longer
#: rung before their own compiles (``plan_call``'s ``patience``). One: a one-off short batch compiles
#: nothing, a rung wanted twice compiles at its second call. More would put the compile of a rung
#: wanted a few times in the first pass into the second (lm-eval sorts its requests longest first:
#: with 4, its second 100 requests compiled 134 programs).
PATIENCE = 1


def plan_call(
    shapes: Mapping[str, Sequence[int] | None],
    model: ModelFacts,
    *,
    ladder: Sequence[int] = (),
    rows_ladder: Sequence[int] = (),
    used: Collection[int] = (),
    used_rows: Collection[int] = (),
    reuse: float = 1.5,
    deferred: Mapping[int, int] | None = None,
    patience: int = PATIENCE,
    dtypes: Mapping[str, str] | None = None,
    options: Mapping[str, object] | None = None,
    positional: int = 0,
    drop_cache: bool = False,
) -> CallPlan | str:
    """The :class:`CallPlan` of one ``model(**inputs)`` call, or why it runs unpadded.

    ``shapes`` maps each keyword argument to its tensor's shape (``None`` for anything else),
    ``dtypes`` each tensor to ``"int"``, ``"float"`` or ``"bool"``, ``options`` the non-tensor
    arguments (``use_cache``, ``output_hidden_states``...). ``positional``: how many positional
    arguments the call has. ``used`` / ``used_rows``: the lengths and row counts already run; a
    short batch reuses a length at most ``reuse`` times its own rung, a partial batch (the last one
    of a pipeline) any larger row count already run. A batch whose rung was never run but is shorter
    than one that was (a rare short batch: zero-shot classification's batches hold few texts, their
    longest varies more) pads to the shortest such rung, unless its rung was already put off
    ``patience`` times (``deferred``: how many calls put off each rung; the plan's ``deferred`` names
    the rung it puts off): a rare length compiles nothing, a frequent one soon gets its own rung.
    ``drop_cache``: the caller never reads a KV cache (pipelines), so a
    model that would return one is called with ``use_cache=False``.
    """
    ladder = ladder or sequence_ladder()
    rows_ladder = rows_ladder or row_ladder()
    dtypes = dtypes or {}
    options = options or {}
    tensors = {k: tuple(s) for k, s in shapes.items() if s is not None}
    if positional:
        return "positional arguments: pass the inputs by name (model(**batch))"
    if model.task not in TASKS:
        return "not a Transformers model of a known task: which outputs are per position is unknown"
    if model.training:
        return "a model in training mode (dropout): call model.eval() first"
    if model.encoder_decoder:
        return "an encoder-decoder model: its two sides are not padded"
    if model.experts:
        return "a mixture-of-experts router: an expert capacity counts every token, padding included"
    if model.rope_type not in SAFE_ROPE:
        return f"RoPE type {model.rope_type!r} reads the sequence length"
    if model.pooling not in ("first", "last_non_pad", "none"):
        return "a head whose pooling is unknown: it could read the padding"
    if model.pooling == "last_non_pad" and model.pad_token_id is None:
        return "last-token pooling without a pad token reads the last position: set model.config.pad_token_id"
    if "input_ids" not in tensors:
        return "no input_ids (inputs_embeds or other inputs): not padded"
    unknown = sorted(set(tensors) - set(PADDING))
    if unknown:
        return f"inputs with no known padding: {', '.join(unknown)}"
    if not all(dtypes.get(k) in (None, "int", "bool") for k in tensors):
        return "per-token inputs that are not integer ids or masks"
    if any(len(s) != 2 for s in tensors.values()):
        return "per-token inputs that are not (batch, sequence)"
    rows, length = tensors["input_ids"]
    if any(s != (rows, length) for s in tensors.values()):
        return "per-token inputs of different shapes"
    if rows < 1 or length < 1:
        return "an empty batch"
    if options.get("output_attentions"):
        return "output_attentions: attention weights over the padding could not be cut back"
    no_cache = False
    if model.returns_cache and options.get("use_cache") is not False:
        if not drop_cache:
            return "a model returning a KV cache: call it with use_cache=False to pad"
        no_cache = True
    elif options.get("use_cache"):
        return "use_cache=True: a KV cache of the padded length could not be cut back"
    if options.get("cache") is not None or options.get("past_key_values") is not None:  # 5.24's name, and its alias
        return "a KV cache given: positions depend on it"
    add_mask = "attention_mask" not in tensors
    if add_mask and not model.causal and "attention_mask" not in model.accepts:
        return "a model that is not causal and takes no attention_mask would see the padding"
    if add_mask and "attention_mask" not in model.accepts:
        add_mask = False  # causal: the padding after the real tokens is never seen
    if model.max_positions is not None and length > model.max_positions:
        return f"sequences of {length} tokens are longer than the model's {model.max_positions} positions (upstream's error)"
    target = choose_length(length, ladder, used, reuse)
    if model.max_positions is not None:
        target = max(length, min(target, model.max_positions))
    put_off = None
    longer = [rung for rung in used if rung > target]
    if target not in used and longer and (deferred or {}).get(target, 0) < patience:
        put_off, target = target, min(longer)
    own_rows = round_up(rows, rows_ladder)
    padded_rows = min([r for r in used_rows if r >= own_rows], default=own_rows)
    return CallPlan(
        rows=padded_rows,
        length=target,
        original_rows=rows,
        original_length=length,
        keys=tuple(k for k in PADDING if k in tensors),
        pad_token_id=model.pad_token_id if model.pad_token_id is not None else 0,
        add_mask=add_mask,
        no_cache=no_cache,
        deferred=put_off,
    )


#: Output fields with a position axis after the rows, by task (``hidden_states`` in every task).
_PER_POSITION = {
    "sequence_classification": (),
    "token_classification": ("logits",),
    "masked_lm": ("logits",),
    "question_answering": ("start_logits", "end_logits"),
    "base": ("last_hidden_state",),
    "causal_lm": ("logits",),
}


def cut_fields(task: str) -> tuple[str, ...]:
    """The output fields of a model of ``task`` whose axis 1 is a position (cut back to the real tokens);
    every other field is per row (only the rows are cut)."""
    return _PER_POSITION[task] + ("hidden_states",)


#: sentence-transformers modules whose outputs are per row or read the tokens under the mask only.
ENCODER_MODULES = frozenset({"Transformer", "Pooling", "Normalize", "Dense"})
#: sentence-transformers pooling modes: every one weighs the tokens by the attention mask.
ENCODER_POOLING = frozenset({"cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"})
#: Fields of a sentence-transformers feature dict with a position axis after the rows.
ENCODER_PER_POSITION = ("token_embeddings", "all_layer_embeddings", *PADDING)


def encoder_facts(modules: Sequence[tuple[str, tuple[str, ...]]], inner: ModelFacts) -> ModelFacts | str:
    """The facts of a sentence-transformers model (its modules' class names, each with its pooling
    modes) whose Transformer module holds a model of facts ``inner``, or why it is not padded: only
    known modules, and pooling modes that read the tokens under the mask."""
    names = [name for name, _ in modules]
    unknown = sorted(set(names) - ENCODER_MODULES)
    if unknown:
        return f"sentence-transformers modules that could read the padding: {', '.join(unknown)}"
    if names.count("Transformer") != 1 or names[0] != "Transformer":
        return "a sentence-transformers model that does not start with one Transformer module"
    modes = {mode for _, found in modules for mode in found}
    if not modes <= ENCODER_POOLING:
        return f"pooling modes {sorted(modes - ENCODER_POOLING)} are not known"
    if inner.task != "base":
        return "a Transformer module whose model is not a base model"
    return inner


#: Pipelines whose ``_forward`` calls ``self.model(**inputs)`` once per batch and whose ``postprocess``
#: reads its outputs by field (the tasks tests/inference/test_pipelines.py compares with the CPU).
#: Others (text generation: ``generate()`` buckets its own calls; other image and audio tasks...) are upstream's.
PIPELINES = frozenset({
    "TextClassificationPipeline",
    "TokenClassificationPipeline",
    "FeatureExtractionPipeline",
    "FillMaskPipeline",
    "ZeroShotClassificationPipeline",
    "ImageClassificationPipeline",  # rows (and an audio batch's samples) padded: inference.media
    "AudioClassificationPipeline",
})


def pipeline_path(name: str) -> bool:
    """Whether a pipeline of the class ``name`` is bucketed (exactly a class of :data:`PIPELINES`: a
    subclass of yours may call the model another way, and runs as upstream's)."""
    return name in PIPELINES


#: lm-eval releases whose ``HFLM`` the ``lm_eval_hf`` patch knows (``_model_call(inps)`` of a causal LM
#: returns the logits lm-eval's bookkeeping reads; tested: 0.4.13).
LM_EVAL_SUPPORTED = ">=0.4.13,<0.5"


def lm_eval_path(version: str | None, *, backend: str | None, model_device: str | None, processes: int = 1,
                 parallelize: bool = False) -> str | None:
    """``None`` when lm-eval's ``HFLM`` may keep its bookkeeping on the host and run each forward pass
    bucketed on the TPU (``_model_call``: a batch of right-padded token ids of a causal LM, whose
    logits it reads back per request), else why it runs as upstream's. ``model_device``: the type of
    the device the model is on; ``processes``: Accelerate's process count."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if model_device != "tpu":
        return "the model is not on a TPU"
    try:
        known = version is not None and Version(version).release and SpecifierSet(LM_EVAL_SUPPORTED).contains(
            ".".join(map(str, Version(version).release)))
    except InvalidVersion:
        known = False
    if not known:
        return f"lm-eval {version} is not a release whose HFLM is known ({LM_EVAL_SUPPORTED})"
    if backend != "causal":
        return f"an lm-eval backend {backend!r}: only causal LMs' forward passes are bucketed"
    if processes > 1 or parallelize:
        return "lm-eval over several processes or with parallelize=True"
    return None
