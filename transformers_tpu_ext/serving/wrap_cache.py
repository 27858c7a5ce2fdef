"""The paged cache of a TPU continuous-batching manager (glue of ``patch_continuous_batching``).

One full-attention cache group, sized from the chip's HBM:

- ``PagedAttentionCache.__init__`` / ``group_layers_by_attn_type``: for a manager on the TPU path, one
  full-attention group (sliding windows are applied by the attention's mask); with the int8 KV cache
  (``serving.kv_cache_path``), int8 pages and a parallel float32 scale tensor, whose blocks
  ``CacheAllocator.copy_blocks`` copies with the pages' (a forked request); under tensor parallelism, one
  rank's key-value heads;
- ``PagedAttentionMemoryHandler``: the cache is sized from the chip's HBM (the plan's budget), not host RAM.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

from . import policy as serving
from . import wrap_requests as requests
from .plan import plan_of as _plan_of

__all__ = ["available_memory", "cache_init", "copy_blocks", "group_layers", "infer_sizes"]

logger = logging.getLogger("transformers_tpu_ext")

#: Set while a TPU plan's paged cache is built: its layers make one full-attention group.
_one_group: contextvars.ContextVar[bool] = contextvars.ContextVar("tpu_ext_cb_one_group", default=False)
#: The model's dtype while an int8 paged cache is built (its pages are int8, its activations are not).
_activations: contextvars.ContextVar[Any] = contextvars.ContextVar("tpu_ext_cb_activations", default=None)


def _runtime() -> Any:
    from . import runtime

    return runtime


def cache_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    config = kwargs.get("continuous_batching_config", args[1] if len(args) > 1 else None)
    plan = _plan_of(config)
    if plan is None:
        return wrapped(*args, **kwargs)
    activations = None
    if plan.kv_cache == "int8":  # upstream's allocators lay out int8 pages (bytes per page halve from bf16)
        args, kwargs, activations = _runtime().int8_pages(args, kwargs)
    if plan.kv_head_split is not None:  # one rank's key-value heads, whatever the plan's layout
        args, kwargs = _runtime().local_kv_heads(args, kwargs, plan.kv_head_split)
    tokens = _one_group.set(True), _activations.set(activations)
    try:
        result = wrapped(*args, **kwargs)
    finally:
        _one_group.reset(tokens[0])
        _activations.reset(tokens[1])
    if activations is not None:  # int8 scales: per layer and key-value head on the kernel path, else per position
        _runtime().add_int8_scales(instance, per_head=plan.attention == "ragged")
    requests.mark_cache(instance, plan)
    return result


def copy_blocks(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    _runtime().copy_int8_scales(instance, *args, **kwargs)  # an int8 paged cache's scales go with its blocks
    return result


def group_layers(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    groups = wrapped(*args, **kwargs)
    if not _one_group.get() or len(groups) == 1 and "full_attention" in groups:
        return groups
    # Sliding-window layers keep their whole history: the attention applies the window by mask.
    return {"full_attention": sorted(layer for layers in groups.values() for layer in layers)}


def available_memory(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    plan = _plan_of(instance.cb_config)
    return wrapped(*args, **kwargs) if plan is None else plan.budget


def infer_sizes(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    plan = _plan_of(instance.cb_config)
    if plan is None:
        return wrapped(*args, **kwargs)
    from transformers.generation.continuous_batching.utils import find_head_dim

    if _activations.get() is not None:  # int8 pages; activations (and their working memory) in the model's dtype
        instance.activation_dtype = _activations.get()
    if plan.attention == "ragged":  # what the present path would need, should the kernel fail later (wrap_fallback)
        plan.attention = "paged"
        try:
            plan.present_step_bytes = _step_bytes(instance, plan)
        finally:
            plan.attention = "ragged"
    plan.cache = serving.cache_plan(
        plan.budget,
        serving.kv_bytes_per_sector(instance.bytes_per_sector, find_head_dim(instance.config), plan.kv_cache),
        _step_bytes(instance, plan),
        requested_sectors=instance.num_sectors_from_config(),
    )
    logger.info("transformers-tpu-ext: TPU paged cache %s", plan.cache)
    return plan.max_batch_tokens, plan.cache.num_sectors


def _step_bytes(handler: Any, plan: serving.ServingPlan) -> int:
    from transformers.generation.continuous_batching.utils import find_head_dim

    # under TP, upstream's handler divides the heads by the cache's split, not by what a rank computes
    heads, kv_heads = plan.local_heads or (handler.num_attention_heads, handler.num_key_value_heads)
    head_dim, config = find_head_dim(handler.config), handler.config
    if getattr(config, "kv_lora_rank", None) is not None:  # MLA: the latents read are expanded to every head
        kv_heads, head_dim = heads, -(-(config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim) // 2)
    return serving.step_bytes(
        plan,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        itemsize=handler.activation_dtype.itemsize,
        vocab_size=handler.config.vocab_size,
        activation_bytes_per_token=handler.bytes_per_batch_token,
    )
