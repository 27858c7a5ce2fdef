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

_ops: dict[Any, str] = {}
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


def kernel_op(variant: kernel_path.KernelVariant) -> Any:
    """The custom op running the kernel for ``variant`` (registered once per variant, by :func:`choose`)."""
    import torch

    return getattr(torch.ops.transformers_tpu_ext, _traced_op_name[0](variant))


def _op_name(variant: kernel_path.KernelVariant) -> str:
    """The op's name in ``torch.ops.transformers_tpu_ext``, registered on first use (by :func:`choose`,
    outside any trace; a step runs this as Python when it is traced, ``assume_constant_result``, so that
    the registration is no part of the graph)."""
    name = _ops.get(variant)
    if name is None:
        import torch

        from . import kernel_call

        name = f"ragged_paged_attention_{variant.key}_{next(_names)}"
        op = torch.tpu.pallas.jax_op(f"transformers_tpu_ext::{name}", kernel_call.make(variant))
        op.register_fake(lambda q, *rest, **static: torch.empty_like(q))  # the kernel's output: q's shape and dtype
        _ops[variant] = name
    return name


_traced_op_name: list[Any] = []  # _op_name as TorchDynamo runs it (made outside any trace, by choose())


def _prepare() -> None:
    if not _traced_op_name:
        import torch._dynamo

        _traced_op_name.append(torch._dynamo.assume_constant_result(_op_name))


def attention(
    module: Any,
    query: Any,  # [1, heads, Q, head_dim]
    key: Any,  # the cache's pages [pages, page_size, 2 * kv_heads / lanes, lanes * head_dim] (from update)
    value: Any,  # this layer's page table [S, pages per request] (from update)
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    tokens, heads, head_dim = query.shape[2], query.shape[1], query.shape[3]
    op = kernel_op(kwargs["tpu_kernel_variant"])
    q = query[0].transpose(0, 1)  # [Q, heads, head_dim]
    scales = kwargs.get("tpu_kv_head_scales")  # int8 pages: this layer's [2, kv_heads]
    if scales is not None:  # the keys' scale on the queries, the values' on the output (per key-value head)
        per_head = scales.repeat_interleave(heads // scales.shape[1], dim=1)[:, None, :, None]  # [2, 1, heads, 1]
        q = q * per_head[0].to(q.dtype)
    else:
        q = q.to(key.dtype)
    out = op(
        q.contiguous(), key, kwargs["tpu_kv_lens"], value, kwargs["tpu_cu_q_lens"], kwargs["tpu_num_seqs"],
        sm_scale=float(head_dim**-0.5 if scaling is None else scaling),
        sliding_window=int(sliding_window) if sliding_window else None,
        soft_cap=float(softcap) if softcap else None,
    )
    if scales is not None:
        out = out * per_head[1].to(out.dtype)
    return out.to(query.dtype).reshape(1, tokens, heads, head_dim), None


def update(cache: Any, key_states: Any, value_states: Any, layer_idx: int, kwargs: Any) -> tuple[Any, Any]:
    """Write the step's keys and values in the kernel's layout; return the pages and the layer's page table
    (and, with int8 pages, put the layer's scales in ``kwargs["tpu_kv_head_scales"]`` for the attention)."""
    import torch

    allocator, page = cache.allocator, cache.page_size
    layer = allocator.layer_indices.index(layer_idx)
    rows = cache.kernel_rows  # [pages * page_size, 2 * kv_heads / lanes, lanes * head_dim]
    k = key_states[0].transpose(0, 1)  # [Q, kv_heads, head_dim]
    v = value_states[0].transpose(0, 1)
    if cache.kernel_scales is not None:  # int8: a scale per layer and key-value head, fixed by its first step
        k, v = quantize(cache.kernel_scales[layer], k, v)
        kwargs["tpu_kv_head_scales"] = cache.kernel_scales[layer]
    tokens, kv_heads, _ = k.shape
    width = rows.shape[-1]  # lanes * head_dim: key-value heads side by side in a row (serving.kernel_call)
    k, v = k.reshape(tokens, rows.shape[1] // 2, width), v.reshape(tokens, rows.shape[1] // 2, width)
    kv = torch.stack((k, v), dim=2).reshape(tokens, rows.shape[1], width).to(rows.dtype)
    rows.index_copy_(0, kwargs["tpu_write_slots"].long() + layer * page, kv)
    return cache.kernel_pages, kwargs["tpu_page_base"] + layer


#: Headroom of the int8 scales over the first step's largest magnitude (one bit of int8's range).
INT8_HEADROOM = 2.0


def quantize(scales: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """``k``, ``v`` (``[Q, kv_heads, head_dim]``) as int8 with the layer's scales ``[2, kv_heads]`` (float32),
    which the first step writing the layer sets (``INT8_HEADROOM`` x its largest magnitude / 127, per
    key-value head; zero until then) and every later step keeps; values past the range are clipped."""
    import torch

    observed = torch.stack((k.float().abs().amax(dim=(0, 2)), v.float().abs().amax(dim=(0, 2))))  # [2, kv_heads]
    fresh = (observed * (INT8_HEADROOM / 127)).clamp(min=1e-8)
    scales.copy_(torch.where(scales > 0, scales, fresh))
    return tuple(  # type: ignore[return-value]
        torch.round(states.float() / scales[i][None, :, None]).clamp(-127, 127).to(torch.int8)
        for i, states in enumerate((k, v))
    )


def head_scales(allocator: Any) -> Any:
    """The int8 kernel pages' scales ``[layers, 2, kv_heads]`` (float32; zero: set by each layer's first step)."""
    import torch

    scales = torch.zeros(
        len(allocator.layer_indices), 2, allocator.num_key_value_heads, dtype=torch.float32,
        device=allocator.cache_tensor.device,
    )
    torch._dynamo.mark_static_address(scales)
    return scales


def kernel_views(allocator: Any) -> tuple[Any, Any]:
    """The cache tensor as the kernel's pages ``[pages, page_size, 2 * kv_heads / lanes, lanes * head_dim]``
    and as rows (``lanes``: ``kernel_path.lane_packing``, 1 for head sizes that are multiples of 128)."""
    heads, dim = allocator.num_key_value_heads, allocator.head_dim
    lanes = kernel_path.lane_packing(dim, heads)
    pages = allocator.cache_tensor.view(-1, allocator.tokens_per_page, 2 * heads // lanes, lanes * dim)
    return pages, pages.view(-1, 2 * heads // lanes, lanes * dim)


def to_present_layout(allocator: Any, chunk: int = 256) -> None:
    """Rewrite every page of ``allocator`` from the kernel's layout to upstream's, in place (the fallback of a
    kernel that failed while serving: ``wrap_fallback``). A kernel page ``[page_size, 2 * kv_heads / lanes,
    lanes * head_dim]`` holds, per row pair, the keys then the values of ``lanes`` heads side by side; upstream's
    page is ``[2, page_size, kv_heads, head_dim]``. ``chunk`` pages at a time (that much temporary memory)."""
    heads, dim, page = allocator.num_key_value_heads, allocator.head_dim, allocator.tokens_per_page
    lanes = kernel_path.lane_packing(dim, heads)
    pages = allocator.cache_tensor.view(-1, page, heads // lanes, 2, lanes, dim)
    for start in range(0, pages.shape[0], chunk):
        part = pages[start : start + chunk]
        present = part.permute(0, 3, 1, 2, 4, 5).contiguous()  # [n, 2, page_size, groups, lanes, head_dim]
        part.view(present.shape).copy_(present)


def present_scales(allocator: Any, head_scales: Any) -> Any:
    """The present path's int8 scales (a row per cached position and key-value head, ``quantization.kv_cache``)
    from the kernel's (per layer and key-value head ``[layers, 2, kv_heads]``): what each page holds reads the same."""
    from ..quantization import kv_cache

    scales = kv_cache.paged_scales(allocator)
    rows = scales.view(-1, allocator.pages_per_block, 2, allocator.tokens_per_page, scales.shape[1])
    rows.copy_(head_scales[None, :, :, None, :].expand(rows.shape))
    return scales


def failed_here(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from) came from the kernel: its op's name in the message, or a
    frame of this module, ``kernel_call``, or a Pallas module (torch_tpu's ``jax_op``, JAX's, the simulator's)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if "ragged_paged_attention" in str(error):
            return True
        tb = error.__traceback__
        while tb is not None:
            name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
            if name.endswith(("serving/ragged.py", "serving/kernel_call.py")) or "pallas" in name:
                return True
            tb = tb.tb_next
        error = error.__cause__ or error.__context__
    return False


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


def step_kwargs(variant: Any, page_base: Any, kv_lens: Any, cu_q_lens: Any, num_seqs: Any) -> dict[str, Any]:
    """What the model's forward carries on the kernel path (in place of the present path's block bases)."""
    return {
        "tpu_page_base": page_base, "tpu_kv_lens": kv_lens, "tpu_cu_q_lens": cu_q_lens, "tpu_num_seqs": num_seqs,
        "tpu_kernel_variant": variant,
    }


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
    model: Any,
    setting: str,
    kv_cache: str | None,
    attention_sinks: bool,
    local_heads: tuple[int, int] | None = None,
    page_size: int = 16,
) -> tuple[str, kernel_path.KernelVariant | None]:
    """The steps' attention (``kernel_path.attention_path``): the JAX kernel (and the variant registered for
    it) or the plain-PyTorch one, said once.

    On the kernel path the op is registered here, outside any trace, and run once on small inputs with
    each of the model's static arguments (scale, sliding window, soft cap): whatever torch_tpu refuses
    (registering, tracing, lowering, running the kernel) sends the manager to the plain-PyTorch attention,
    with one warning, before anything is compiled.
    """
    # What the model alone rules out is decided without importing JAX (a second or more).
    facts = functools.partial(kernel_facts, model, setting, kv_cache, attention_sinks, local_heads=local_heads)
    path, why = kernel_path.attention_path(facts(probe_jax=False))
    variant = None
    if path == "ragged":
        found = facts()
        path, why = kernel_path.attention_path(found)
        if path == "ragged":
            from ..backend import chip_info

            chip = chip_info()
            variant = kernel_path.KernelVariant(
                generation=(chip.generation if chip and chip.generation else "v6e"),
                lanes=kernel_path.lane_packing(found.head_dim, found.kv_heads),
                int8=kv_cache == "int8",
            )
            try:
                _probe(model, variant, found, page_size)
            except Exception as error:  # noqa: BLE001 - any failure of the kernel: the plain-PyTorch attention
                path, why, variant = "paged", (
                    "the ragged paged attention kernel failed on this torch_tpu before serving started "
                    f"({type(error).__name__}: {str(error)[:500]})"
                ), None
    describe(path, why, type(model).__name__)
    if path == "ragged":
        _prepare()
    return path, variant


def layer_statics(model: Any) -> set[tuple[float, int | None, float | None]]:
    """The (scale, sliding window, soft cap) the model's attention layers pass (read off their modules,
    as Transformers' attention modules keep them; the config's for what a module does not keep)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    found = set()
    for module in model.modules():
        if not hasattr(module, "layer_idx") or not hasattr(module, "scaling"):
            continue
        window = getattr(module, "sliding_window", None)
        if window is None and getattr(config, "sliding_window", None) and not getattr(config, "layer_types", None):
            window = config.sliding_window  # Mistral: the config's, on every layer
        cap = getattr(module, "attn_logit_softcapping", None)
        found.add((float(module.scaling), int(window) if window else None, float(cap) if cap else None))
    return found


def _probe(model: Any, variant: kernel_path.KernelVariant, facts: kernel_path.KernelFacts, page_size: int) -> None:
    """Register the kernel's op for ``variant`` and run it once per static arguments of the model's layers,
    on small inputs on the model's device (a prefill of 3 tokens in a page, a padding sequence)."""
    import torch

    op = getattr(torch.ops.transformers_tpu_ext, _op_name(variant))
    device, dtype = model.device, model.dtype
    pages_dtype = torch.int8 if variant.int8 else dtype
    width = variant.lanes * facts.head_dim
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(16, facts.heads, facts.head_dim, generator=generator).to(dtype)
    pages = torch.randn(2, page_size, 2 * facts.kv_heads // variant.lanes, width, generator=generator)
    pages = (pages * 50).to(pages_dtype) if variant.int8 else pages.to(pages_dtype)
    ints = [torch.tensor(v, dtype=torch.int32) for v in ([3, 0], [[1], [0]], [0, 3, 3], [1])]
    arrays = [t.to(device) for t in (q, pages, *ints)]
    for scale, window, cap in sorted(layer_statics(model), key=str) or [(facts.head_dim**-0.5, None, None)]:
        out = op(*arrays, sm_scale=scale, sliding_window=window, soft_cap=cap)
        if tuple(out.shape) != tuple(q.shape) or not bool(torch.isfinite(out[:3].float()).all().cpu()):
            raise RuntimeError(f"the kernel's output for 3 tokens is {tuple(out.shape)}, not finite or not q's shape")


def describe(path: str, why: str, model: str = "the model") -> None:
    """Say once per model (its class) which attention the serving steps run, and why: a warning when JAX is
    there and the kernel cannot take the model (head size 96, attention sinks...), else at INFO."""
    from ..core.wrapping import warn_once

    if path == "ragged" or why.startswith("JAX is not installed"):  # no JAX: the default, not a problem
        message = f"transformers-tpu-ext: TPU serving attention for {model}: {path}: {why}"
        if message not in _said:
            _said.add(message)
            logger.info(message)
    elif not why.startswith("TRANSFORMERS_TPU_EXT_SERVE_ATTENTION"):  # JAX is there, the kernel cannot be used
        warn_once(f"TPU serving of {model} runs the plain-PyTorch paged attention (each token reads max_len keys): {why}")


_said: set[str] = set()
