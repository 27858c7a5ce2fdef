"""Generation's decisions on what the device holds and runs (pure: plain data in, plain data out, no torch).

- :func:`kv_cache_choice`: whether the static cache a handled call made is stored in int8
  (``TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE=int8``), from :class:`KVFacts`;
- :func:`tpu_compile_settings`: the ``CompileConfig`` settings the ``tpu`` backend takes;
- :func:`processors_needed`: the generation options whose logits processors need the host (:data:`HOST_OPTIONS`);
- :func:`callback_device`: where a handled call's user callbacks get their tensors.

Both are also importable from :mod:`transformers_tpu_ext.generation.policy`, with the other predicates.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..quantization import kv_format

__all__ = [
    "HOST_OPTIONS",
    "PORTABLE_BACKENDS",
    "QUANTIZED_IS_UPSTREAMS",
    "KVFacts",
    "callback_device",
    "kv_cache_choice",
    "processors_needed",
    "tpu_compile_settings",
]


@dataclass(frozen=True)
class KVFacts:
    """What the glue knows of a static cache generate() just made in a handled call (plain data)."""

    cache: str | None  # cache_choice's kind: "static" (the caller's), "default" (the plugin's), None
    cache_implementation: str | None = None  # the caller's generation option
    layers: tuple[str, ...] = ()  # class names of the cache's layers (after sliding windows became full-length)
    one_length: bool = True  # every layer holds the same number of positions
    offloaded: bool = False
    dtype: str = "float32"  # the model's dtype (torch name without "torch.")


#: Why a caller's ``cache_implementation="quantized"`` stays upstream's (said once on TPU).
QUANTIZED_IS_UPSTREAMS = (
    "cache_implementation='quantized' is upstream's QuantizedCache (dynamic layers: a new program for every "
    "length on a TPU); TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE=int8 is the compiled alternative (int8 static cache)"
)


def kv_cache_choice(facts: KVFacts, setting: str | None) -> tuple[str | None, str]:
    """``("int8", why)`` if the static cache generate() made in a handled call is stored in int8, else
    ``(None, why not)`` (``setting``: ``TPUGenerationConfig.kv_cache``).

    Safe when the cache is one the plugin makes and owns (:func:`cache_choice`'s ``"static"`` or
    ``"default"``), on the device, every layer a full-length ``StaticLayer`` of one length (sliding
    windows already replaced), and the model computes in a float dtype the cache dequantizes to.
    Anything else (a cache passed in, upstream's quantized, dynamic or offloaded caches, other layer
    kinds) keeps its dtype and its class: upstream's.
    """
    if facts.cache_implementation == "quantized":
        return None, QUANTIZED_IS_UPSTREAMS
    if setting != "int8":
        return None, "the int8 KV cache is off (TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE=int8 turns it on)"
    if facts.cache not in ("static", "default"):
        return None, "not a static cache the plugin makes (the caller's cache keeps its dtype)"
    if facts.offloaded:
        return None, "an offloaded static cache"
    if not facts.layers or any(layer != "StaticLayer" for layer in facts.layers):
        other = sorted(set(facts.layers) - {"StaticLayer"}) or ["no layers"]
        return None, "layers that are not full-length StaticLayers: " + ", ".join(other)
    if not facts.one_length:
        return None, "layers of different lengths"
    if facts.dtype not in kv_format.FLOAT_DTYPES:
        return None, f"the model's dtype is {facts.dtype} (the int8 cache dequantizes to a float dtype)"
    return "int8", "int8 keys and values, one float32 scale per position and key-value head"


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


def callback_device(input_device: str | None) -> tuple[str, str]:
    """Where a handled call's user callbacks (logits processors, stopping criteria,
    ``prefix_allowed_tokens_fn``) get their tensors: ``"caller"`` (moved to the device of the call's
    inputs, as upstream hands them: its loop keeps ``input_ids`` where the caller put them) or
    ``"host"`` (they are there already). The plugin's loop keeps the growing tensors on the host; a
    processor that holds a tensor made on ``model.device`` adds it to the scores, and a TPU refuses
    an operation mixing a host and a device tensor."""
    if input_device in (None, "cpu", "meta"):
        return "host", "the call's inputs are on the host: upstream's callbacks get host tensors too"
    return "caller", f"the call's inputs are on {input_device}: callbacks get {input_device} tensors, as upstream gives them"

