"""Which path a ``generate()`` call takes on TPU: plain decisions over plain facts (no torch, no transformers).

Each path the plugin can put a call on changes what Transformers computes, so each has a "safe
when" predicate here, returning the path and the reason; a call it does not positively recognise is
Transformers' call, untouched:

1. :func:`cache_choice`: the **static-cache substitution**: the KV cache a handled call runs with
   (generate()'s own ``StaticCache``: the caller's ``cache_implementation="static"``, or the
   plugin's default when the caller asked for none); every other cache leaves the call to upstream.
2. :func:`plan_call`: is the call left to upstream entirely, or handled (growing tensors on the CPU,
   the static cache)? Is it **padded to buckets** (prompt, batch, cache length; see
   :func:`_why_not_bucketed`), and may dummy rows pad the batch?
3. :func:`decode_path`: does the **device loop** run it (token choice on the TPU, only token ids
   cross the host link) or upstream's loop?
4. :func:`mask_path`: are the call's **4D masks built on the device** from its 2D mask (sent once),
   or by upstream on the host?
5. :func:`kv_cache_choice`: does the plugin's static cache hold **int8 keys and values** (the opt-in
   ``TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE=int8``), or the model's dtype as upstream's?

The glue reads the facts off the model (:class:`ModelKind`), the generation options and the call's
arguments (:class:`CallShape`); :func:`call_facts` turns them into :class:`CallFacts`, the same way for a
real call and for the docs table (``generation.paths``). ``TRANSFORMERS_VERBOSITY=debug`` logs every decision. See ``docs/generation.md`` ("Which path a call takes").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .recurrent import DOCS as RECURRENT_DOCS, RecurrentPath
from .device_policy import (  # the KV cache's format, the compile settings, the host's options: re-exported here
    HOST_OPTIONS,
    KVFacts,
    callback_device,
    kv_cache_choice,
    processors_needed,
    tpu_compile_settings,
)

__all__ = [
    "DEVICE_PROCESSORS",
    "HOST_OPTIONS",
    "OPTION_DEFAULTS",
    "STATIC_LAYER_TYPES",
    "CallFacts",
    "CallPlan",
    "CallShape",
    "DecodePath",
    "KVFacts",
    "LoopFacts",
    "ModelKind",
    "cache_choice",
    "call_facts",
    "decode_path",
    "notice",
    "kv_cache_choice",
    "mask_path",
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

#: Model inputs the device loop knows how to keep on the device between steps (the cache is ``cache`` from
#: Transformers 5.24, ``past_key_values`` in 5.23).
DEVICE_MODEL_KWARGS = frozenset(
    {"cache", "past_key_values", "attention_mask", "position_ids", "use_cache", "logits_to_keep", "inputs_embeds",
     # per-column type ids: a decode step reads the last column (token_type_ids: upstream repeats the prompt's last
     # value, which the prompt's tensor sliced gives; mm_token_type_ids: upstream appends text, 0, which the loop feeds)
     "token_type_ids", "mm_token_type_ids"}
)


#: Text-layer types (``config.layer_types``, as Transformers' caches read them) the plugin's static
#: cache holds as full-length key/value layers: ``StaticLayer``, and sliding windows replaced by
#: full-length layers masked to the window. Chunked, linear-attention, convolution, hybrid, indexed
#: and shared ("dummy") layers are not recognised.
STATIC_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


@dataclass(frozen=True)
class ModelKind:
    """What the glue reads off the model for a call (plain data)."""

    encoder_decoder: bool = False
    supports_default_cache: bool = True  # Transformers makes Cache objects for it (not Mamba, RWKV, XLNet...)
    layer_types: tuple[str, ...] = ("full_attention",)  # its text layers, as its caches see them
    accepts_attention_mask: bool = True
    accepts_position_ids: bool = True  # else it derives positions itself (from the cache, the columns...)
    custom_mask_function: bool = False  # it overrides create_masks_for_generate (multimodal models)
    causal: bool = True  # config.is_causal
    recurrent: RecurrentPath | None = None  # recurrent.recurrent_path: state-space and hybrid models, else None
    family: str | None = None  # config.model_type


@dataclass(frozen=True)
class CallShape:
    """What a call's arguments are, apart from its generation options (plain data)."""

    mode: str = "greedy_search"  # GenerationMode value, or "custom" for custom_generate
    inputs: str = "input_ids"  # "input_ids", "inputs_embeds" or "other" (pixel values, audio...)
    ids_bucketable: bool = True  # a 2D integer prompt with at least one token
    other_batched_inputs: bool = False  # per-row tensors we would have to pad too
    other_inputs_reason: str | None = None  # why they cannot be padded (multimodal.media_plan), if known
    cache_object: bool = False  # a Cache object passed in (past_key_values= / cache=)
    logits_callbacks: bool = False  # a logits_processor list or a prefix_allowed_tokens_fn of the caller's
    eager_stance: bool = False  # called under torch.compiler.set_stance("force_eager")


@dataclass(frozen=True)
class CallFacts:
    """What the ``generate`` wrapper knows of a call before upstream runs (plain data)."""

    mode: str  # GenerationMode value, or "custom" for custom_generate
    encoder_decoder: bool = False
    family: str | None = None  # config.model_type
    inputs: str = "input_ids"  # "input_ids", "inputs_embeds" or "other" (pixel values, audio...)
    ids_bucketable: bool = True  # a 2D integer prompt with at least one token
    other_batched_inputs: bool = False  # per-row tensors we would have to pad too
    other_inputs_reason: str | None = None
    accepts_attention_mask: bool = True
    accepts_position_ids: bool = True
    user_cache: bool = False  # a Cache object passed in
    cache_implementation: str | None = None
    use_cache: bool = True
    disable_compile: bool = False
    eager_stance: bool = False  # torch.compiler.set_stance("force_eager")
    supports_default_cache: bool = True
    layer_types_static: bool = True  # every text layer type in STATIC_LAYER_TYPES
    returns_cache: bool = False  # return_dict_in_generate: the cache reaches the user
    outputs_attentions_or_states: bool = False
    guidance: bool = False  # classifier-free guidance: its processor runs the model on the sequences
    do_sample: bool = False
    device_decode_possible: bool = False  # see processors_needed(): nothing needs the host
    token_healing: bool = False  # upstream re-tokenizes the prompt inside generate()
    recurrent: RecurrentPath | None = None  # ModelKind.recurrent
    feeds_back: bool = False  # Whisper's condition_on_prev_tokens: each segment's tokens start the next prompt


#: The generation options :func:`call_facts` reads, with Transformers' defaults (``GenerationConfig()``).
OPTION_DEFAULTS: Mapping[str, object] = {
    "cache_implementation": None,
    "use_cache": True,
    "disable_compile": False,
    "return_dict_in_generate": False,
    "output_attentions": False,
    "output_hidden_states": False,
    "output_scores": False,
    "output_logits": False,
    "do_sample": False,
    "num_beams": 1,
    "condition_on_prev_tokens": False,  # Whisper's, set on the config its own generate() passes
}


def call_facts(options: Mapping[str, object], model: ModelKind, call: CallShape, *, device_decode: bool) -> CallFacts:
    """The facts of a call: ``options`` are its resolved generation options (field -> value, absent =
    Transformers' default), ``model`` and ``call`` what the glue read, ``device_decode`` the setting."""
    option = {**OPTION_DEFAULTS, **{name: None for name in HOST_OPTIONS}, **options}
    returns = bool(option["return_dict_in_generate"])
    device_possible = (
        device_decode
        and not processors_needed(option)
        and not call.logits_callbacks
        and not (returns and (option["output_scores"] or option["output_logits"]))
        and not model.custom_mask_function
    )
    recurrent = model.recurrent if model.recurrent is not None and model.recurrent.handled else None
    return CallFacts(
        mode=call.mode,
        encoder_decoder=model.encoder_decoder,
        family=model.family,
        inputs=call.inputs,
        ids_bucketable=call.ids_bucketable,
        other_batched_inputs=call.other_batched_inputs,
        other_inputs_reason=call.other_inputs_reason,
        accepts_attention_mask=model.accepts_attention_mask,
        accepts_position_ids=model.accepts_position_ids or (recurrent is not None and not recurrent.positions),  # Mamba
        user_cache=call.cache_object,
        cache_implementation=option["cache_implementation"],  # type: ignore[arg-type]
        use_cache=option["use_cache"] is not False,
        disable_compile=bool(option["disable_compile"]),
        eager_stance=call.eager_stance,
        supports_default_cache=model.supports_default_cache,
        layer_types_static=set(model.layer_types) <= STATIC_LAYER_TYPES or recurrent is not None,
        returns_cache=returns,
        outputs_attentions_or_states=returns and bool(option["output_attentions"] or option["output_hidden_states"]),
        guidance=option["guidance_scale"] not in (None, 1, 1.0),
        do_sample=bool(option["do_sample"]),
        device_decode_possible=device_possible,
        token_healing=bool(option["token_healing"]),
        recurrent=model.recurrent,
        feeds_back=bool(option["condition_on_prev_tokens"]),
    )


@dataclass(frozen=True)
class CallPlan:
    """What to do with a call."""

    upstream: bool  # leave the call to plain upstream generate() (only the CompileConfig is adapted)
    reason: str
    static_cache: bool = False  # pick cache_implementation="static" (the caller asked for no cache)
    bucket: bool = False  # pad prompt length, batch and cache length to buckets
    pad_batch: bool = False  # dummy rows may round the batch up (never when they would draw random numbers)
    pad_prompt: bool = True  # with ``bucket``: the prompt too (an encoder-decoder call: the cache length only)
    #: What helps when the call is not accelerated for a reason that is not the caller's own setting (the
    #: WARNING names it, once per model and reason: :func:`notice`); ``None``: the caller chose it (DEBUG only).
    hint: str | None = field(default=None, compare=False)


#: The docs sections the WARNINGs of unaccelerated calls point to.
PATHS_DOCS = "docs/generation.md#which-path-a-call-takes"
MODEL_DOCS = "docs/generation.md#vision-language-speech-and-encoder-decoder-models"
LENGTH_DOCS = "docs/generation.md#models-whose-rotary-embedding-reads-the-length"

#: What a call the plugin does not accelerate costs, by how far it is from the plugin's path.
_EFFECTS = {
    "upstream": "runs as plain Transformers (no compiled static cache, no buckets: new programs for new shapes)",
    "unbucketed": "is not padded to buckets (every new prompt length or batch size compiles new programs)",
    "host": "decodes on the host (every step's logits cross to the host)",
}


def notice(model: str, where: str, reason: str, hint: str | None) -> str | None:
    """The WARNING for a ``generate()`` of ``model`` that is not accelerated (``where``: ``"upstream"``,
    ``"unbucketed"`` or ``"host"``), or ``None`` when ``hint`` is ``None`` (the caller's own choice:
    a setting, ``disable_compile``, a cache of their own kind, ``use_cache=False``; logged at DEBUG)."""
    if hint is None:
        return None
    return f"generate() of {model} on TPU {_EFFECTS[where]}: {reason} (see {hint})"


def cache_choice(facts: CallFacts, *, static_cache: bool) -> tuple[str | None, str]:
    """The KV cache a handled call runs with: ``("static" | "default", why)``, or ``(None, why not)``.

    Only a ``StaticCache`` generate() makes itself is recognised (the caller's
    ``cache_implementation="static"``, or the plugin's default where the caller asked for no cache;
    ``static_cache``: the setting), on a model that takes the position ids generate() computes and
    whose every text layer the cache holds as a full-length key/value layer. The device loop's mask,
    the bucket padding and the cache handed back are proven for that cache alone; any other (a
    dynamic, quantized or offloaded cache, a cache object passed in, no cache) is upstream's.
    """
    if facts.user_cache:
        return None, "a cache object was passed in (its kind and length are the caller's)"
    if not facts.use_cache:
        return None, "use_cache=False (every step runs the whole sequence)"
    if not facts.supports_default_cache:
        return None, "the model makes its own cache (no Cache object)"
    if not facts.layer_types_static:
        if facts.recurrent is not None:  # recurrent.recurrent_path: a family it has no proof for
            return None, facts.recurrent.reason
        return None, "the model has layers a static cache does not hold as full-length key/value layers"
    if facts.recurrent is not None and facts.returns_cache:
        return None, "return_dict_in_generate=True on a model with recurrent layers (the cache handed back would hold the padding)"
    if not facts.accepts_position_ids:
        # It derives positions itself (from the cache's length, the mask...): a static cache or left
        # padding can change them (BART's decoder: upstream's own static cache differs from its dynamic one).
        return None, "the model takes no position ids (it derives them itself)"
    if facts.cache_implementation == "static":
        return "static", "cache_implementation='static'"
    if facts.cache_implementation is not None:
        return None, f"cache_implementation={facts.cache_implementation!r}"
    if not static_cache:
        return None, "the static cache by default is off (TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE=0)"
    if facts.disable_compile:
        return None, "disable_compile=True (the static cache by default is for compiling)"
    if facts.eager_stance:
        return None, 'torch.compiler.set_stance("force_eager") (the static cache by default is for compiling)'
    if facts.outputs_attentions_or_states:
        # Returned attentions are as wide as the cache: a static one would change their shapes.
        return None, "attentions/hidden states returned (as wide as the cache)"
    return "default", "no cache asked for: the static cache"


#: The reasons that are the caller's own choice (a setting of the plugin's, an option that turns the compiled
#: static cache off): logged at DEBUG only, never a WARNING.
CALLER_CHOICES = (
    "use_cache=False",
    "cache_implementation=",
    "the static cache by default is off",
    "disable_compile=True",
    'torch.compiler.set_stance("force_eager")',
    "bucketing disabled",
    "device decoding disabled",
)

#: Why an encoder-decoder model's call is upstream's (the glue says it before any planning).
ENCODER_DECODER = "encoder-decoder model"


def plan_call(facts: CallFacts, *, static_cache: bool, bucketing: bool) -> CallPlan:
    """Decide how a ``generate()`` call runs on TPU (``static_cache``/``bucketing``: the settings)."""
    if facts.mode not in HANDLED_MODES:
        return CallPlan(True, f"{facts.mode} decoding is left to upstream", hint=PATHS_DOCS)
    if facts.encoder_decoder:
        return _encoder_decoder_plan(facts, static_cache, bucketing)
    if facts.inputs == "other":
        return CallPlan(True, "non-text main input (pixel values, audio...) is left to upstream", hint=MODEL_DOCS)
    if facts.inputs == "inputs_embeds" and facts.other_batched_inputs:  # expanded on the embeddings' device
        return CallPlan(True, "inputs_embeds with other per-row inputs (images...) is left to upstream", hint=MODEL_DOCS)
    if facts.token_healing:
        return CallPlan(True, "token_healing re-tokenizes the prompt inside generate()", hint=PATHS_DOCS)
    if facts.guidance:
        # Its logits processor runs the model on the sequences, which a handled call keeps on the CPU.
        return CallPlan(True, "classifier-free guidance runs the model on the sequences inside a logits processor",
                        hint=PATHS_DOCS)
    kind, why = cache_choice(facts, static_cache=static_cache)
    if kind is None:
        docs = RECURRENT_DOCS if facts.recurrent is not None else PATHS_DOCS
        return CallPlan(True, why, hint=None if why.startswith(CALLER_CHOICES) else docs)
    default_static = kind == "default"
    why_not = _why_not_bucketed(facts, bucketing)
    if why_not:
        hint = None if why_not.startswith(CALLER_CHOICES) else (MODEL_DOCS if facts.other_batched_inputs else PATHS_DOCS)
        return CallPlan(False, why_not, static_cache=default_static, hint=hint)
    # Dummy rows would each draw a random number per step on the host path, shifting the real rows'
    # stream away from the unpatched call's: sampling on the host runs with the batch as given.
    pad_batch = not facts.do_sample or (facts.device_decode_possible and facts.mode in DEVICE_MODES)
    return CallPlan(False, "bucketed", static_cache=default_static, bucket=True, pad_batch=pad_batch)


def _encoder_decoder_plan(facts: CallFacts, static_cache: bool, bucketing: bool) -> CallPlan:
    """An encoder-decoder call (``seq2seq``): upstream's static ``EncoderDecoderCache``, its length bucketed; the
    decoder's prompt and the batch as given. What ``seq2seq.why_upstream`` names is upstream's."""
    from .seq2seq import ENCODER_DECODER_FAMILIES, why_upstream
    kind, why = cache_choice(facts, static_cache=static_cache)
    if (upstream := why_upstream(facts, kind)) is not None:
        return CallPlan(True, f"{ENCODER_DECODER} ({upstream})", hint=MODEL_DOCS)
    if kind is None:
        return CallPlan(True, why, hint=None if why.startswith(CALLER_CHOICES) else MODEL_DOCS)
    reason = f"{facts.family}: {ENCODER_DECODER_FAMILIES[facts.family]}"
    return CallPlan(False, reason if bucketing else "bucketing disabled", static_cache=kind == "default", bucket=bucketing, pad_prompt=False)


def _why_not_bucketed(facts: CallFacts, bucketing: bool) -> str | None:
    """Why a handled call (generate()'s static cache) is not padded to buckets, or ``None``."""
    if not bucketing:
        return "bucketing disabled"
    if facts.inputs != "input_ids" or not facts.ids_bucketable:
        return "the prompt is not a 2D tensor of token ids"
    if facts.other_batched_inputs:
        return facts.other_inputs_reason or "other per-row inputs would need padding too"
    if not facts.accepts_attention_mask:
        return "the model takes no attention mask"
    if facts.outputs_attentions_or_states:
        return "attentions/hidden states are returned with the padded shapes"
    return None


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
    #: The loop's KV cache: "static" (generate()'s StaticCache, every layer a full-length StaticLayer
    #: on the device, all of one length), "none", or the class name of anything else.
    cache: str = "static"
    use_cache: bool = True
    causal: bool = True  # config.is_causal
    #: Model inputs upstream's ``prepare_inputs_for_generation`` drops after the prefill (pixel values, pre-encoded
    #: features: ``MULTIMODAL_INPUTS_TO_DROP_OUTSIDE_PREFILL``), so no decode step reads them.
    prefill_only: frozenset[str] = frozenset()
    encoder_decoder: bool = False


@dataclass(frozen=True)
class DecodePath:
    device: bool
    reason: str
    #: As :attr:`CallPlan.hint`: set where the loop stays on the host because of the model (its own masks,
    #: attention that is not causal), not because of an option the caller chose.
    hint: str | None = field(default=None, compare=False)


def mask_path(facts: LoopFacts) -> DecodePath:
    """Whether the call's 4D masks are built on the device (``device``) from its 2D mask, sent once.

    Safe when the cache is generate()'s static cache: the 2D mask padded with ones to the cache's
    length is then the same for the whole call (columns past the prompt are ones, as upstream only
    ever appends ones; causality hides the positions not written yet), so the prefill chunks and
    every step share one device tensor and the model builds its masks inside the forward.
    """
    if not facts.use_cache or facts.cache != "static":
        return DecodePath(False, f"not generate()'s static cache (here: {facts.cache})")
    if facts.custom_mask_function:
        return DecodePath(False, "the model builds its own generation masks", MODEL_DOCS)
    if not facts.causal:
        return DecodePath(False, "the model's attention is not causal (unwritten cache positions must stay masked)",
                          MODEL_DOCS)
    return DecodePath(True, "2D mask sent once, 4D masks built on the device")


def decode_path(facts: LoopFacts) -> DecodePath:
    """Device loop (token ids only cross the host link) or host loop (upstream's, logits to the host).

    The device loop feeds one token a step against the call's device mask (:func:`mask_path`): it is
    taken only where that mask is, and never without generate()'s static cache.
    """
    if not facts.device_decode:
        return DecodePath(False, "device decoding disabled")
    if facts.mode not in DEVICE_MODES:
        return DecodePath(False, f"{facts.mode} runs upstream's loop")
    if facts.encoder_decoder:
        return DecodePath(False, "an encoder-decoder model runs upstream's loop (the device loop is for decoders)", MODEL_DOCS)
    masks = mask_path(facts)
    if not masks.device:
        return DecodePath(False, "the device loop needs the call's device mask: " + masks.reason, masks.hint)
    if facts.outputs_scores_or_logits:
        return DecodePath(False, "output_scores/output_logits need the scores on the host")
    if facts.outputs_attentions_or_states:
        return DecodePath(False, "attentions/hidden states are returned every step")
    if facts.synced_gpus:
        return DecodePath(False, "synced_gpus")
    host = sorted(set(facts.processors) - DEVICE_PROCESSORS)
    if host:
        return DecodePath(False, "logits processors that need the host: " + ", ".join(host))
    extra = sorted(set(facts.model_kwargs) - DEVICE_MODEL_KWARGS - _PASSIVE_KWARGS - facts.prefill_only)
    if extra:
        return DecodePath(False, "model inputs the device loop does not carry: " + ", ".join(extra))
    return DecodePath(True, "device")


#: Model kwargs that are plain flags, not per-step tensors.
_PASSIVE_KWARGS = frozenset({"output_attentions", "output_hidden_states", "return_dict"})
