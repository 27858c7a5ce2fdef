"""The int8 KV cache on TPU: int8 keys and values, one float32 scale per position and key-value head.

Opt-in (``TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE=int8`` for ``generate()``,
``TRANSFORMERS_TPU_EXT_SERVE_KV_CACHE=int8`` for continuous batching); which caches take it is decided
by ``generation.policy.kv_cache_choice`` and ``serving.policy.kv_cache_path``. The torch pieces:

- :func:`quantize` / :func:`dequantize`: symmetric absmax/127 over the head dimension, one float32
  scale per (position, key-value head). A new position never rescales an old one (the cache stays
  appendable), and no calibration is needed. torch_tpu 0.2.0 has no int8 matmul: the cache is
  dequantized inside the compiled step, so HBM holds, and a decode step reads, ``head_dim + 4``
  bytes per position and head instead of ``2 x head_dim`` (bf16): 0.53x at head_dim 64, 0.52x at 128.
- :class:`Int8StaticLayer` (built by :func:`int8_static_layers`): a full-length ``StaticLayer`` holding
  int8 data and scales, written with ``index_copy_`` at a position held in a tensor (one graph per
  decode step, as ``StaticLayer``), returning the whole cache dequantized to the model's dtype.
- :func:`paged_scales`, :func:`paged_update`, :func:`copy_scale_blocks`: the paged cache of continuous
  batching: int8 pages (upstream's allocator over an int8 cache tensor) plus a parallel float32 scale
  tensor with one row per row of the allocator's flattened ``[tokens x 2, kv_heads, head_dim]`` view,
  so the same slot indices address both, and block copies (forks) copy both.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FLOAT_DTYPES",
    "FORMATS",
    "QMAX",
    "SCALE_BYTES",
    "Int8StaticLayer",
    "copy_scale_blocks",
    "dequantize",
    "int8_static_layers",
    "paged_scales",
    "paged_update",
    "quantize",
]

from .kv_format import FLOAT_DTYPES, FORMATS, QMAX, SCALE_BYTES  # the constants the decisions read

_TINY = 1e-8  # the scale of an all-zero vector (its values quantize to 0 whatever it is)


def quantize(states: Any) -> tuple[Any, Any]:
    """``states [..., head_dim]`` -> (int8 ``[..., head_dim]``, float32 scales ``[..., 1]``), ``states ~= q * scale``."""
    import torch

    states = states.float()
    scale = states.abs().amax(dim=-1, keepdim=True).clamp(min=_TINY) / QMAX
    return torch.round(states / scale).clamp(-QMAX, QMAX).to(torch.int8), scale


def dequantize(data: Any, scale: Any, dtype: Any) -> Any:
    """int8 ``data`` times its float32 ``scale`` (broadcast over the head dimension), in ``dtype``."""
    return (data.float() * scale).to(dtype)


def _layer_class() -> type:
    from transformers.cache_utils import StaticLayer
    from transformers.utils import is_torchdynamo_compiling

    class Int8StaticLayer(StaticLayer):
        """A full-length static layer holding int8 keys/values and float32 scales ``[B, H, L, 1]``.

        ``keys``/``values`` are the int8 tensors (what HBM holds); :meth:`update` returns the whole
        cache dequantized to the model's dtype, :meth:`dequantized` the same outside a step.
        """

        _layer_type = None  # never registered in Transformers' layer mappings (an inherited type would be)
        is_compileable = True

        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
            import torch

            # StaticLayer's attributes, without its model-dtype tensors (never allocated here).
            self.device, self.dtype = key_states.device, key_states.dtype
            self.batch_size, self.num_heads = key_states.shape[:2]
            self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
            self.cumulative_length = self.cumulative_length.to(self.device)
            shape = (self.batch_size, self.num_heads, self.max_cache_len)
            self.keys = torch.zeros(*shape, self.k_head_dim, dtype=torch.int8, device=self.device)
            self.values = torch.zeros(*shape, self.v_head_dim, dtype=torch.int8, device=self.device)
            self.key_scales = torch.zeros(*shape, 1, dtype=torch.float32, device=self.device)
            self.value_scales = torch.zeros(*shape, 1, dtype=torch.float32, device=self.device)
            if not is_torchdynamo_compiling():
                for tensor in (self.keys, self.values, self.key_scales, self.value_scales, self.cumulative_length):
                    torch._dynamo.mark_static_address(tensor)
            self.is_initialized = True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            import torch

            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            positions = torch.arange(key_states.shape[-2], device=self.device) + self.cumulative_length
            self.cumulative_length.add_(key_states.shape[-2])
            for data, scales, states in ((self.keys, self.key_scales, key_states), (self.values, self.value_scales, value_states)):
                q, scale = quantize(states)
                data.index_copy_(2, positions, q)
                scales.index_copy_(2, positions, scale)
            return self.dequantized()

        def dequantized(self) -> tuple[Any, Any]:
            """The whole cache (every position, written or not) in the model's dtype."""
            return (dequantize(self.keys, self.key_scales, self.dtype), dequantize(self.values, self.value_scales, self.dtype))

        def reset(self) -> None:
            super().reset()
            if self.is_initialized:
                self.key_scales.zero_()
                self.value_scales.zero_()

        def reorder_cache(self, beam_idx: Any) -> None:
            if self.get_seq_length() > 0:
                index = beam_idx.to(self.keys.device)
                for name in ("keys", "values", "key_scales", "value_scales"):
                    setattr(self, name, getattr(self, name).index_select(0, index))

        def nbytes(self) -> int:
            """Bytes the layer holds (int8 data and float32 scales of keys and values)."""
            tensors = (self.keys, self.values, self.key_scales, self.value_scales) if self.is_initialized else ()
            return sum(t.numel() * t.element_size() for t in tensors)

    return Int8StaticLayer


_CLASS: list[type] = []


def __getattr__(name: str) -> Any:
    if name == "Int8StaticLayer":  # built on first use: nothing here imports Transformers before it is needed
        if not _CLASS:
            _CLASS.append(_layer_class())
        return _CLASS[0]
    raise AttributeError(name)


def int8_static_layers(cache: Any) -> None:
    """Replace ``cache``'s ``StaticLayer``s by :class:`Int8StaticLayer`s of the same length (initialised
    alike when they were: a cache initialised early for a compiled prefill)."""
    from transformers.cache_utils import StaticLayer

    layer_class = __getattr__("Int8StaticLayer")
    layers = cache.layers
    for index, layer in enumerate(layers):
        if type(layer) is not StaticLayer:
            continue
        int8 = layer_class(max_cache_len=layer.max_cache_len)
        int8._tpu_ext_replaced = True
        if layer.is_initialized:
            int8.lazy_initialization(layer.keys[:, :, :1], layer.values[:, :, :1])
        layers[index] = int8


# -------------------------------------------------------------------------------------------------
# The paged cache (continuous batching)


def paged_scales(allocator: Any) -> Any:
    """A float32 scale tensor ``[rows, kv_heads]`` parallel to the allocator's flattened token view
    (``[tokens x 2, kv_heads, head_dim]`` int8), zero (a never-written slot dequantizes to 0)."""
    import torch

    rows = allocator.cache_tensor.shape[0] * allocator.cache_tensor.shape[1]
    scales = torch.zeros(rows, allocator.num_key_value_heads, dtype=torch.float32, device=allocator.cache_tensor.device)
    torch._dynamo.mark_static_address(scales)
    return scales


def paged_update(keys: Any, values: Any, scales: Any, layer_offsets: tuple[int, int], write: Any, slots: Any,
                 key_states: Any, value_states: Any) -> tuple[Any, Any]:
    """Quantize the step's new ``key_states``/``value_states`` (``[1, kv_heads, Q, head_dim]``) into the
    int8 views ``keys``/``values`` and their scale rows at ``write``; return the pages at ``slots``
    (``[Q, K]``) dequantized to the states' dtype. ``layer_offsets``: where the layer's key and value
    rows start in ``scales`` (the allocator's views start there too)."""
    out = []
    for data, offset, states in ((keys, layer_offsets[0], key_states), (values, layer_offsets[1], value_states)):
        layer_scales = scales[offset:]
        q, scale = quantize(states[0].transpose(0, 1))  # [Q, kv_heads, head_dim], [Q, kv_heads, 1]
        data.index_copy_(0, write, q)
        layer_scales.index_copy_(0, write, scale[..., 0])
        out.append(dequantize(data[slots], layer_scales[slots][..., None], states.dtype))
    return out[0], out[1]


def copy_scale_blocks(allocator: Any, scales: Any, source_block_ids: list[int], dest_block_ids: list[int]) -> None:
    """Copy the scales of whole blocks as ``copy_blocks`` copies their bytes (a forked request's pages)."""
    import torch

    per_block = scales.view(-1, allocator.block_physical_stride * scales.shape[1])
    source = torch.tensor(source_block_ids, device=scales.device, dtype=torch.long)
    dest = torch.tensor(dest_block_ids, device=scales.device, dtype=torch.long)
    per_block.index_copy_(0, dest, per_block.index_select(0, source))
