"""Which path a ``generate()`` call takes on TPU: plain decisions over plain facts (no torch, no transformers).

The generation wrappers (``wrap_generate``, ``wrap_decoding``) gather the facts of a call (:class:`CallFacts`, then :class:`LoopFacts`
once upstream has built the logits processors) and asks this module what to do:

1. :func:`plan_call`: is the call left to upstream entirely, or handled (growing tensors on the
   CPU, static cache by default, shapes bucketed)? May dummy rows pad the batch?
2. :func:`decode_path`: does the decoding loop run on the device (token selection on the TPU, only
   token ids cross the host link) or on the host (upstream's loop: logits come back every step)?

Every decision comes with its reason, so the patch can log it and the docs can list it. See
``docs/generation.md`` ("Which path a call takes").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEVICE_PROCESSORS",
    "HOST_OPTIONS",
    "CallFacts",
    "CallPlan",
    "DecodePath",
    "LoopFacts",
    "decode_path",
    "plan_call",
    "processors_needed",
    "tpu_compile_settings",
]

#: Decoding modes the plugin handles (upstream names, ``GenerationMode.value``).
HANDLED_MODES = ("greedy_search", "sample", "beam_search", "beam_sample")
#: Modes whose loop the device path implements.
DEVICE_MODES = ("greedy_search", "sample")

#: Logits processors the device path applies on the TPU, with tensor parameters (one graph for every
#: value): they read neither the sequences nor their content. The length-dependent minimum-length
#: processors are applied as an end-of-sequence mask the host switches on or off.
DEVICE_PROCESSORS = frozenset(
    {
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "MinLengthLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor",
    }
)

#: Model inputs the device loop knows how to keep on the device between steps.
DEVICE_MODEL_KWARGS = frozenset(
    {"cache", "attention_mask", "position_ids", "use_cache", "logits_to_keep", "inputs_embeds"}
)


@dataclass(frozen=True)
class CallFacts:
    """What the ``generate`` wrapper knows of a call before upstream runs (plain data)."""

    mode: str  # GenerationMode value, or "custom" for custom_generate
    encoder_decoder: bool = False
    inputs: str = "input_ids"  # "input_ids", "inputs_embeds" or "other" (pixel values, audio...)
    ids_bucketable: bool = True  # a 2D integer prompt with at least one token
    other_batched_inputs: bool = False  # per-row tensors we would have to pad too
    accepts_attention_mask: bool = True
    user_cache: bool = False  # a Cache object passed in
    cache_implementation: str | None = None
    use_cache: bool = True
    disable_compile: bool = False
    supports_default_cache: bool = True
    returns_cache: bool = False  # return_dict_in_generate: the cache reaches the user
    outputs_attentions_or_states: bool = False
    guidance: bool = False  # classifier-free guidance runs a second, unconditional batch
    do_sample: bool = False
    device_decode_possible: bool = False  # see processors_needed(): nothing needs the host


@dataclass(frozen=True)
class CallPlan:
    """What to do with a call."""

    upstream: bool  # leave the call to plain upstream generate() (only the CompileConfig is adapted)
    reason: str
    static_cache: bool = False  # pick cache_implementation="static" (the caller asked for no cache)
    bucket: bool = False  # pad prompt length, batch and cache length to buckets
    pad_batch: bool = False  # dummy rows may round the batch up (never when they would draw random numbers)


def plan_call(facts: CallFacts, *, static_cache: bool, bucketing: bool) -> CallPlan:
    """Decide how a ``generate()`` call runs on TPU (``static_cache``/``bucketing``: the settings)."""
    if facts.encoder_decoder:
        return CallPlan(True, "encoder-decoder model: its encoder needs the inputs on the device")
    if facts.mode not in HANDLED_MODES:
        return CallPlan(True, f"{facts.mode} decoding is left to upstream")
    if facts.inputs == "other":
        return CallPlan(True, "non-text main input (pixel values, audio...) is left to upstream")

    use_static = facts.cache_implementation == "static"
    default_static = (
        static_cache
        and facts.cache_implementation is None
        and not facts.user_cache
        and facts.use_cache
        and not facts.disable_compile
        and facts.supports_default_cache
        # Returned attentions are as wide as the cache: a static one would change their shapes.
        and not facts.outputs_attentions_or_states
    )
    static = use_static or default_static
    why_not = _why_not_bucketed(facts, static, bucketing)
    if why_not:
        return CallPlan(False, why_not, static_cache=default_static)
    # Dummy rows would each draw a random number per step on the host path, shifting the real rows'
    # stream away from the unpatched call's: sampling on the host runs with the batch as given.
    pad_batch = not facts.do_sample or (facts.device_decode_possible and facts.mode in DEVICE_MODES)
    return CallPlan(False, "bucketed", static_cache=default_static, bucket=True, pad_batch=pad_batch)


def _why_not_bucketed(facts: CallFacts, static: bool, bucketing: bool) -> str | None:
    if not bucketing:
        return "bucketing disabled"
    if not static:
        return "no static cache"
    if facts.user_cache:
        return "a cache was passed in"
    if facts.inputs != "input_ids" or not facts.ids_bucketable:
        return "the prompt is not a 2D tensor of token ids"
    if facts.other_batched_inputs:
        return "other per-row inputs would need padding too"
    if not facts.accepts_attention_mask:
        return "the model takes no attention mask"
    if facts.outputs_attentions_or_states:
        return "attentions/hidden states are returned with the padded shapes"
    if facts.guidance:
        return "classifier-free guidance runs its own unconditional batch"
    return None


#: Generation options whose processors read the sequences (or are not implemented on the device).
HOST_OPTIONS = (
    "repetition_penalty",
    "no_repeat_ngram_size",
    "bad_words_ids",
    "sequence_bias",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "guidance_scale",
    "watermarking_config",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "top_h",
    "renormalize_logits",
    "remove_invalid_values",
    "token_healing",
    "encoder_repetition_penalty",
    "encoder_no_repeat_ngram_size",
)
_NEUTRAL = {
    "repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "guidance_scale": (None, 1, 1.0),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "renormalize_logits": (None, False),
    "remove_invalid_values": (None, False),
    "token_healing": (None, False),
    "encoder_repetition_penalty": (None, 1.0),
    "encoder_no_repeat_ngram_size": (None, 0),
}


def processors_needed(options: dict[str, object]) -> list[str]:
    """The generation options set in ``options`` that need the host path (empty: the device can decode).

    ``options`` maps generation-config field names to values; fields absent count as unset.
    """
    needed = []
    for name in HOST_OPTIONS:
        value = options.get(name)
        if value in _NEUTRAL.get(name, (None,)):
            continue
        needed.append(name)
    return needed


@dataclass(frozen=True)
class LoopFacts:
    """What the decoding-method wrapper knows once upstream prepared the loop (plain data)."""

    mode: str
    device_decode: bool  # the setting
    processors: tuple[str, ...]  # class names of the prepared logits processors
    model_kwargs: tuple[str, ...]  # names of the model inputs carried between steps
    outputs_scores_or_logits: bool = False
    outputs_attentions_or_states: bool = False
    synced_gpus: bool = False
    custom_mask_function: bool = False  # the model overrides create_masks_for_generate


@dataclass(frozen=True)
class DecodePath:
    device: bool
    reason: str


def decode_path(facts: LoopFacts) -> DecodePath:
    """Device loop (token ids only cross the host link) or host loop (upstream's, logits to the host)."""
    if not facts.device_decode:
        return DecodePath(False, "device decoding disabled")
    if facts.mode not in DEVICE_MODES:
        return DecodePath(False, f"{facts.mode} runs upstream's loop")
    if facts.outputs_scores_or_logits:
        return DecodePath(False, "output_scores/output_logits need the scores on the host")
    if facts.outputs_attentions_or_states:
        return DecodePath(False, "attentions/hidden states are returned every step")
    if facts.synced_gpus:
        return DecodePath(False, "synced_gpus")
    if facts.custom_mask_function:
        return DecodePath(False, "the model builds its own generation masks")
    host = sorted(set(facts.processors) - DEVICE_PROCESSORS)
    if host:
        return DecodePath(False, "logits processors that need the host: " + ", ".join(host))
    extra = sorted(set(facts.model_kwargs) - DEVICE_MODEL_KWARGS - _PASSIVE_KWARGS)
    if extra:
        return DecodePath(False, "model inputs the device loop does not carry: " + ", ".join(extra))
    return DecodePath(True, "device")


#: Model kwargs that are plain flags, not per-step tensors.
_PASSIVE_KWARGS = frozenset({"output_attentions", "output_hidden_states", "return_dict"})



#: String backends that run on any device; any other string backend is replaced by ``tpu``.
PORTABLE_BACKENDS = frozenset({"tpu", "eager", "aot_eager", "aot_eager_decomp_partition"})


def tpu_compile_settings(backend: object, mode: object, options: object, dynamic: object) -> tuple[dict, list[str]]:
    """A ``CompileConfig``'s settings the ``tpu`` backend accepts, and what changed (empty: keep it).

    torch_tpu's backend takes no ``mode`` (``reduce-overhead`` and ``max-autotune`` raise) and
    inductor fails on TPU tensors: a string backend other than a portable one becomes ``tpu``, its
    inductor ``options`` are dropped, ``mode`` goes back to ``default``, and an unset ``dynamic``
    becomes ``False`` (static shapes, as the buckets assume). A callable backend is the caller's.
    """
    changes = []
    new_backend, new_mode, new_options, new_dynamic = backend, mode, options, dynamic
    if isinstance(backend, str) and backend not in PORTABLE_BACKENDS:
        changes.append(f"backend={backend!r} -> 'tpu'")
        new_backend = "tpu"
    if mode not in (None, "default"):
        changes.append(f"mode={mode!r} dropped")
        new_mode = "default"
    if options and new_backend != backend:
        changes.append("inductor options dropped")
        new_options = None
    if changes and dynamic is None:
        new_dynamic = False
        changes.append("dynamic=False")
    return dict(backend=new_backend, mode=new_mode, options=new_options, dynamic=new_dynamic), changes
