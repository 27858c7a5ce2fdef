"""Autocast on the simulated TPU: ``torch.autocast("tpu", dtype=torch.bfloat16)``, with torch_tpu's policy.

torch_tpu registers autocast kernels for its device (``AutocastPrivateUse1``), so Accelerate's and
the Trainer's ``bf16=True`` run under ``torch.autocast("tpu")``. A Python backend gets none: every
operator fails with ``Could not run 'aten::...' with arguments from the 'Autocasttpu' backend``. The
simulator registers torch_tpu 0.2.0's policy (``eager/amp_policies.cc``; see the reference notes, Q5):

- :data:`LOWER_PRECISION` (matmuls, ``linear``, ``einsum``, convolutions,
  ``scaled_dot_product_attention``): floating-point inputs are cast to the autocast dtype;
- :data:`FLOAT32` (losses, norms, FFTs, ``linalg``): lower-precision inputs are cast to float32, so the
  operator computes (and returns) float32;
- every other operator falls through: it runs in the dtype of its inputs.

CPU autocast's lists differ (its float32 list has the losses and FFTs but no norm and no ``linalg``
decomposition); ``tests/simulator/test_autocast.py`` measures both, operator by operator, and
``docs/simulated-tpu.md`` shows the table.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["FLOAT32", "LOWER_PRECISION", "POLICY", "register"]

#: Operators run in the autocast dtype (torch_tpu's lower_precision_fp list).
LOWER_PRECISION = (
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "einsum",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "scaled_dot_product_attention",
)
#: Operators run in float32 (torch_tpu's fp32 list: losses, norms, FFTs, linear algebra).
FLOAT32 = (
    # losses
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy_loss", "nll_loss", "nll_loss2d",
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "poisson_nll_loss", "ctc_loss",
    "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss", "multi_margin_loss",
    "multilabel_margin_loss", "triplet_margin_loss", "cosine_embedding_loss",
    # norms
    "layer_norm", "group_norm", "batch_norm", "instance_norm", "rms_norm", "norm", "frobenius_norm", "nuclear_norm",
    # FFTs
    "fft_fft", "fft_ifft", "fft_rfft", "fft_irfft", "fft_hfft", "fft_ihfft", "fft_fft2", "fft_ifft2", "fft_rfft2",
    "fft_irfft2", "fft_fftn", "fft_ifftn", "fft_rfftn", "fft_irfftn", "stft", "istft",
    # linear algebra
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_norm", "linalg_inv", "linalg_solve", "linalg_cholesky",
    "linalg_eigh", "linalg_eigvalsh", "linalg_qr", "linalg_svd", "linalg_svdvals", "linalg_det", "linalg_slogdet",
    "linalg_pinv", "linalg_lstsq", "linalg_eig", "linalg_eigvals", "linalg_matrix_rank", "linalg_cond",
    "inverse", "cholesky", "cholesky_solve", "cholesky_inverse", "pinverse", "det", "logdet",
)
#: Operator -> ``"lower"`` or ``"float32"`` (everything else: ``"fallthrough"``).
POLICY: dict[str, str] = {**{name: "lower" for name in LOWER_PRECISION}, **{name: "float32" for name in FLOAT32}}

_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_LOWER_DTYPES = (torch.float16, torch.bfloat16)
_LIBRARIES: list[Any] = []


def _cast(value: Any, dtype: torch.dtype, only: tuple[torch.dtype, ...] | None = None) -> Any:
    """``value`` with its floating-point tensors (not float64, as autocast) cast to ``dtype``;
    ``only``: cast just tensors of these dtypes."""
    if isinstance(value, torch.Tensor):
        eligible = value.is_floating_point() and value.dtype not in (dtype, torch.float64)
        return value.to(dtype) if eligible and (only is None or value.dtype in only) else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype, only) for v in value)
    return value


def _kernel(op: Any, float32: bool) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype, only = (torch.float32, _LOWER_DTYPES) if float32 else (torch.get_autocast_dtype("tpu"), None)
        args = tuple(_cast(a, dtype, only) for a in args)
        kwargs = {k: _cast(v, dtype, only) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)

    return kernel


def _overloads(name: str) -> list[tuple[str, Any]]:
    """``(qualified name, overload)`` for every functional overload of ``aten::name`` this torch has."""
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return []
    found = []
    for overload in packet.overloads():
        op = getattr(packet, overload)
        schema = op._schema
        if overload.startswith("out") or any(a.is_out for a in schema.arguments) or schema.is_mutable:
            continue  # autocast handles functional calls only
        found.append((name if overload == "default" else f"{name}.{overload}", op))
    return found


def register() -> None:
    """Register the fallthrough and the casting kernels (once per process)."""
    if _LIBRARIES:
        return
    fallback = torch.library.Library("_", "IMPL")  # noqa: TOR901 - a process-wide fallthrough is the point
    fallback.fallback(torch.library.fallthrough_kernel, _KEY)
    kernels = torch.library.Library("aten", "IMPL")  # noqa: TOR901
    for name, kind in POLICY.items():
        for qualified, op in _overloads(name):
            kernels.impl(qualified, _kernel(op, float32=kind == "float32"), _KEY)
    _LIBRARIES.extend((fallback, kernels))
