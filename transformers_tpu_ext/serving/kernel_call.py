"""The JAX function the serving step registers with ``torch.tpu.pallas.jax_op``: JAX's ragged paged
attention kernel behind a fully annotated signature (imported only on the kernel path: it imports JAX).

torch_tpu 0.2.0's ``jax_op`` reads the function's annotations (``inspect.signature(..., eval_str=True)``):
every parameter annotated, a valid return annotation, tensors as ``jax.Array`` and the rest as POD
types, which it makes static arguments of the op's schema. JAX's own kernel carries no return
annotation and is refused ("The return annotation is invalid"): :func:`make` wraps it (JAX imported at
the module's top: torch_tpu evaluates the annotations against this module's globals).

What the wrapper adds around the kernel (``serving.kernel_path``, plain data):

- **explicit block sizes** for the chip generation the plugin knows (torch_tpu's), from JAX's own tuned
  table (``tuned_block_sizes.TUNED_BLOCK_SIZES``), computed when the step is traced: left to itself,
  the kernel asks ``jax.devices()`` for the TPU version, and inside torch_tpu's process JAX sees no TPU
  ("TPU version must be 4 or higher");
- **lane packing** for head sizes that divide 128 (64, 32): the kernel takes multiples of 128; the
  cache keeps ``128 // head_dim`` key-value heads side by side in one 128-lane row (no padding, no
  extra byte), each query head's values placed in its head's lanes and zeros elsewhere, so the kernel's
  dot product over 128 lanes is the head's own; the output keeps the head's lanes;
- **int8 pages**: ``k_scale = v_scale = 1.0`` (the kernel converts the int8 values to the query's
  dtype); the per-head scales are applied outside (``serving.ragged``).
"""

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import ragged_paged_attention as rpa

from . import kernel_path


def make(variant: kernel_path.KernelVariant):  # noqa: ANN201 - returns the annotated JAX function
    """The annotated JAX function of one kernel variant (static: sliding window, soft cap, scale)."""
    packing = variant.lanes

    def ragged_paged_attention(
        q: jax.Array,  # [tokens, heads, head_dim]
        kv_pages: jax.Array,  # [pages, page_size, 2 * kv_heads / packing, packing * head_dim]
        kv_lens: jax.Array,  # i32[S]
        page_indices: jax.Array,  # i32[S, pages per sequence]
        cu_q_lens: jax.Array,  # i32[S + 1]
        num_seqs: jax.Array,  # i32[1]
        *,
        sm_scale: float = 1.0,
        sliding_window: int | None = None,
        soft_cap: float | None = None,
    ) -> jax.Array:
        tokens, heads, head_dim = q.shape
        lanes = kv_pages.shape[3]
        slots = None
        if packing > 1:  # each query head in its key-value head's lanes
            kv_heads = kv_pages.shape[2] // 2 * packing
            slot = (jnp.arange(heads) // (heads // kv_heads)) % packing
            slots = jax.nn.one_hot(slot, packing, dtype=q.dtype)  # [heads, packing]
            q = (q[:, :, None, :] * slots[None, :, :, None]).reshape(tokens, heads, lanes)
        heads_per_blk, kv_heads_per_blk = rpa.kernel.get_min_heads_per_blk(
            heads, kv_pages.shape[2], q.dtype, kv_pages.dtype
        )
        pages_per_blk, queries_per_blk = kernel_path.block_sizes(
            variant.generation,
            rpa.tuned_block_sizes.TUNED_BLOCK_SIZES,
            (jnp.dtype(q.dtype).name, jnp.dtype(kv_pages.dtype).name, heads_per_blk, kv_heads_per_blk // 2, lanes,
             kv_pages.shape[1], tokens, page_indices.shape[1]),
        )
        scale = 1.0 if variant.int8 else None
        out = rpa.ragged_paged_attention(
            q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
            sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap, k_scale=scale, v_scale=scale,
            num_kv_pages_per_block=pages_per_blk, num_queries_per_block=queries_per_blk,
        )
        if slots is not None:  # the head's own lanes
            out = (out.reshape(tokens, heads, packing, head_dim) * slots[None, :, :, None]).sum(axis=2)
        return out.astype(q.dtype)

    ragged_paged_attention.__qualname__ = ragged_paged_attention.__name__ = f"ragged_paged_attention_{variant.key}"
    return ragged_paged_attention
