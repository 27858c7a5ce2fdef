"""The static KV cache on TPU: one graph per decode step, and the cache the caller gets back.

Glue over ``transformers.cache_utils`` for the generation patch (imported when a call needs it):

- :func:`full_length_layers`: a ``StaticSlidingWindowLayer`` keeps its length as a Python int and
  branches on it, so a compiled decode step is guarded on that int and compiles anew every step
  until the window is full, then on every key/value offset. A full-length ``StaticLayer``, masked to
  the window by the model's sliding-window mask (absolute positions, offset 0), computes the same
  attention with its length held in a tensor: one graph. It holds the whole cache length.
- :func:`attention_heads`: the key-value head count the attention modules use, for a cache
  initialised before the first forward (the config may state it another way: Falcon's
  ``multi_query`` means one key-value head whatever ``num_kv_heads`` says).
- :func:`as_upstream_returns`: what ``return_dict_in_generate=True`` hands back is the cache
  Transformers would have returned (its type, its length, the caller's rows, no padding columns).
- :func:`keep_upstreams_cache_length`: Transformers keeps the longest static cache it made on the
  model (``_previous_max_cache_length``) and sizes later static caches from it. The plugin's own
  caches (its default static cache, its buckets) go to the plugin's own floor instead
  (:data:`FLOOR`), so Transformers' attribute, and every cache sized from it (the one handed back,
  one a call left to upstream makes), stays what it would be without the plugin.
- :func:`int8_layers_if_chosen`: the opt-in int8 KV cache (``policy.kv_cache_choice``): the static
  layers become ``quantization.kv_cache.Int8StaticLayer``s; the cache handed back is dequantized.
- :func:`cache_kind`, :func:`text_layer_types`: the facts the policy reads about a cache and a model.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FLOOR",
    "UNSET",
    "as_upstream_returns",
    "attention_heads",
    "cache_kind",
    "full_length_layers",
    "int8_layers_if_chosen",
    "keep_upstreams_cache_length",
    "layers_replaced",
    "text_layer_types",
]

#: Transformers' attribute: the longest static cache generate() made on the model (it sizes later ones).
PREVIOUS = "_previous_max_cache_length"
#: The plugin's own: the longest static cache a call it handled made on the model.
FLOOR = "_tpu_ext_cache_floor"
#: The model had no ``_previous_max_cache_length`` (Transformers reads it as -1).
UNSET = object()


def upstream_previous(model: Any) -> Any:
    """``model._previous_max_cache_length`` as it is (Transformers' own: restored after each handled call), or :data:`UNSET`."""
    return vars(model).get(PREVIOUS, UNSET)


def keep_upstreams_cache_length(model: Any, upstream_value: Any) -> None:
    """After a handled call: its static cache length goes to the plugin's floor, and Transformers'
    attribute gets ``upstream_value`` back (:data:`UNSET`: none; ``None``: the call made no cache)."""
    if upstream_value is None:
        return
    made = vars(model).get(PREVIOUS)
    if isinstance(made, int) and made > getattr(model, FLOOR, 0):
        setattr(model, FLOOR, made)
    if upstream_value is UNSET:
        vars(model).pop(PREVIOUS, None)
    else:
        setattr(model, PREVIOUS, upstream_value)


def text_layer_types(model: Any) -> tuple[str, ...]:
    """The model's text layer types as Transformers' caches read them (``"full_attention"``,
    ``"sliding_attention"``, ``"linear_attention"``, ``"dummy"``...); ``("unknown",)`` if they cannot be read."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    try:
        layer_types, _ = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    except Exception:  # a config Transformers' caches cannot read: not one the plugin recognises
        return ("unknown",)
    return tuple(str(layer_type) for layer_type in layer_types) or ("unknown",)


def cache_kind(cache: Any) -> str:
    """``"static"`` for generate()'s static cache on the device (a ``StaticCache`` whose every layer is a
    full-length ``StaticLayer`` of one length, or the plugin's int8 one, or Transformers' fixed-shape
    recurrent state of a state-space or hybrid layer (``LinearAttentionLayer``, alone or beside a static
    full-attention layer), not offloaded), ``"none"``, else the cache's class name."""
    if cache is None:
        return "none"
    from transformers.cache_utils import LinearAttentionAndStaticFullAttentionLayer, LinearAttentionLayer, StaticCache, StaticLayer

    from ..quantization import kv_cache

    static_layers = (StaticLayer, kv_cache.Int8StaticLayer, LinearAttentionAndStaticFullAttentionLayer)
    layers = getattr(cache, "layers", None) or []
    attention = [layer for layer in layers if type(layer) in static_layers]  # the rest: recurrent states alone
    if (
        type(cache) is StaticCache
        and not getattr(cache, "offloading", False)
        and layers
        and all(type(layer) in static_layers or type(layer) is LinearAttentionLayer for layer in layers)
        and len({layer.max_cache_len for layer in attention}) <= 1
    ):
        return "static"
    return type(cache).__name__


def full_length_layers(cache: Any, length: int | None) -> None:
    """Replace ``cache``'s sliding-window static layers by full-length ones of ``length`` positions."""
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

    if not isinstance(length, int) or length < 1:
        return
    layers = getattr(cache, "layers", None) or []
    for index, layer in enumerate(layers):
        if type(layer) is not StaticSlidingWindowLayer:
            continue
        full = StaticLayer(max_cache_len=length)
        full._tpu_ext_replaced = True
        if layer.is_initialized:  # initialised early (a chunked prefill): alike, full length
            full.lazy_initialization(layer.keys[:, :, :1], layer.values[:, :, :1])
        layers[index] = full


def int8_layers_if_chosen(model: Any, cache: Any, plan: Any, setting: str | None) -> str | None:
    """Store ``cache`` (generate()'s new static cache in a handled call) in int8 where
    ``policy.kv_cache_choice`` allows it; returns the choice (``"int8"`` or ``None``)."""
    import logging

    from ..quantization import kv_cache
    from . import policy

    layers = getattr(cache, "layers", None) or []
    facts = policy.KVFacts(
        cache="default" if plan.static_cache else "static",
        cache_implementation="static",
        layers=tuple(type(layer).__name__ for layer in layers),
        one_length=len({getattr(layer, "max_cache_len", None) for layer in layers}) == 1,
        offloaded=bool(getattr(cache, "offloading", False)),
        dtype=str(model.dtype).removeprefix("torch."),
    )
    choice, why = policy.kv_cache_choice(facts, setting)
    logging.getLogger("transformers_tpu_ext").debug("transformers-tpu-ext: KV cache %s: %s", choice or "upstream's", why)
    if choice == "int8":
        kv_cache.int8_static_layers(cache)
    return choice


def layers_replaced(cache: Any) -> bool:
    """Whether :func:`full_length_layers` (or :func:`int8_layers_if_chosen`) replaced a layer of ``cache``."""
    return any(getattr(layer, "_tpu_ext_replaced", False) for layer in getattr(cache, "layers", ()))


def as_upstream_returns(model: Any, cache: Any, kind: str, padding: Any, length: int) -> Any:
    """The cache upstream would have returned: its type and length, the caller's rows, no padding.

    Each layer gives the positions it wrote (padding included: its length tensor, read once).
    Sliding-window layers are rebuilt by the new cache's own ``update``, which keeps what upstream's
    would keep. The rebuilding runs on the host: each layer comes over whole (its bucket's shape) and
    the new cache goes back to the layer's device, so the call's real lengths, which shape every
    tensor of the new cache, compile no program on the TPU (a cut and a concatenation per layer on
    the device would be new programs for every prompt length and ``max_new_tokens``).
    """
    import torch
    from transformers.cache_utils import DynamicCache, StaticCache

    text_config = model.config.get_text_config(decoder=True)
    if kind == "static":
        fresh = StaticCache(config=text_config, max_cache_len=length)
    else:
        fresh = DynamicCache(config=text_config)
    cpu = torch.device("cpu")
    devices = []
    for index, layer in enumerate(cache.layers):
        # The int8 cache is handed back dequantized (what its attention read): a plain cache of the model's dtype.
        keys, values = layer.dequantized() if hasattr(layer, "dequantized") else (layer.keys, layer.values)
        devices.append(keys.device)
        rows = padding.real_rows(keys.shape[0])
        written = int(layer.get_seq_length())
        keys, values = keys.to(cpu), values.to(cpu)
        fresh.update(keys[:rows, :, padding.pad : written], values[:rows, :, padding.pad : written], index)
    for layer, device in zip(fresh.layers, devices):  # each layer back where it was (a model split over devices)
        if device.type != "cpu":
            _move_layer(layer, device)
    return fresh


def _move_layer(layer: Any, device: Any) -> None:
    """Move a cache layer built on the host to ``device``: its tensors (keys, values, lengths) and its
    ``device``; a static layer's tensors keep their static address for TorchDynamo."""
    import torch

    static = getattr(layer, "is_compileable", False) and getattr(layer, "is_initialized", False)
    for name, value in list(vars(layer).items()):
        if isinstance(value, torch.Tensor):
            moved = value.to(device)
            if static:
                torch._dynamo.mark_static_address(moved)
            setattr(layer, name, moved)
    if hasattr(layer, "device"):
        layer.device = device


def attention_heads(model: Any) -> tuple[int, int] | None:
    """``(key-value heads, head dim)`` as the model's first attention module states them, or ``None``.

    Read from the attribute the module computes them into: ``num_key_value_heads`` or
    ``num_kv_heads``, else ``num_key_value_groups`` (query heads per key-value head).
    """
    config = model.config.get_text_config(decoder=True)
    # The text decoder's attention (a vision-language model's vision tower comes first, with its own heads).
    try:
        decoder = model.get_decoder()
    except Exception:  # noqa: BLE001 - a model without one: all its modules
        decoder = None
    for module in (decoder if decoder is not None else model).modules():
        head_dim = getattr(module, "head_dim", None)
        if not isinstance(head_dim, int) or isinstance(head_dim, bool):
            continue
        for name in ("num_key_value_heads", "num_kv_heads"):
            heads = getattr(module, name, None)
            if isinstance(heads, int) and heads > 0:
                return heads, head_dim
        groups = getattr(module, "num_key_value_groups", None)
        query_heads = getattr(module, "num_heads", None) or getattr(config, "num_attention_heads", None)
        if isinstance(groups, int) and groups > 0 and isinstance(query_heads, int):
            return query_heads // groups, head_dim
        return None
    return None
