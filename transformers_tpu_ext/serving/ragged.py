"""The kernel path of TPU serving: JAX's ragged paged attention through ``torch.tpu.pallas.jax_op``.

Used by ``runtime`` (step inputs, the cache's ``update``, the attention) when the manager's plan says
``attention == "ragged"`` (``kernel_path.attention_path``, decided by ``patch_continuous_batching``).

**The page layout, without a copy.** Transformers' full-attention allocator keeps, for a block of
``L`` layers, ``L`` pages of ``page_size`` tokens, each page the layer's keys then its values
(``[2, page_size, kv_heads, head_dim]``). The kernel takes pages ``[page_size, 2 * kv_heads,
head_dim]`` with keys and values interleaved per head (``0::2`` keys, ``1::2`` values). Both are
``2 * page_size * kv_heads * head_dim`` elements per layer and page, and only the TPU step writes and
reads inside a page (upstream copies whole blocks, bytewise, when it forks a request): so on the kernel
path the step writes each page in the kernel's layout, and the cache tensor viewed as
``[pages, page_size, 2 * kv_heads, head_dim]`` *is* the kernel's ``kv_pages`` (no conversion, no
copy). Layer ``i`` of block ``b`` is page ``b * L + i``: the page table is the block table times
``L``, plus ``i`` per layer.
"""

from __future__ import annotations

import functools
import itertools
import logging
from typing import Any

from . import kernel_path

logger = logging.getLogger("transformers_tpu_ext")

_ops: dict[tuple, str] = {}
_names = itertools.count()


def kernel_facts(
    model: Any,
    setting: str,
    kv_cache: str | None,
    attention_sinks: bool,
    probe_jax: bool = True,
    local_heads: tuple[int, int] | None = None,
) -> kernel_path.KernelFacts:
    """The facts :func:`kernel_path.attention_path` decides on, read off the model and the installed JAX
    (``probe_jax=False``: JAX and torch_tpu as if they had the kernel, JAX not imported; ``local_heads``:
    the query and key-value heads of one rank under tensor parallelism, ``serving.tensor_parallel``)."""
    import importlib
    import inspect

    import torch
    from transformers.generation.continuous_batching.utils import find_head_dim

    jax_version, args = (None, ()) if probe_jax else ("any", (*kernel_path.KERNEL_ARGS, *kernel_path.KERNEL_KEYWORDS))
    if setting != "paged" and probe_jax:
        try:
            import jax

            jax_version = jax.__version__
            module = importlib.import_module(kernel_path.KERNEL)
            args = tuple(inspect.signature(module.ragged_paged_attention).parameters)
        except ImportError:
            pass
        except Exception as error:  # a JAX that imports but whose kernel does not: the present path
            logger.debug("transformers-tpu-ext: the ragged paged attention kernel does not load: %s", error)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    if local_heads is not None:
        heads, kv_heads = local_heads
    pallas = getattr(getattr(torch, "tpu", None), "pallas", None)
    return kernel_path.KernelFacts(
        setting=setting,
        jax=jax_version,
        kernel_args=args,
        jax_op=callable(getattr(pallas, "jax_op", None)) or not probe_jax,
        head_dim=int(find_head_dim(config)),
        heads=heads,
        kv_heads=kv_heads,
        dtype=str(model.dtype).removeprefix("torch."),
        attention_sinks=attention_sinks,
        kv_cache=kv_cache,
    )


def kernel_op(sm_scale: float, sliding_window: int | None, soft_cap: float | None) -> Any:
    """The custom op running the kernel with these static arguments (made once per combination)."""
    import torch

    return getattr(torch.ops.transformers_tpu_ext, _traced_op_name[0](sm_scale, sliding_window, soft_cap))


def _op_name(sm_scale: float, sliding_window: int | None, soft_cap: float | None) -> str:
    """The op's name in ``torch.ops.transformers_tpu_ext``, registered on first use: run as Python when
    a step is traced (``assume_constant_result``), so that the registration is no part of the graph."""
    key = (sm_scale, sliding_window, soft_cap)
    name = _ops.get(key)
    if name is None:
        import torch
        from jax.experimental.pallas.ops.tpu import ragged_paged_attention as kernel

        fn = functools.partial(
            kernel.ragged_paged_attention, sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap
        )
        name = f"ragged_paged_attention_{next(_names)}"
        op = torch.tpu.pallas.jax_op(f"transformers_tpu_ext::{name}", fn)
        op.register_fake(lambda q, *rest: torch.empty_like(q))  # the kernel's output: q's shape and dtype
        _ops[key] = name
    return name


_traced_op_name: list[Any] = []  # _op_name as TorchDynamo runs it (made outside any trace, by choose())


def _prepare() -> None:
    if not _traced_op_name:
        import torch._dynamo

        _traced_op_name.append(torch._dynamo.assume_constant_result(_op_name))


def attention(
    module: Any,
    query: Any,  # [1, heads, Q, head_dim]
    key: Any,  # the cache's pages [pages, page_size, 2 * kv_heads, head_dim] (from update)
    value: Any,  # this layer's page table [S, pages per request] (from update)
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    tokens, heads, head_dim = query.shape[2], query.shape[1], query.shape[3]
    op = kernel_op(
        float(head_dim**-0.5 if scaling is None else scaling),
        int(sliding_window) if sliding_window else None,
        float(softcap) if softcap else None,
    )
    q = query[0].transpose(0, 1).contiguous().to(key.dtype)  # [Q, heads, head_dim]
    out = op(q, key, kwargs["tpu_kv_lens"], value, kwargs["tpu_cu_q_lens"], kwargs["tpu_num_seqs"])
    return out.to(query.dtype).reshape(1, tokens, heads, head_dim), None


def update(cache: Any, key_states: Any, value_states: Any, layer_idx: int, kwargs: Any) -> tuple[Any, Any]:
    """Write the step's keys and values in the kernel's layout; return the pages and the layer's page table."""
    import torch

    allocator, page = cache.allocator, cache.page_size
    layer = allocator.layer_indices.index(layer_idx)
    rows = cache.kernel_rows  # [pages * page_size, 2 * kv_heads, head_dim]
    k = key_states[0].transpose(0, 1)  # [Q, kv_heads, head_dim]
    v = value_states[0].transpose(0, 1)
    kv = torch.stack((k, v), dim=2).reshape(k.shape[0], 2 * k.shape[1], k.shape[2]).to(rows.dtype)
    rows.index_copy_(0, kwargs["tpu_write_slots"].long() + layer * page, kv)
    return cache.kernel_pages, kwargs["tpu_page_base"] + layer


def kernel_views(allocator: Any) -> tuple[Any, Any]:
    """The cache tensor as the kernel's pages ``[pages, page_size, 2 * kv_heads, head_dim]`` and as rows."""
    heads, dim = allocator.num_key_value_heads, allocator.head_dim
    pages = allocator.cache_tensor.view(-1, allocator.tokens_per_page, 2 * heads, dim)
    return pages, pages.view(-1, 2 * heads, dim)


def step_inputs(allocator: Any, write: list[int], blocks: list[list[int]]) -> tuple[list[int], list[int]]:
    """Layer 0's write rows in the kernel's layout (from upstream's write indices) and the requests'
    page-table bases, flat (their blocks times the layers per block)."""
    stride, layers, page = allocator.block_physical_stride, allocator.pages_per_block, allocator.tokens_per_page
    rows = [(w // stride) * layers * page + w % stride for w in write]
    return rows, [b * layers for row in blocks for b in row]


def padded_arrays(allocator: Any, kernel: tuple[list[int], int], token_seq: list[int], s: int) -> tuple[list, int]:
    """The step's ``kv_lens`` [S], ``cu_q_lens`` [S + 1] and ``num_seqs`` [1] (padding sequences past
    ``num_seqs`` hold nothing and have no query token), and the padding tokens' write row."""
    kv_lens, seqs = kernel
    counts = [0] * s
    for i in token_seq:
        counts[i] += 1
    cu = [0]
    for i in range(s):
        cu.append(cu[-1] + (counts[i] if i < seqs else 0))
    trash = step_inputs(allocator, [allocator.write_trash_index], [])[0][0]
    return [kv_lens + [0] * (s - len(kv_lens)), cu, [seqs]], trash


def step_kwargs(page_base: Any, kv_lens: Any, cu_q_lens: Any, num_seqs: Any) -> dict[str, Any]:
    """What the model's forward carries on the kernel path (in place of the present path's block bases)."""
    return {"tpu_page_base": page_base, "tpu_kv_lens": kv_lens, "tpu_cu_q_lens": cu_q_lens, "tpu_num_seqs": num_seqs}


def kv_bytes(plan: Any, allocator: Any, kv_lens: list[int], padded_tokens: int) -> tuple[int, int, int]:
    """One step's K/V bytes per layer: what its attention reads (the kernel: the pages of each ``kv_len``;
    the present path: ``max_len`` keys for every scheduled token), what the requests hold, and what the
    kernel reads (or would read) on this step."""
    per_token = 2 * allocator.num_key_value_heads * allocator.head_dim * allocator.cache_dtype.itemsize
    kernel = kernel_path.kernel_kv_bytes(kv_lens, allocator.tokens_per_page, per_token)
    read = kernel
    if plan.attention != "ragged":
        read = kernel_path.gathered_kv_bytes(padded_tokens, plan.blocks_per_request * allocator.tokens_per_page, per_token)
    return read, kernel_path.held_kv_bytes(kv_lens, per_token), kernel


def choose(
    model: Any, setting: str, kv_cache: str | None, attention_sinks: bool, local_heads: tuple[int, int] | None = None
) -> str:
    """The steps' attention (``kernel_path.attention_path``): the JAX kernel or the plain-PyTorch one, said once."""
    # What the model alone rules out is decided without importing JAX (a second or more).
    facts = functools.partial(kernel_facts, model, setting, kv_cache, attention_sinks, local_heads=local_heads)
    path, why = kernel_path.attention_path(facts(probe_jax=False))
    if path == "ragged":
        path, why = kernel_path.attention_path(facts())
    describe(path, why)
    if path == "ragged":
        _prepare()
    return path


def describe(path: str, why: str) -> None:
    """Say once which attention the serving steps run, and why."""
    from ..core.wrapping import warn_once

    if path == "ragged" or why.startswith("JAX is not installed"):  # no JAX: the default, not a problem
        message = f"transformers-tpu-ext: TPU serving attention: {path}: {why}"
        if message not in _said:
            _said.add(message)
            logger.info(message)
    elif not why.startswith("TRANSFORMERS_TPU_EXT_SERVE_ATTENTION"):  # JAX is there, the kernel cannot be used
        warn_once(f"TPU serving runs the plain-PyTorch paged attention (each token reads max_len keys): {why}")


_said: set[str] = set()
