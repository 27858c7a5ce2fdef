"""The mixture-of-experts operations of torch_tpu 0.2.0 on the simulated TPU, as a chip runs them.

Transformers' default experts implementation (``grouped_mm``, ``transformers.integrations.moe``) calls, on
every device but CPU and MPS, ``torch.histc`` on the int32 expert ids and then ``torch._grouped_mm``
(``torch.nn.functional.grouped_mm``). PyTorch's CPU kernels, which the simulator runs, refuse both where a
chip computes them; what a chip does is read from the torch-tpu 0.2.0 wheel and its public source mirror
(tags as in ``shared/reference/torch_tpu-0.2.0-internals.md``):

- ``aten::histc``: registered (S ``AtenHistc``/``AtenHistcOut`` in ``libpywrap_2_15_0_common.so``,
  ``csrc/ops/histc/histc_aten_kernels.cc``). Its checks (M ``histc_aten_kernels.cc``, every message also a
  string of the wheel): integer inputs are computed and the counts keep the input's dtype; bfloat16 and
  bool raise ``NotImplementedError`` ("not implemented for ..."), complex inputs ``RuntimeError``, and
  ``min``/``max`` must satisfy ``min < max`` unless both are equal (then the data's own bounds). PyTorch's
  CPU kernel refuses integers (``"histogram_cpu" not implemented for 'Int'``): the simulator computes them
  in float32 (exact below 2**24) and returns the chip's dtype.
- ``aten::_grouped_mm``: registered (S) and lowered to XLA's ``chlo.ragged_dot`` (M
  ``csrc/ops/grouped_mm/grouped_mm_aten_kernels.cc``); the wheel's meta kernel for TPU tensors (R
  ``_internal/compile/grouped_mm_meta.py``) mirrors the eager kernel's checks: both operands float32,
  float16 or bfloat16 and of one dtype, no bias (``NotImplementedError``), ``out_dtype`` the input's, a 1-D
  ``offs`` of int32 or int64 with stride 1, and none of the 16-byte stride alignment or int32-only
  ``offs`` PyTorch's CPU kernel demands. The simulator applies those checks, then computes in float32, group by
  group (PyTorch's CPU kernel would refuse what a chip takes).

A handler runs for tpu tensors only, eagerly and inside graphs the ``"tpu"`` backend compiled.
"""

from __future__ import annotations

from typing import Any

import torch

from . import device

__all__ = ["GROUPED_MM_DTYPES", "HISTC_REFUSED", "register"]

_aten = torch.ops.aten

#: What ``_grouped_mm`` computes on a chip (the wheel's meta kernel).
GROUPED_MM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Input dtypes the chip's ``histc`` refuses with ``NotImplementedError`` (besides complex ones).
HISTC_REFUSED = (torch.bfloat16, torch.bool)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _histc_int(x: torch.Tensor, bins: int, low: float, high: float) -> torch.Tensor:
    # The chip's integer histogram, in float32 (PyTorch's CPU kernel has none for integers); its dtype is x's.
    return torch.histc(x.to(torch.float32), bins, low, high).to(x.dtype)


def _grouped_mm_f32(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor:
    # The chip's kernel (XLA's ragged_dot), group by group in float32: PyTorch's CPU kernel also wants every
    # stride a multiple of 16 bytes, which a chip does not (a backward's 2D x 2D product over 37 columns failed
    # there, inside the autograd engine's device thread, and aborted the process). Rows or columns past the last
    # offset belong to no group: zeros.
    a32, b32 = a.to(torch.float32), b.to(torch.float32)
    if offs is None:  # 3D x 3D: one product per batch entry
        return torch.bmm(a32, b32).to(a.dtype)
    ends = [int(end) for end in offs.tolist()]
    groups = list(zip([0, *ends[:-1]], ends))
    if a.dim() == 2 and b.dim() == 3:  # a's rows grouped, one matrix of b per group
        out = a32.new_zeros((a.shape[0], b.shape[-1]))
        for group, (start, end) in enumerate(groups):
            out[start:end] = a32[start:end] @ b32[group]
    elif a.dim() == 3 and b.dim() == 2:  # b's columns grouped, one matrix of a per group
        out = a32.new_zeros((a.shape[1], b.shape[1]))
        for group, (start, end) in enumerate(groups):
            out[:, start:end] = a32[group] @ b32[:, start:end]
    else:  # 2D x 2D: the shared dimension grouped, one product per group
        out = a32.new_zeros((len(groups), a.shape[0], b.shape[1]))
        for group, (start, end) in enumerate(groups):
            out[group] = a32[:, start:end] @ b32[start:end]
    return out.to(a.dtype)


def _histc_int_fake(x: torch.Tensor, bins: int, low: float, high: float) -> torch.Tensor:
    return x.new_empty((bins,))


def _grouped_mm_fake(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor:
    if a.dim() == 2 and b.dim() == 2:
        shape = (offs.shape[0], a.shape[0], b.shape[1])
    elif a.dim() == 2:
        shape = (a.shape[0], b.shape[-1])
    elif b.dim() == 2:
        shape = (a.shape[1], b.shape[1])
    else:
        shape = (a.shape[0], a.shape[1], b.shape[-1])
    return a.new_empty(shape)


_ops: dict[str, Any] = {}


def _op(name: str) -> Any:
    """The CPU computation of a chip op, as a custom op the simulator's generic path runs (program counting,
    tracing and wrapping as for any op)."""
    if not _ops:
        for op_name, fn, fake, schema in (
            ("histc_int", _histc_int, _histc_int_fake, "(Tensor x, int bins, float low, float high) -> Tensor"),
            ("grouped_mm", _grouped_mm_f32, _grouped_mm_fake, "(Tensor a, Tensor b, Tensor? offs) -> Tensor"),
        ):
            op = torch.library.custom_op(f"tpu_simulator::{op_name}", fn, mutates_args=(), schema=schema)
            op.register_fake(fake)
            _ops[op_name] = getattr(torch.ops.tpu_simulator, op_name).default
    return _ops[name]


def _histc(func: Any) -> Any:
    def histc(args: tuple, kwargs: dict) -> Any:
        bound = dict(zip(("self", "bins", "min", "max", "out"), args), **kwargs)
        x = bound["self"]
        if x.is_complex():
            raise RuntimeError(f"expected the first argument not to be complex, got {_name(x.dtype)}")
        if x.dtype in HISTC_REFUSED:
            raise NotImplementedError(f"not implemented for {_name(x.dtype)}")
        if x.is_floating_point():
            return device._run_generic(func, args, kwargs)
        low, high = bound.get("min", 0), bound.get("max", 0)
        if low != high and not low < high:
            raise RuntimeError(f"expected min <= max, got {low} vs {high}")
        counts = device._run_generic(_op("histc_int"), (x, int(bound.get("bins", 100)), float(low), float(high)), {})
        out = bound.get("out")
        if out is None:
            return counts
        out.resize_(counts.shape).copy_(counts)
        return out

    return histc


def _check(condition: bool, message: str, error: type = RuntimeError) -> None:
    if not condition:
        raise error(f"grouped_mm(): {message}")


def _grouped_mm(args: tuple, kwargs: dict) -> Any:
    bound = dict(zip(("self", "mat2", "offs", "bias", "out_dtype"), args), **kwargs)
    a, b, offs, bias = bound["self"], bound["mat2"], bound.get("offs"), bound.get("bias")
    out_dtype = bound.get("out_dtype") or a.dtype
    _check(bias is None, "expected bias to be undefined, got defined tensor", NotImplementedError)
    _check(a.dtype == b.dtype, f"expected self and mat2 to have the same dtype, got {_name(a.dtype)} and {_name(b.dtype)}")
    _check(a.dtype in GROUPED_MM_DTYPES, f"expected self to be float32, float16, or bfloat16, got {_name(a.dtype)}")
    _check(out_dtype == a.dtype, f"expected out_dtype to match self dtype {_name(a.dtype)}, got {_name(out_dtype)}")
    if offs is not None:
        _check(offs.dim() == 1, f"expected offs to be 1D, got {offs.dim()}D")
        _check(offs.dtype in (torch.int32, torch.int64), f"expected offs to be int32 or int64, got {_name(offs.dtype)}")
        _check(offs.stride(0) == 1, f"expected offs to have stride 1 along dim 0, got {offs.stride(0)}")
    _check(a.dim() in (2, 3) and b.dim() in (2, 3), f"expected self and mat2 to be 2D or 3D, got {a.dim()}D and {b.dim()}D")
    return device._run_generic(_op("grouped_mm"), (a, b, offs), {})


def register() -> None:
    """Install the chip's histc and _grouped_mm in the simulator's dispatcher (idempotent)."""
    handlers: dict[Any, Any] = {_aten._grouped_mm.default: _grouped_mm}
    for overload in (_aten.histc.default, _aten.histc.out):
        handlers[overload] = _histc(overload)
    for func, handler in handlers.items():
        device._SPECIAL[func] = handler
        device._INFO.pop(func, None)  # recomputed with the special handler
