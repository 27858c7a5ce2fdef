"""The simulated ``torch.tpu.pallas``: ``jax_op`` (and ``get_pallas_mesh``), as torch_tpu 0.2.0 has them.

torch_tpu's ``jax_op("ns::op", fn, *, donate_argnums, mesh, input/output_partition_specs)`` makes a
``torch.library`` custom op (with a fake kernel) that runs the JAX function ``fn`` on the chip
(``torch_tpu/_internal/pallas/pallas.py``). Its registration is Python, and the simulator applies the
same rules (:func:`verify_signature`, :func:`op_schema`; ``tests/simulator/test_jax_op_wheel.py`` runs
both on the same functions wherever the wheel's sources are found):

- every parameter of ``inspect.signature(inspect.unwrap(fn), eval_str=True)`` is annotated, with a
  ``jax.Array``/``torch.Tensor`` (a tensor input) or a POD type (``int``, ``float``, ``bool``, ``str``,
  dtypes, devices, enums, literals, their optionals and sequences: static arguments); a name bound by
  ``functools.partial`` needs no valid type, but still an annotation;
- the **return annotation must be valid** (``jax.Array``, POD types, their tuples, sequences and
  optionals): a function without one is refused ("The return annotation is invalid"), as JAX's own
  kernels are (they carry none: wrap them in an annotated function);
- the op's schema is built from the annotations: tensors are ``Tensor``, static arguments keep their
  type (and default), the return is ``Tensor``, ``Tensor[]``, ``(Tensor, Tensor)``...

When the op runs, its tensor arguments become JAX arrays and ``fn`` runs with JAX on the CPU, where a
Pallas TPU kernel cannot run (and JAX 0.10.2's TPU interpret mode fails on the ragged paged attention
kernel). So for the kernel it knows, JAX's ``ragged_paged_attention``
(``jax.experimental.pallas.ops.tpu.ragged_paged_attention``), the simulator first **lowers** ``fn`` for
the TPU as torch_tpu does on its first call (``jax.export`` for ``platforms=["tpu"]``, the kernel's
Mosaic lowering for the simulated chip's generation: its input checks, head tiling and block shapes),
once per input shapes; then runs ``fn`` with the kernel replaced by its runtime checks
(``dynamic_validate_inputs``) and its reference (``ref_ragged_paged_attention``) on the same inputs.
JAX itself sees no TPU, as inside torch_tpu's process: a kernel left to choose its block sizes from
``jax.devices()`` fails there, as on a chip. Each kernel call adds to :data:`STATS` the K/V bytes it
reads: the pages of each sequence's ``kv_len``.

Tensor arguments must be on the ``tpu`` device; torch_tpu's dtype table and argument checks apply.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["KvStats", "STATS", "get_pallas_mesh", "jax_op", "kernel_kv_bytes", "op_schema", "verify_signature"]

from .jax_op_rules import op_schema, verify_signature
from .jax_op_rules import signature_of as _signature
from .jax_op_rules import static_names as _static_names

_NO_JAX = "JAX/Pallas is not available. Please install JAX to use this API."
_KERNEL_MODULE = "jax.experimental.pallas.ops.tpu.ragged_paged_attention"
#: Keyword arguments of the kernel that tune its blocks on a chip (its reference takes none of them).
_TUNING = ("num_kv_pages_per_block", "num_queries_per_block", "vmem_limit_bytes")
#: The device kind JAX's Mosaic lowering reads for each simulated chip generation.
DEVICE_KINDS = {"v4": "TPU v4", "v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite", "v7": "TPU7x"}


@dataclass
class KvStats:
    """What the attention kernels run through ``jax_op`` read: calls, and the K/V bytes of the pages
    holding each sequence's ``kv_len`` (summed over calls: one call per layer and step)."""

    calls: int = 0
    kv_bytes_read: int = 0
    lowered: int = 0  # distinct (op, input shapes) lowered for the TPU

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


def get_pallas_mesh(axis_names: Any, mesh_shape: Any = None, process_group: Any = None) -> Any:
    """torch_tpu's mesh for ``jax_op`` over several chips: its refusals (``torch.distributed`` not initialized,
    a shape or group that is not the whole world, names that do not match the shape: the wheel's
    ``_get_pallas_mesh``), then the simulator's own (it runs ``jax_op`` on one chip)."""
    import math

    import torch.distributed as dist

    _jax()
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized. dist.init_process_group()")
    world = dist.get_world_size()
    if process_group is not None and dist.get_world_size(process_group) != world:
        raise ValueError(
            "torch_tpu pallas kernels currently require full world-size meshes only. Got process_group with size "
            f"{dist.get_world_size(process_group)}, expected {world}."
        )
    if mesh_shape is not None and math.prod(mesh_shape) != world:
        raise ValueError(f"Pallas mesh shape {mesh_shape} product ({math.prod(mesh_shape)}) must match world size ({world}).")
    if mesh_shape is not None and not isinstance(axis_names, str) and len(axis_names) != len(mesh_shape):
        raise ValueError("does not match length")
    if mesh_shape is None and not isinstance(axis_names, str) and len(axis_names) > 1:
        raise ValueError("must be explicitly specified")
    raise NotImplementedError("the simulated TPU runs jax_op on one chip (no Pallas mesh)")


# ---------------------------------------------------------------------------------------------
# jax_op


def jax_op(
    name: str,
    fn: Callable[..., Any] | None = None,
    /,
    *,
    donate_argnums: Any = None,
    mesh: Any = None,
    input_partition_specs: Any = None,
    output_partition_specs: Any = None,
) -> Any:
    """A ``torch.library`` custom op ``name`` that runs the JAX function ``fn`` on the simulated TPU.

    Refuses what torch_tpu refuses (:func:`verify_signature`), with its schema (:func:`op_schema`).
    ``donate_argnums`` is accepted (the simulator copies arrays anyway); a ``mesh`` is refused (one
    chip). Without ``fn``, a decorator. Returns the op: call it with ``tpu`` tensors; ``register_fake``
    replaces its fake kernel (derived from ``jax.eval_shape``).
    """
    jax = _jax()
    if "::" not in name:
        raise ValueError(f"Op name {name} does not contain a namespace.")
    if len(name.split("::")) != 2:
        raise ValueError(f"Op name {name} must have exactly one '::' separator.")
    if mesh is not None or input_partition_specs is not None or output_partition_specs is not None:
        raise NotImplementedError("the simulated TPU runs jax_op on one chip (no mesh or partition specs)")

    def register(fn: Callable[..., Any]) -> Any:
        verify_signature(fn)
        schema = op_schema(fn)
        signature = _signature(fn)
        static = _static_names(signature)
        run = functools.partial(_run, name, fn, signature, static, jax)

        def implementation(*args: Any, **kwargs: Any) -> Any:
            return run(args, kwargs, abstract=False)

        op = torch.library.custom_op(name, implementation, mutates_args=(), schema=schema)

        def fake(*args: Any, **kwargs: Any) -> Any:
            return run(args, kwargs, abstract=True)

        op.register_fake(fake)
        return op

    return register if fn is None else register(fn)


def _run(name: str, fn: Callable, signature: inspect.Signature, static: set, jax: Any, args: tuple, kwargs: dict,
         abstract: bool) -> Any:
    bound = signature.bind(*args, **kwargs)
    device = next((t.device for t in bound.arguments.values() if isinstance(t, torch.Tensor)), torch.device("tpu"))
    arrays, statics = {}, {}
    for key, value in bound.arguments.items():
        if key in static:
            statics[key] = value
        elif value is not None:
            arrays[key] = _checked(key, value)
    call = functools.partial(fn, **statics)
    if abstract:
        structs = {k: jax.ShapeDtypeStruct(tuple(t.shape), _jax_dtype(t.dtype)) for k, t in arrays.items()}
        out = jax.eval_shape(lambda **a: call(**a), **structs)
        return jax.tree_util.tree_map(
            lambda s: torch.empty(s.shape, dtype=_torch_dtype(s.dtype), device=device), out)
    if _uses_kernel(fn):
        _lower_once(name, call, arrays, jax)
    with _kernel_on_cpu():
        out = call(**{k: _to_jax(t, jax) for k, t in arrays.items()})
    return jax.tree_util.tree_map(lambda a: _to_torch(a).to(device), out)


def _checked(key: str, t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"custom kernels only support torch.Tensor and None inputs, but input {key} was of type {type(t)}. "
            "Use static_argnums or functools.partial for non-tensor args."
        )
    _jax_dtype(t.dtype)
    if t.dtype in (torch.int64, torch.float64) and not _jax().config.jax_enable_x64:
        raise TypeError(
            f"input {key} is {t.dtype}: JAX without jax_enable_x64 takes it as a 32-bit array (the kernel is "
            "traced and lowered for 32 bits, the chip gets 64-bit data): pass int32/float32 tensors"
        )
    return t


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
    result = getattr(torch, name, None)
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


# ---------------------------------------------------------------------------------------------
# JAX's ragged paged attention kernel: lowered for the simulated chip, run as its reference


def _kernel_module() -> Any:
    import sys

    module = sys.modules.get(_KERNEL_MODULE)
    return module if module is not None and hasattr(module, "ref_ragged_paged_attention") else None


def _uses_kernel(fn: Any) -> bool:
    """Whether ``fn`` may call a Pallas TPU kernel the simulator knows: JAX's ragged paged attention or its
    megablox grouped matmul (their module is imported)."""
    from . import megablox

    return _kernel_module() is not None or megablox.imported()


_lowered: set = set()


def _device_kind() -> str:
    from .instance import simulated_tpu

    generation = getattr(simulated_tpu(), "generation", "v6e") or "v6e"
    return DEVICE_KINDS.get(generation, "TPU v6 lite")


def _lower_once(name: str, call: Callable, arrays: dict, jax: Any) -> None:
    """Lower ``call`` for the TPU, as torch_tpu does on the op's first call with these shapes: under an
    abstract mesh of the simulated chip's generation (what Mosaic reads); ``jax.devices()`` stays the CPU."""
    kind = _device_kind()
    key = (name, kind, tuple((k, tuple(t.shape), t.dtype) for k, t in arrays.items()))
    if key in _lowered:
        return
    structs = {k: jax.ShapeDtypeStruct(tuple(t.shape), _jax_dtype(t.dtype)) for k, t in arrays.items()}
    device = jax.sharding.AbstractDevice(kind, 1, "tpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device)
    try:
        with jax.sharding.use_abstract_mesh(mesh), jax._src.config.export_ignore_forward_compatibility(True):
            jax.export.export(
                jax.jit(lambda **a: call(**a)), platforms=["tpu"],
                disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("ALL")],
            )(**structs)
    except Exception as error:  # what the kernel's trace or its Mosaic lowering refuses
        shapes = ", ".join(f"{k} {tuple(t.shape)} {t.dtype}" for k, t in arrays.items())
        raise ValueError(f"{name} does not lower for a {kind} ({shapes}): {type(error).__name__}: {error}") from error
    with _lock:
        _lowered.add(key)
        STATS.lowered += 1


@contextlib.contextmanager
def _kernel_on_cpu() -> Any:
    """While a JAX function runs on the CPU (a Pallas TPU kernel cannot run here): JAX's ragged paged attention
    kernel is its runtime checks and its reference, megablox's ``gmm``/``tgmm`` their definitions
    (:mod:`.megablox`, which counts their weight reads)."""
    from . import megablox

    with megablox.on_cpu(), _ragged_on_cpu():
        yield


@contextlib.contextmanager
def _ragged_on_cpu() -> Any:
    module = _kernel_module()
    if module is None:
        yield
        return
    import importlib

    kernel = importlib.import_module(_KERNEL_MODULE + ".kernel")
    stand_in = functools.partial(_reference_kernel, module)
    with _lock:
        saved = module.ragged_paged_attention, kernel.ragged_paged_attention
        module.ragged_paged_attention = kernel.ragged_paged_attention = stand_in
        try:
            yield
        finally:
            module.ragged_paged_attention, kernel.ragged_paged_attention = saved


def kernel_kv_bytes(kv_lens: Any, num_seqs: int, page_size: int, bytes_per_token: int) -> int:
    """K/V bytes the ragged paged attention kernel reads: the pages of each of the first ``num_seqs``
    sequences' ``kv_len`` (``bytes_per_token``: keys and values of one token, all heads)."""
    pages = sum(-(-int(n) // page_size) for n in list(kv_lens)[:num_seqs])
    return pages * page_size * bytes_per_token


def _reference_kernel(module: Any, q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any,
                      num_seqs: Any, **keywords: Any) -> Any:
    import jax.numpy as jnp
    import numpy as np

    module.dynamic_validate_inputs(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **keywords)
    for name in _TUNING:
        keywords.pop(name, None)
    seqs = int(num_seqs[0])
    # The kernel writes every row of its [tokens, heads, head_dim] output; the reference only the
    # sequences' own (and none without a sequence): the padding rows (past cu_q_lens[num_seqs]) are zeros here.
    result = jnp.zeros(q.shape, q.dtype)
    if seqs:
        real = module.ref_ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **keywords)
        result = result.at[: real.shape[0]].set(real)
    _, page_size, combined_heads, head_dim = kv_pages.shape
    read = kernel_kv_bytes(np.asarray(kv_lens).tolist(), seqs, page_size, combined_heads * head_dim * kv_pages.dtype.itemsize)
    with _lock:
        STATS.calls += 1
        STATS.kv_bytes_read += read
    return result
