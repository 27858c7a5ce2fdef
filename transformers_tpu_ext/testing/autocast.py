"""Autocast on the simulated TPU: ``torch.autocast("tpu", dtype=torch.bfloat16)``.

torch_tpu registers autocast kernels for its device (``AutocastPrivateUse1``), so Accelerate's and
the Trainer's ``bf16=True`` run matmuls in bfloat16 under ``torch.autocast("tpu")``. A Python backend
gets none: every operator fails with ``Could not run 'aten::...' with arguments from the
'Autocasttpu' backend``. The simulator registers a fallthrough for that key (operators run as they
are) and, for the operators CPU autocast runs in lower precision (matmuls, linear, convolutions,
``scaled_dot_product_attention``), a kernel that casts the floating-point inputs to the autocast
dtype, as PyTorch's own autocast does: a bf16 run on the simulated TPU computes what the same run
under CPU autocast computes.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["LOWER_PRECISION", "register"]

#: Operators run in the autocast dtype (CPU autocast's lower-precision list, the ones models use).
LOWER_PRECISION = (
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "linear", "matmul", "linalg_vecdot", "prelu",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input",
    "scaled_dot_product_attention",
)

_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_LIBRARIES: list[Any] = []


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _lower_precision(op: Any) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype("tpu")
        args = tuple(_cast(a, dtype) for a in args)
        kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)

    return kernel


def _overload(name: str) -> Any:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def register() -> None:
    """Register the fallthrough and the casting kernels (once per process)."""
    if _LIBRARIES:
        return
    fallback = torch.library.Library("_", "IMPL")  # noqa: TOR901 - a process-wide fallthrough is the point
    fallback.fallback(torch.library.fallthrough_kernel, _KEY)
    kernels = torch.library.Library("aten", "IMPL")  # noqa: TOR901
    for name in LOWER_PRECISION:
        op = _overload(name)
        kernels.impl(name, _lower_precision(op), _KEY)
    _LIBRARIES.extend((fallback, kernels))
