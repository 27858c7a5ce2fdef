"""What reads the length of a forward pass: one place, shared by generation and training (no torch).

Padding a batch and splitting a prompt into prefill chunks are invisible to a model only if nothing
in it reads how long the forward pass is. Left padding in ``generate()`` keeps every real token's
position (positions come from the attention mask; padding columns get position 0), and right padding
in training keeps every real token's prefix; what can still see the padding or the chunks:

- **Rotary embeddings whose frequencies depend on the forward pass** (Transformers'
  ``dynamic_rope_update``, ``seq_len = max(position_ids) + 1``):

  - ``"longrope"`` (Phi-3/3.5/4-mini, PhiMoE): the long factors when ``seq_len >
    original_max_position_embeddings``, the short ones otherwise, chosen afresh at every forward.
    A prompt prefilled in chunks rotates its first chunks' keys with the short factors where the
    whole prompt rotates every key with the long ones; in training, positions run over the padded
    length, so padding past the threshold switches factors. Phi-3's own
    ``prepare_inputs_for_generation`` also drops the cache (and recomputes the whole sequence) at the
    step where the *columns* of the sequence first pass the threshold: padding columns move that step.
  - ``"dynamic"`` (dynamic NTK, any type whose name contains ``dynamic``): past
    ``max_position_embeddings`` the frequencies are recomputed for the longest ``seq_len`` seen, and
    reset only by a forward pass *shorter* than it: the frequencies depend on the history of lengths.
  - every other entry of ``ROPE_INIT_FUNCTIONS`` (``linear``, ``yarn``, ``llama3``, ``proportional``)
    and ``default``: frequencies fixed from the config at init, whatever the length; and the models' own types:
    ``ntk_alpha`` (HunYuan) and ``axial`` (Transformers 5.25's vision rotary embeddings: Qwen2-VL, Qwen2.5-VL,
    Qwen3-VL, GLM-4V, Pixtral, Gemma 4 and 30 more, whose positions are image-grid coordinates and whose
    frequencies are fixed; their ``forward`` has no ``dynamic_rope_update``).

- **NEFTune** (``TrainingArguments.neftune_noise_alpha``): noise of magnitude
  ``alpha / sqrt(size(1) * size(2))`` added to the input embeddings in training, where ``size(1)``
  is the padded length, drawn over the padded tensor: padding weakens it and moves the random draws.

Anything not in :data:`ROPE_TYPES` (a rotary type a user registered, a model's own) is not recognised:
the predicates leave such calls and batches to upstream. ``tests/core/test_length_readers.py`` checks
the table against every entry of the installed ``ROPE_INIT_FUNCTIONS``, every rotary type a model of the
installed release accepts (its ``compute_<type>_rope_parameters`` and ``rope_type`` checks), and real rotary
modules.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ROPE_TYPES",
    "LengthPlan",
    "ModelLengths",
    "RopeType",
    "Rotary",
    "chunks_exact",
    "generation_plan",
    "model_lengths",
    "padding_limit",
    "rope_type",
]


@dataclass(frozen=True)
class RopeType:
    """What a rotary type reads: ``threshold`` names the config field past which its frequencies change
    (``None``: they never depend on the length); ``stateful``: they also depend on earlier forwards."""

    threshold: str | None
    stateful: bool = False
    note: str = ""


#: Every entry of Transformers 5.25's ``ROPE_INIT_FUNCTIONS``, ``default``, and the models' own types.
ROPE_TYPES: dict[str, RopeType] = {
    "default": RopeType(None, note="frequencies from rope_theta"),
    "linear": RopeType(None, note="positions divided by a fixed factor"),
    "yarn": RopeType(None, note="frequencies from the config's factor and original_max_position_embeddings"),
    "llama3": RopeType(None, note="frequencies from the config's factors"),
    "proportional": RopeType(None, note="frequencies from the config"),
    "ntk_alpha": RopeType(None, note="HunYuan's fixed-alpha NTK (its checkpoints say 'dynamic')"),
    "axial": RopeType(None, note="vision towers' 2-D rotary: image-grid positions, frequencies from rope_theta"),
    "longrope": RopeType(
        "original_max_position_embeddings",
        note="long factors when max(position_ids) + 1 > original_max_position_embeddings, at every forward",
    ),
    "dynamic": RopeType(
        "max_position_embeddings",
        stateful=True,
        note="rescaled for the longest length seen past max_position_embeddings, reset by a shorter forward",
    ),
}


def rope_type(name: str) -> RopeType | None:
    """The facts of a rotary type, or ``None`` if it is not recognised (as ``dynamic_rope_update`` reads it:
    any name containing ``dynamic`` is dynamic NTK)."""
    if name in ROPE_TYPES:
        return ROPE_TYPES[name]
    if "dynamic" in name:
        return None  # a variant upstream treats as dynamic, whose threshold we do not know
    return None


@dataclass(frozen=True)
class Rotary:
    """One rotary embedding of a model: its type and the length its frequencies switch past (or ``None``)."""

    rope_type: str
    threshold: int | None = None


@dataclass(frozen=True)
class ModelLengths:
    """What in a model reads the length (plain data; :func:`model_lengths` reads it off a model).

    ``resets_cache_at``: the model's own ``prepare_inputs_for_generation`` drops the cache and
    recomputes the whole sequence at the step whose input first has more columns than this (Phi-3).
    """

    rotary: tuple[Rotary, ...] = ()
    resets_cache_at: int | None = None

    @property
    def unknown(self) -> list[str]:
        return sorted({r.rope_type for r in self.rotary if rope_type(r.rope_type) is None})

    @property
    def readers(self) -> tuple[Rotary, ...]:
        """The rotary embeddings whose frequencies depend on the length (with a known threshold)."""
        return tuple(r for r in self.rotary if (kind := rope_type(r.rope_type)) is not None and kind.threshold)

    def __bool__(self) -> bool:
        return bool(self.unknown or self.readers)


def chunks_exact(model: ModelLengths, longest: int) -> bool:
    """Whether any split of a prompt whose longest row has ``longest`` tokens into prefill chunks gives
    the frequencies of the whole prompt: every chunk's ``seq_len`` is at most ``longest``, so it is
    exact when the whole prompt stays on the near side of every threshold (longrope: ``<=``; dynamic:
    ``<``, where each chunk resets the frequencies exactly as the whole prompt does)."""
    for rotary in model.readers:
        kind = ROPE_TYPES[rotary.rope_type]
        if rotary.threshold is None:
            return False
        if kind.stateful and longest >= rotary.threshold:
            return False
        if not kind.stateful and longest > rotary.threshold:
            return False
    return not model.unknown


@dataclass(frozen=True)
class LengthPlan:
    """How a ``generate()`` call of a length-reading model runs: ``upstream`` (Transformers' call,
    untouched), else ``pad`` (left padding to the bucket allowed) and ``chunk`` (the prefill chunk the
    plugin may set: ``None`` = the whole padded prompt in one piece)."""

    upstream: bool
    reason: str
    pad: bool = True
    chunk: int | None = None
    warn: bool = False  # said at WARNING when left to upstream (else at DEBUG)


def generation_plan(
    model: ModelLengths,
    *,
    columns: int,
    longest: int,
    new_tokens: int,
    padded: int | None,
    chunk: int | None,
    caller_chunk: int | None = None,
) -> LengthPlan:
    """The plan that gives upstream's unchunked result for a call of ``columns`` prompt columns whose
    longest row has ``longest`` tokens, making at most ``new_tokens`` tokens; ``padded``: the bucket's
    prompt columns (``None``: not bucketed), ``chunk``: the prefill chunk the buckets would set,
    ``caller_chunk``: the caller's ``prefill_chunk_size``.

    Positions come from the attention mask, so left padding and a longer static cache never change any
    forward's ``max(position_ids)``, at the prefill or at a decode step; only chunking does (and the
    columns, for a model that resets its cache at a column count).
    """
    if model.unknown:
        return LengthPlan(True, f"rotary embedding of a type the plugin does not know ({', '.join(model.unknown)})")
    last_columns = columns + max(new_tokens, 1) - 1  # the columns of the last forward's input
    reset = model.resets_cache_at
    if reset is not None and last_columns > reset:
        return LengthPlan(
            True,
            f"the sequence passes original_max_position_embeddings={reset}: the model drops its cache there "
            "and recomputes the sequence (Phi-3's long factors)",
        )
    for rotary in model.readers:
        last_length = longest + max(new_tokens, 1) - 1  # max(position_ids) + 1 of the call's last forward
        if ROPE_TYPES[rotary.rope_type].stateful and rotary.threshold is not None and last_length > rotary.threshold:
            return LengthPlan(
                True,
                f"rope_type={rotary.rope_type!r} past max_position_embeddings={rotary.threshold}: its frequencies follow "
                "the longest length seen (Transformers' dynamic_rope_update branches on a tensor read on the host and "
                "keeps that length as module state, int or tensor by history), so the compiled steps' graphs depend on "
                "the calls before; this call runs Transformers' generate()",
                warn=True,
            )
    pad = padded is not None
    why = []
    if pad and reset is not None and padded + max(new_tokens, 1) - 1 > reset:
        pad = False
        why.append(f"padding would pass original_max_position_embeddings={reset} (the model resets its cache there)")
    exact = chunks_exact(model, longest)
    if caller_chunk is not None and not exact and pad:
        pad = False
        why.append("your prefill_chunk_size: padding would move its chunks across the rotary threshold")
    if exact:
        return LengthPlan(False, "; ".join(why) or "the prompt stays within the rotary threshold", pad, chunk)
    if caller_chunk is None:
        why.append(f"the prompt ({longest} tokens) passes the rotary threshold: prefilled in one piece")
    return LengthPlan(False, "; ".join(why), pad, None)


def padding_limit(model: ModelLengths, longest: int, *, neftune: bool = False) -> int | str | None:
    """The longest a training batch whose longest row has ``longest`` tokens may be padded to (right
    padding: positions run over the padded length), ``None`` for no limit, or why it is left as collated."""
    if neftune:
        return "NEFTune (neftune_noise_alpha) scales its noise by the padded length and draws it over the padding"
    if model.unknown:
        return f"a rotary embedding of a type the plugin does not know ({', '.join(model.unknown)}) may read the length"
    limit: int | None = None
    for rotary in model.readers:
        kind, threshold = ROPE_TYPES[rotary.rope_type], rotary.threshold
        if threshold is None:
            return f"rope_type={rotary.rope_type!r} without a known threshold"
        if kind.stateful:
            # Frequencies follow the longest length seen since the last forward shorter than the threshold.
            cap = threshold - 1 if longest < threshold else longest
        else:
            cap = threshold if longest <= threshold else None
        if cap is not None:
            limit = cap if limit is None else min(limit, cap)
    return limit


def _threshold(module: Any, config: Any, kind: RopeType | None, layer_type: str | None) -> int | None:
    if kind is None or kind.threshold is None:
        return None
    if kind.threshold == "max_position_embeddings":
        value = getattr(module, "original_max_seq_len", None) or getattr(config, "max_position_embeddings", None)
    else:
        params = getattr(config, "rope_parameters", None) or {}
        if layer_type is not None and isinstance(params.get(layer_type), dict):
            params = params[layer_type]
        value = params.get(kind.threshold) if isinstance(params, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def model_lengths(model: Any) -> ModelLengths:
    """The :class:`ModelLengths` of a Transformers model: its rotary modules (``rope_type`` as the
    module holds it, per layer type too) and Phi-3's cache reset (duck-typed; imports nothing)."""
    found: set[Rotary] = set()
    modules: Iterable[Any] = model.modules() if hasattr(model, "modules") else ()
    for module in modules:
        types = getattr(module, "rope_type", None)
        if types is None or not hasattr(module, "inv_freq") and not isinstance(types, dict):
            continue
        config = getattr(module, "config", None) or getattr(model, "config", None)
        items = types.items() if isinstance(types, dict) else [(None, types)]
        for layer_type, name in items:
            if isinstance(name, str):
                found.add(Rotary(name, _threshold(module, config, rope_type(name), layer_type)))
    result = ModelLengths(tuple(sorted(found, key=lambda r: (r.rope_type, r.threshold or 0))))
    if not result.readers:
        return result
    reset = None
    from_mixin = _defined_by(type(model), "prepare_inputs_for_generation")
    if from_mixin is not None and not from_mixin.startswith("transformers.generation."):
        config = getattr(model, "config", None)
        value = getattr(config, "original_max_position_embeddings", None)
        if not isinstance(value, int):
            value = min(r.threshold for r in result.readers if r.threshold is not None)
        reset = value
    return ModelLengths(result.rotary, reset)


def _defined_by(cls: type, name: str) -> str | None:
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass.__module__
    return None


#: The markers of the generated table in docs/generation.md (``python scripts/gen_docs_tables.py``).
BEGIN = "<!-- generated: transformers_tpu_ext.core.length_readers.length_table() -->"
END = "<!-- end of generated length table -->"

_PHI35 = ModelLengths((Rotary("longrope", 4096),), resets_cache_at=4096)
_DYNAMIC_4K = ModelLengths((Rotary("dynamic", 4096),))
#: (model, what the call is, columns, longest row, new tokens, the bucket's prompt columns, the plugin's chunk, yours)
_EXAMPLES: tuple[tuple[str, str, ModelLengths, int, int, int, int | None, int | None, int | None], ...] = (
    ("any model whose rotary frequencies are fixed (`default`, `linear`, `yarn`, `llama3`, `proportional`)",
     "any prompt", ModelLengths((Rotary("default"),)), 5000, 5000, 100, 5056, 64, None),
    ("dynamic NTK (`rope_type=\"dynamic\"`, `max_position_embeddings=4096`)", "a 3,000-token prompt",
     _DYNAMIC_4K, 3000, 3000, 200, 3008, 64, None),
    ("dynamic NTK", "a 3,000-token prompt, 2,000 new tokens (the sequence passes 4,096)", _DYNAMIC_4K, 3000, 3000, 2000,
     3008, 64, None),
    ("dynamic NTK", "a 6,000-token prompt", _DYNAMIC_4K, 6000, 6000, 200, 6016, 64, None),
    ("dynamic NTK", "a 6,000-token prompt, your `prefill_chunk_size=512`", _DYNAMIC_4K, 6000, 6000, 200, 6016, 64, 512),
    ("Phi-3.5-mini (`rope_type=\"longrope\"`, `original_max_position_embeddings=4096`)",
     "a 3,000-token prompt, 200 new tokens", _PHI35, 3000, 3000, 200, 3008, 64, None),
    ("Phi-3.5-mini", "a 4,000-token prompt, 90 new tokens (the bucket's 4,016 columns would pass 4,096)",
     _PHI35, 4000, 4000, 90, 4016, 64, None),
    ("Phi-3.5-mini", "a 4,000-token prompt, 200 new tokens (the sequence passes 4,096)", _PHI35, 4000, 4000, 200, 4016, 64, None),
    ("Phi-3.5-mini", "a 6,000-token prompt", _PHI35, 6000, 6000, 200, 6016, 64, None),
    ("a rotary type the plugin does not know (a user's entry in `ROPE_INIT_FUNCTIONS`)", "any prompt",
     ModelLengths((Rotary("my_rope"),)), 100, 100, 10, 128, 64, None),
)


def length_table() -> str:
    """The markdown table of docs/generation.md's "Models whose rotary embedding reads the length"."""
    lines = ["| model | call | path | padded to buckets | prefill | why |", "|---|---|---|---|---|---|"]
    for model_text, call, model, columns, longest, new, padded, chunk, yours in _EXAMPLES:
        if not model:
            lines.append(f"| {model_text} | {call} | the plugin's | yes | in chunks of {chunk} | frequencies fixed at load |")
            continue
        plan_chunk = chunk if padded > chunk else None
        plan = generation_plan(model, columns=columns, longest=longest, new_tokens=new, padded=padded,
                               chunk=plan_chunk, caller_chunk=yours)
        if plan.upstream:
            lines.append(f"| {model_text} | {call} | Transformers', untouched | — | — | {plan.reason} |")
            continue
        if yours is not None:
            prefill = f"your chunks of {yours}"
        elif plan.chunk is None:
            prefill = "in one piece"
        else:
            prefill = f"in chunks of {plan.chunk}"
        lines.append(f"| {model_text} | {call} | the plugin's | {'yes' if plan.pad else 'no'} | {prefill} | {plan.reason} |")
    return "\n".join(lines)
