"""The pieces continuous batching runs with on TPU (used by ``patch_continuous_batching``).

- :func:`.step_io.io_class` -> ``TPUBatchIO`` (in :mod:`.step_io`): builds each step's inputs padded to a
  ``(Q, S)`` bucket (:func:`transformers_tpu_ext.serving.policy.step_shape`), in one host-to-device copy, with no stream.
- :func:`paged_cache_class` -> ``TPUPagedCache``: what the model sees as its cache during a step.
  ``update`` writes the new keys/values at their slots and returns, for every scheduled token, the
  pages of its request read through a fixed-width block table: ``[Q, max_len, kv_heads, head_dim]``
  (multi-head latent attention: each request's latents, :func:`latent_update`).
  The KV length is data (positions), never a shape. Traceable, so the whole step is one graph.
- :func:`paged_attention`: each token attends to its request's pages up to its own position (and
  within a sliding window if the layer has one, with the layer's learned sinks if it has them: gpt-oss).
  It is never registered alone: a manager's model gets :func:`dispatching_attention`
  (``"tpu_paged|sdpa"``, ``"tpu_paged|eager"``), which runs it inside the manager's steps and the
  model's own attention everywhere else.

Nothing here is imported before Transformers is: the classes are built on first use.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from typing import Any

from . import ragged

logger = logging.getLogger("transformers_tpu_ext")

ATTENTION_NAME = "tpu_paged"


def attention_name(original: str) -> str:
    """The name registered for a manager's model whose attention was ``original`` (``tpu_paged|sdpa``...)."""
    return f"{ATTENTION_NAME}|{original}"


@functools.cache
def dispatching_attention(original: str) -> Any:
    """The paged attention inside the manager's steps (their kwargs carry ``tpu_positions``), the
    ``original`` implementation (``"sdpa"`` or ``"eager"``) everywhere else.

    So a forward outside the manager (``generate()``, a plain call, a ``pause()`` block, another route
    of ``transformers serve``) computes what it computed before, with the masks it had (the same name
    is registered with ``original``'s mask function). The choice is made per call, from the call's
    own kwargs: safe with the manager's thread running next to the caller's, and resolved when a
    step is traced (the manager's graphs are unchanged). A plain function: it runs inside them.
    """
    import sys

    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any, **kwargs: Any) -> Any:
        if "tpu_kv_lens" in kwargs:  # the kernel path (serving.ragged)
            return ragged.attention(module, query, key, value, attention_mask, *args, **kwargs)
        if "tpu_positions" in kwargs:
            return paged_attention(module, query, key, value, attention_mask, *args, **kwargs)
        if original == "eager":  # the model file's own (soft-capping, dropout... as the model has them)
            fallback = sys.modules[type(module).__module__].eager_attention_forward
        else:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            fallback = ALL_ATTENTION_FUNCTIONS[original]
        return fallback(module, query, key, value, attention_mask, *args, **kwargs)

    attention.__name__ = attention.__qualname__ = f"tpu_paged_or_{original}"
    return attention


def paged_attention(
    module: Any,
    query: Any,  # [1, heads, Q, head_dim]
    key: Any,  # [Q, K, kv_heads, head_dim]: each token's pages, from TPUPagedCache.update
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    import torch

    positions = kwargs["tpu_positions"].long()  # [Q]
    if getattr(module, "kv_lora_rank", None) is not None:  # MLA: [S, heads, K, d], each request's expanded latents
        seq = kwargs["tpu_token_seq"].long()
        key, value = key[seq].transpose(1, 2), value[seq].transpose(1, 2)  # each token's: [Q, K, heads, d]
    tokens, heads, head_dim = query.shape[2], query.shape[1], query.shape[3]
    kv_heads, length = key.shape[2], key.shape[1]
    groups = heads // kv_heads
    if scaling is None:
        scaling = head_dim**-0.5
    # Grouped-query attention without repeating the keys: [Q, kv_heads, groups, head_dim].
    q = query[0].transpose(0, 1).reshape(tokens, kv_heads, groups, head_dim)
    k = key.permute(0, 2, 3, 1)  # [Q, kv_heads, head_dim, K]
    v = value.transpose(1, 2)  # [Q, kv_heads, K, head_dim]
    scores = torch.matmul(q, k) * scaling  # [Q, kv_heads, groups, K]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    key_positions = torch.arange(length, device=query.device)
    visible = key_positions[None, :] <= positions[:, None]
    if sliding_window is not None:
        visible = visible & (key_positions[None, :] > positions[:, None] - sliding_window)
    scores = scores.masked_fill(~visible[:, None, None, :], torch.finfo(scores.dtype).min)
    sinks = kwargs.get("s_aux")
    if sinks is not None:  # learned attention sinks (gpt-oss): one more logit per head, dropped after the softmax
        sink = sinks.reshape(1, kv_heads, groups, 1).expand(tokens, -1, -1, -1).to(scores.dtype)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1).float(), dim=-1)[..., :-1].to(v.dtype)
    else:
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    out = torch.matmul(probs, v)  # [Q, kv_heads, groups, value head_dim]
    return out.reshape(1, tokens, heads, value.shape[-1]), None


@functools.cache
def paged_cache_class() -> type:
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    class TPUPagedCache(PagedAttentionCache):
        """The model's view of the paged cache during a TPU step (wraps the real one, shares its memory).

        A subclass only so that Transformers' mask code recognises a continuous-batching cache and
        builds no mask; it does not run ``PagedAttentionCache.__init__``.
        """

        def __init__(self, cache: Any, attention: str = "paged") -> None:  # noqa: D107 - see class docstring
            (allocator,) = cache.cache_allocators.values()
            self.paged = cache
            self.allocator = allocator
            self.page_size = allocator.tokens_per_page
            self.kernel_pages, self.kernel_rows = ragged.kernel_views(allocator) if attention == "ragged" else (None, None)
            self.kernel_scales = getattr(allocator, "_tpu_ext_kv_head_scales", None)  # int8 kernel pages

        def update(self, key_states: Any, value_states: Any, layer_idx: int, kwargs: Any = None) -> tuple[Any, Any]:
            import torch

            if "tpu_page_base" in kwargs:  # the kernel path: pages in the kernel's layout (serving.ragged)
                return ragged.update(self, key_states, value_states, layer_idx, kwargs)
            write = kwargs["tpu_write_slots"].long()
            latents = getattr(self.allocator, "_latent_token_views", None)
            if latents is not None:  # multi-head latent attention (Transformers' MLACacheAllocator)
                return latent_update(self, latents[layer_idx], write, key_states, value_states, kwargs)
            keys, values = self.allocator._kv_token_views[layer_idx]  # [slots, kv_heads, head_dim]
            # Each token's pages: its request's row of the block table (first slot of each page),
            # plus the offsets inside a page. [Q, blocks * page_size]
            bases = kwargs["tpu_block_base"][kwargs["tpu_token_seq"].long()].long()
            offsets = torch.arange(self.page_size, device=bases.device)
            slots = (bases[:, :, None] + offsets).reshape(bases.shape[0], -1)
            scales = getattr(self.allocator, "_tpu_ext_kv_scales", None)
            if scales is not None:  # int8 pages: quantized on write, dequantized on gather
                from ..quantization import kv_cache

                first = 2 * self.allocator.layer_indices.index(layer_idx) * self.page_size  # where the views start
                return kv_cache.paged_update(
                    keys, values, scales, (first, first + self.page_size), write, slots, key_states, value_states
                )
            keys.index_copy_(0, write, key_states[0].transpose(0, 1).to(keys.dtype))
            values.index_copy_(0, write, value_states[0].transpose(0, 1).to(values.dtype))
            return keys[slots], values[slots]

    return TPUPagedCache


def latent_update(cache: Any, views: tuple[Any, Any], write: Any, kv_latent: Any, rotated_key: Any, kwargs: Any) -> tuple[Any, Any]:
    """A step's write and read of multi-head latent attention's cache: the new tokens' two latents (the
    compressed KV ``[1, 1, Q, kv_lora_rank]`` and the rotated key ``[1, 1, Q, qk_rope_head_dim]``) written at
    their slots, then each *request*'s latents read through its block-table row: ``[S, 1, max_len, ...]``,
    which the model expands to heads once per request (``expand_kv``); :func:`paged_attention` gives each
    token its request's row."""
    import torch

    latent_cache, rotated_cache = views  # [slots, kv_lora_rank], [slots, qk_rope_head_dim]: one row per token
    latent_cache.index_copy_(0, write, kv_latent.reshape(-1, latent_cache.shape[-1]).to(latent_cache.dtype))
    rotated_cache.index_copy_(0, write, rotated_key.reshape(-1, rotated_cache.shape[-1]).to(rotated_cache.dtype))
    bases = kwargs["tpu_block_base"].long()  # [S, blocks]: each request's block table, as first slots
    offsets = torch.arange(cache.page_size, device=bases.device)
    slots = (bases[:, :, None] + offsets).reshape(bases.shape[0], -1)  # [S, max_len]
    return latent_cache[slots].unsqueeze(1), rotated_cache[slots].unsqueeze(1)


def latent_kv_bytes(plan: Any, allocator: Any, kv_lens: list[int], padded_requests: int) -> tuple[int, int, int]:
    """One step's cache bytes per layer for multi-head latent attention (``step_io``'s statistics): what
    :func:`latent_update` reads (``max_len`` rows for every padded request), what the requests hold, and what a
    kernel reading only their pages would."""
    from . import kernel_path

    per_token = allocator.row_numel * allocator.cache_dtype.itemsize  # both latents of a token: one row
    max_len = plan.blocks_per_request * allocator.tokens_per_page
    return (
        kernel_path.gathered_kv_bytes(padded_requests, max_len, per_token),
        kernel_path.held_kv_bytes(kv_lens, per_token),
        kernel_path.kernel_kv_bytes(kv_lens, allocator.tokens_per_page, per_token),
    )


def int8_pages(args: tuple, kwargs: dict) -> tuple[tuple, dict, Any]:
    """``PagedAttentionCache(*args, **kwargs)``'s arguments with an int8 cache dtype, and the dtype it had
    (the model's: the activations keep it)."""
    import torch

    if len(args) > 4:
        return (*args[:4], torch.int8, *args[5:]), kwargs, args[4]
    return args, {**kwargs, "dtype": torch.int8}, kwargs.get("dtype", torch.float16)


class _LocalKVHeads:
    """Upstream's ``DistributedHelper`` as ``PagedAttentionCache.__init__`` should see it: the key-value
    heads divided by ``split`` (``serving.tensor_parallel.kv_split``), not by ``tp_size``; every
    collective is the helper's own."""

    def __init__(self, helper: Any, split: int) -> None:
        self._helper, self._split = helper, split

    def __getattr__(self, name: str) -> Any:
        return getattr(self._helper, name)

    @property
    def tp_size(self) -> int:  # read by the cache for the head division (when split > 1) and the size sync
        return self._split if self._split > 1 else self._helper.tp_size

    def are_kv_heads_tp_ed(self) -> bool:
        return self._split > 1


def local_kv_heads(args: tuple, kwargs: dict, split: int) -> tuple[tuple, dict]:
    """``PagedAttentionCache(*args, **kwargs)``'s arguments with a distributed helper that gives one rank's
    key-value heads (``split``: what the model's are divided by)."""
    if "distributed_helper" in kwargs:
        return args, {**kwargs, "distributed_helper": _LocalKVHeads(kwargs["distributed_helper"], split)}
    return (*args[:3], _LocalKVHeads(args[3], split), *args[4:]), kwargs


def add_int8_scales(cache: Any, per_head: bool = False) -> None:
    """Give each allocator of an int8 paged ``cache`` its float32 scales: per position and key-value head
    (``quantization.kv_cache``), or, for the kernel (``per_head``), per layer and key-value head (``ragged``)."""
    from ..quantization import kv_cache

    for allocator in cache.cache_allocators.values():
        if per_head:
            allocator._tpu_ext_kv_head_scales = ragged.head_scales(allocator)
        else:
            allocator._tpu_ext_kv_scales = kv_cache.paged_scales(allocator)


def copy_int8_scales(allocator: Any, source_block_ids: list[int], dest_block_ids: list[int]) -> None:
    """After ``allocator.copy_blocks``: the same blocks' scales, for an int8 paged cache (else nothing)."""
    scales = getattr(allocator, "_tpu_ext_kv_scales", None)
    if scales is not None and source_block_ids:
        from ..quantization import kv_cache

        kv_cache.copy_scale_blocks(allocator, scales, source_block_ids, dest_block_ids)


def warmup(runner: Any, model: Any) -> None:
    """Run one step of every ``(Q, S)`` shape of the runner's plan (each compiles its graph), with a progress bar."""
    import torch

    from ..core.progress import Progress

    io = runner.inputs_and_outputs
    shapes = io.plan.shapes
    start = time.perf_counter()
    runner._tpu_ext_warming_up = True
    try:
        for _ in range(2):  # again if the kernel failed on the way (wrap_fallback): the present path's programs
            attention = io.plan.attention
            with torch.no_grad(), Progress(len(shapes), desc="transformers-tpu-ext: precompiling serving steps", unit="shape") as bar:
                for q, s in shapes:
                    io.prepare_warmup_batch(q, s)
                    runner.compute_batch(model, io.get_model_kwargs(use_padding=True))
                    bar.step(f"compiled tokens={q} requests={s}")
            if io.plan.attention == attention:
                break
    finally:
        runner._tpu_ext_warming_up = False
    io.reset()
    scales = getattr(io.allocator, "_tpu_ext_kv_head_scales", None)
    if scales is not None:  # the warm-up's dummy tokens set no scale: the first real step does
        scales.zero_()
    logger.info(
        "transformers-tpu-ext: compiled %d continuous batching step shapes in %.1fs", len(shapes), time.perf_counter() - start
    )


def tpu_compile_config(config: Any) -> Any:
    """The user's CompileConfig made TPU-safe (backend ``tpu``, no mode, static shapes), or the default one."""
    from transformers import CompileConfig

    if config is None:
        return CompileConfig(backend="tpu", mode="default", fullgraph=False, dynamic=False)
    adapted = copy.copy(config)
    changes = []
    if isinstance(config.backend, str) and config.backend not in ("tpu", "eager", "aot_eager"):
        changes.append(f"backend={config.backend!r} -> 'tpu'")
        adapted.backend, adapted.options = "tpu", None
    if config.mode not in (None, "default"):
        changes.append(f"mode={config.mode!r} dropped")
        adapted.mode = "default"
    if config.dynamic is not False:
        changes.append("dynamic=False")
        adapted.dynamic = False
    if changes:
        from .. import log

        log.warn(
            "transformers-tpu-ext: the continuous batching CompileConfig cannot run on TPU; adapted it ("
            + ", ".join(changes)
            + ")",
            stacklevel=2,
        )
    return adapted
