"""The simulated ``torch.tpu.pallas``: ``jax_op`` (and ``get_pallas_mesh``), as torch_tpu 0.2.0 has them.

torch_tpu's ``jax_op("ns::op", fn, *, donate_argnums, mesh, input/output_partition_specs)`` makes a
``torch.library`` custom op (with a fake kernel) that runs the JAX function ``fn`` on the chip: its
tensor arguments become JAX arrays, its non-tensor arguments are bound beforehand
(``functools.partial``), and it composes with ``torch.compile(backend="tpu")``
(shared/reference/torch_tpu-0.2.0-internals.md, "torch.tpu.pallas"). Both names need JAX.

On CPU a Pallas TPU kernel cannot run (and JAX 0.10.2's TPU interpret mode fails on the ragged paged
attention kernel), so the simulator runs, for the kernels it knows, the kernel's own **reference**
on the same inputs, after the checks the kernel makes when a chip traces it:

- JAX's ``ragged_paged_attention`` (``jax.experimental.pallas.ops.tpu.ragged_paged_attention``):
  traced abstractly as a chip would (its input checks, its head tiling, its block sizes for the
  simulated chip generation), its runtime checks on the real values (``dynamic_validate_inputs``),
  then ``ref_ragged_paged_attention`` with the same keyword arguments. Each call adds to
  :data:`STATS` the K/V bytes it reads: the pages of each sequence's ``kv_len``.
- a function calling JAX's megablox grouped matmul (``gmm``, ``tgmm``): lowered for a TPU, then run with the
  kernels' definitions, their weight reads counted (:mod:`.megablox`);
- any other function runs as JAX runs it on the CPU (a Pallas TPU kernel there fails, as it would).

Tensor arguments must be on the ``tpu`` device; torch_tpu's dtype table and argument checks apply.
"""

from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["KvStats", "STATS", "get_pallas_mesh", "jax_op", "kernel_kv_bytes"]

_NO_JAX = "JAX/Pallas is not available. Please install JAX to use this API."
_KERNEL_MODULE = "jax.experimental.pallas.ops.tpu.ragged_paged_attention"
#: Keyword arguments of the kernel that tune its blocks on a chip (its reference takes none of them).
_TUNING = ("num_kv_pages_per_block", "num_queries_per_block", "vmem_limit_bytes")
_INT_ARGS = ("kv_lens", "page_indices", "cu_q_lens", "num_seqs")


@dataclass
class KvStats:
    """What the attention kernels run through ``jax_op`` read: calls, and the K/V bytes of the pages
    holding each sequence's ``kv_len`` (summed over calls: one call per layer and step)."""

    calls: int = 0
    kv_bytes_read: int = 0

    def reset(self) -> None:
        self.calls = 0
        self.kv_bytes_read = 0


STATS = KvStats()
_lock = threading.RLock()


def _jax() -> Any:
    try:
        import jax
        import jax.numpy  # noqa: F401
    except ImportError as error:
        raise ImportError(_NO_JAX) from error
    return jax


def get_pallas_mesh(axis_names: Any, mesh_shape: Any, process_group: Any = None) -> Any:
    """torch_tpu's mesh for ``jax_op`` over several chips: the simulator runs ``jax_op`` on one chip."""
    _jax()
    raise NotImplementedError("the simulated TPU runs jax_op on one chip (no Pallas mesh)")


def jax_op(
    name: str,
    fn: Callable[..., Any],
    *,
    donate_argnums: tuple[int, ...] = (),
    mesh: Any = None,
    input_partition_specs: Any = None,
    output_partition_specs: Any = None,
) -> Any:
    """A ``torch.library`` custom op ``name`` that runs the JAX function ``fn`` on the simulated TPU.

    Positional parameters of ``fn`` without a default are its tensor inputs (bind everything else with
    ``functools.partial``). ``donate_argnums`` is accepted (the simulator copies arrays anyway); a
    ``mesh`` is refused (one chip). Returns the op: call it with ``tpu`` tensors; ``register_fake``
    replaces its fake kernel (derived from ``jax.eval_shape``).
    """
    jax = _jax()
    if mesh is not None or input_partition_specs is not None or output_partition_specs is not None:
        raise NotImplementedError("the simulated TPU runs jax_op on one chip (no mesh or partition specs)")
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if not params:
        raise TypeError(f"jax_op({name!r}): the function takes no tensor argument")
    schema = "(" + ", ".join(f"Tensor {p.name}" for p in params) + ") -> Tensor"
    run = _runner(fn, jax)

    def implementation(*tensors: torch.Tensor) -> torch.Tensor:
        return run(tensors)

    op = torch.library.custom_op(name, implementation, mutates_args=(), schema=schema)

    def fake(*tensors: torch.Tensor) -> torch.Tensor:
        out = _eval_shape(fn, jax, tensors)
        return torch.empty(out.shape, dtype=_torch_dtype(out.dtype), device=tensors[0].device)

    op.register_fake(fake)
    return op


# ---------------------------------------------------------------------------------------------
# Running a JAX function on the simulator's CPU data.


def _runner(fn: Callable[..., Any], jax: Any) -> Callable[[tuple], torch.Tensor]:
    kernel = _known_kernel(fn)
    if kernel is None:
        from . import megablox  # JAX's grouped matmul: lowered for the chip, run as its definition

        return lambda tensors: _to_torch(megablox.run(fn, jax, [_to_jax(t, jax) for t in _checked(tensors)]))
    return functools.partial(_ragged_paged_attention, fn, kernel, jax)


def _known_kernel(fn: Any) -> Any:
    """JAX's ragged paged attention module when ``fn`` is its kernel (or a partial of it), else ``None``."""
    import sys

    target = fn.func if isinstance(fn, functools.partial) else fn
    module = sys.modules.get(_KERNEL_MODULE)
    if module is None or not hasattr(module, "ref_ragged_paged_attention"):
        return None
    return module if target is getattr(module, "ragged_paged_attention", None) else None


def _checked(tensors: tuple) -> tuple:
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"custom kernels only support torch.Tensor and None inputs, but input {i} was of type {type(t)}. "
                "Use static_argnums or functools.partial for non-tensor args."
            )
        _jax_dtype(t.dtype)
    return tensors


def _jax_dtype(dtype: torch.dtype) -> Any:
    import jax.numpy as jnp

    table = {
        torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
        torch.bfloat16: jnp.bfloat16, torch.float8_e4m3fn: jnp.float8_e4m3fn, torch.float8_e5m2: jnp.float8_e5m2,
        torch.uint8: jnp.uint8, torch.int8: jnp.int8, torch.int16: jnp.int16, torch.int32: jnp.int32,
        torch.int64: jnp.int64, torch.bool: jnp.bool_,
    }
    if dtype not in table:
        raise NotImplementedError(f"Unsupported dtype for pallas kernels: {dtype}")
    return jnp.dtype(table[dtype])


def _torch_dtype(dtype: Any) -> torch.dtype:
    import jax.numpy as jnp

    name = jnp.dtype(dtype).name
    result = getattr(torch, {"bool": "bool"}.get(name, name), None)
    if not isinstance(result, torch.dtype):
        raise NotImplementedError(f"Unsupported dtype for pallas kernels: {dtype}")
    return result


def _to_jax(t: torch.Tensor, jax: Any) -> Any:
    import numpy as np

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return jax.numpy.asarray(t.view(torch.int16).numpy().view(_jax_dtype(t.dtype)))
    return jax.numpy.asarray(np.asarray(t.numpy()))


def _to_torch(array: Any) -> torch.Tensor:
    import numpy as np

    host = np.asarray(array)
    if host.dtype.name == "bfloat16":
        return torch.from_numpy(host.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(host.copy())


def _eval_shape(fn: Callable[..., Any], jax: Any, tensors: tuple) -> Any:
    structs = [jax.ShapeDtypeStruct(tuple(t.shape), _jax_dtype(t.dtype)) for t in _checked(tensors)]
    kernel = _known_kernel(fn)
    if kernel is None:
        return jax.eval_shape(fn, *structs)
    wrong = [f"{name}: {t.dtype}" for name, t in zip(_INT_ARGS, tensors[2:]) if t.dtype != torch.int32]
    if wrong:
        raise ValueError(f"The dtype of `kv_lens`, `page_indices`, `cu_q_lens` and `num_seqs` must be int32. Got {wrong}.")
    try:
        with _simulated_chip(kernel):
            return jax.eval_shape(fn, *structs)
    except (AssertionError, ValueError, NotImplementedError) as error:  # what the kernel's trace refuses
        raise ValueError(
            f"ragged_paged_attention cannot take q {tuple(tensors[0].shape)} {tensors[0].dtype} with kv_pages "
            f"{tuple(tensors[1].shape)} {tensors[1].dtype}: {type(error).__name__}: {error}"
        ) from error


class _simulated_chip:
    """While a kernel is traced: JAX's TPU generation lookups answer the simulated chip's generation
    (the kernel picks its block sizes from it; on the CPU JAX has no TPU to ask)."""

    def __init__(self, kernel: Any) -> None:
        import importlib

        self.tuned = importlib.import_module(_KERNEL_MODULE + ".tuned_block_sizes")
        self.saved: dict[str, Any] = {}

    def __enter__(self) -> None:
        from .instance import simulated_tpu

        sim = simulated_tpu()
        generation = getattr(sim, "generation", "v6e") or "v6e"
        version = 7 if generation.startswith("v7") else int("".join(c for c in generation if c.isdigit()) or 6)
        name = "TPU7x" if version == 7 else f"TPU v{version}"
        _lock.acquire()
        for attr, value in (("get_tpu_version", lambda: version), ("get_device_name", lambda num_devices=None: name)):
            self.saved[attr] = getattr(self.tuned, attr)
            setattr(self.tuned, attr, value)

    def __exit__(self, *exc: Any) -> None:
        for attr, value in self.saved.items():
            setattr(self.tuned, attr, value)
        _lock.release()


def kernel_kv_bytes(kv_lens: Any, num_seqs: int, page_size: int, bytes_per_token: int) -> int:
    """K/V bytes the ragged paged attention kernel reads: the pages of each of the first ``num_seqs``
    sequences' ``kv_len`` (``bytes_per_token``: keys and values of one token, all heads)."""
    pages = sum(-(-int(n) // page_size) for n in list(kv_lens)[:num_seqs])
    return pages * page_size * bytes_per_token


def _ragged_paged_attention(fn: Any, kernel: Any, jax: Any, tensors: tuple) -> torch.Tensor:
    _checked(tensors)
    _eval_shape(fn, jax, tensors)  # the checks a chip makes when it traces the kernel
    q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs = (_to_jax(t, jax) for t in tensors)
    keywords = dict(fn.keywords) if isinstance(fn, functools.partial) else {}
    for name in _TUNING:
        keywords.pop(name, None)
    kernel.dynamic_validate_inputs(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **keywords)
    # The kernel writes every row of its [tokens, heads, head_dim] output; the reference only the
    # sequences' own (and none without a sequence): the padding rows (past cu_q_lens[num_seqs]) are zeros here.
    result = torch.zeros(tuple(tensors[0].shape), dtype=tensors[0].dtype)
    seqs = int(tensors[5][0])
    if seqs:
        out = kernel.ref_ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **keywords)
        real = _to_torch(out)
        result[: real.shape[0]] = real
    _, page_size, combined_heads, head_dim = tensors[1].shape
    read = kernel_kv_bytes(tensors[2].tolist(), seqs, page_size, combined_heads * head_dim * tensors[1].element_size())
    with _lock:
        STATS.calls += 1
        STATS.kv_bytes_read += read
    return result
