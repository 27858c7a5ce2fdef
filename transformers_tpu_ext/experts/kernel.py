"""JAX's megablox grouped matmul as three torch ops (``torch.tpu.pallas.jax_op``), differentiable.

- ``transformers_tpu_ext::megablox_gmm`` ``(lhs [m, k], rhs [groups, k, n], group_sizes [groups]) -> [m, n]``
  and ``megablox_gmm_t`` (``rhs [groups, n, k]``, the layout of ``nn.Linear``-style expert weights): row ``i`` of
  ``lhs``, in group ``g``, times expert ``g``'s weights; rows past ``sum(group_sizes)`` are left as the kernel
  leaves them (not computed: the caller masks them).
- ``megablox_tgmm`` ``(lhs_t [k, m], grad [m, n], group_sizes) -> [groups, k, n]``: the weights' gradient.

The two ``gmm`` ops carry their backward (``register_autograd``): the input's gradient is the other ``gmm``
(the weights' other transposition), the weights' ``tgmm``, as megablox's own ``ops.gmm`` VJP computes them.
The tiling comes from the shapes (``experts.policy.tiling``), so the three ops are all there is: they are
registered once, when the first experts call takes the kernel path, outside any trace.

torch-tpu's ``jax_op`` reads the JAX function's annotations (``inspect.signature(..., eval_str=True)``): every
parameter annotated, a valid return annotation; JAX's own kernels carry none, so each is wrapped in an annotated
function here. This module does not use ``from __future__ import annotations``: the annotations are the
``jax.Array`` objects themselves, made after JAX is imported.
"""

import functools
import importlib
import threading
from typing import Any

__all__ = ["NAMES", "op", "register"]

#: The ops' names in ``torch.ops.transformers_tpu_ext``.
NAMES = {"gmm": "megablox_gmm", "gmm_t": "megablox_gmm_t", "tgmm": "megablox_tgmm"}

_lock = threading.Lock()
_ops: dict[str, Any] = {}


def register() -> bool:
    """Register the three ops (once; outside any trace: ``experts.runtime`` runs it as a constant)."""
    with _lock:
        if not _ops:
            _register()
    return True


def op(name: str) -> Any:
    """The registered op ``name`` (``"gmm"``, ``"gmm_t"``, ``"tgmm"``), as a trace sees it."""
    import torch

    return getattr(torch.ops.transformers_tpu_ext, NAMES[name])


def _functions() -> tuple[Any, Any]:
    import jax

    from . import policy

    backend = importlib.import_module(policy.KERNEL)

    def gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, transpose_rhs: bool) -> jax.Array:
        n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
        tiles = policy.tiling(lhs.shape[0], lhs.shape[1], n)
        return backend.gmm(
            lhs, rhs, group_sizes, preferred_element_type=lhs.dtype, tiling=tiles, transpose_rhs=transpose_rhs
        )

    def tgmm(lhs_t: jax.Array, grad: jax.Array, group_sizes: jax.Array) -> jax.Array:
        k, m = lhs_t.shape
        tm, tk, tn = policy.tiling(m, k, grad.shape[1])
        return backend.tgmm(lhs_t, grad, group_sizes, preferred_element_type=lhs_t.dtype, tiling=(tm, tk, tn))

    return gmm, tgmm


def _register() -> None:
    import torch

    gmm, tgmm = _functions()
    jax_op = torch.tpu.pallas.jax_op
    made = {
        "gmm": jax_op(f"transformers_tpu_ext::{NAMES['gmm']}", functools.partial(gmm, transpose_rhs=False)),
        "gmm_t": jax_op(f"transformers_tpu_ext::{NAMES['gmm_t']}", functools.partial(gmm, transpose_rhs=True)),
        "tgmm": jax_op(f"transformers_tpu_ext::{NAMES['tgmm']}", tgmm),
    }
    for name, transposed in (("gmm", False), ("gmm_t", True)):
        made[name].register_autograd(functools.partial(_backward, transposed), setup_context=_setup_context)
    _ops.update(made)


def _setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
    ctx.save_for_backward(*inputs)


def _backward(transposed: bool, ctx: Any, grad: Any) -> tuple[Any, Any, None]:
    lhs, rhs, group_sizes = ctx.saved_tensors
    grad = grad.contiguous()
    # d lhs = grad @ W_g^T: the gmm of the weights' other transposition, on the same groups
    d_lhs = op("gmm" if transposed else "gmm_t")(grad, rhs, group_sizes)
    d_rhs = op("tgmm")(lhs.t().contiguous(), grad, group_sizes)  # [groups, k, n]: lhs_g^T @ grad_g
    return d_lhs, d_rhs.transpose(1, 2) if transposed else d_rhs, None
