"""JAX's megablox grouped matmul on the simulated TPU: lowered for the chip, run as its reference, its reads counted.

A JAX function run through ``torch.tpu.pallas.jax_op`` that calls megablox's ``gmm`` or ``tgmm``
(``jax.experimental.pallas.ops.tpu.megablox.gmm``) cannot run its Pallas TPU kernel on a CPU. The simulator:

1. **lowers** the function for the simulated chip once per input shapes (``testing.pallas``, as for every kernel
   it knows: the kernel's own argument checks, then Pallas' TPU lowering, which refuses block shapes whose last
   two dimensions neither divide by (8, 128) nor equal the array's), as a chip compiles it on the first call;
2. **runs** it with ``gmm`` and ``tgmm`` (looked up on their module when called; a reference taken before, such
   as megablox's own ``ops.gmm``, runs the Pallas kernel and fails on the CPU) replaced by their definitions (``lhs[rows of group g] @ rhs[g]``;
   ``lhs_t[:, rows of g] @ rhs[rows of g]``), accumulated in float32 and cast to ``preferred_element_type`` as the
   kernel does. Rows no group covers (past ``sum(group_sizes)``) are left as the kernel leaves them, unwritten:
   NaN here, so a caller that reads them shows it;
3. **counts** what ``gmm`` reads of ``rhs`` (the weights) in :data:`STATS`, from the kernel's grid: for each
   ``tn`` column block, the row tiles in order, each visited once per group with rows in it (the kernel's
   ``make_group_metadata``), each visit walking the ``tk`` blocks; Pallas' TPU pipeline copies a block only when
   its index differs from the previous grid step's. ``selected_bytes`` is the floor: each group that has rows,
   read once.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["GmmStats", "MODULE", "STATS", "gmm_weight_reads", "imported", "on_cpu"]

MODULE = "jax.experimental.pallas.ops.tpu.megablox.gmm"


@dataclass
class GmmStats:
    """What the simulated megablox calls did: calls, weight bytes read, the selected experts' bytes (the floor)."""

    gmm_calls: int = 0
    tgmm_calls: int = 0
    weight_bytes_read: int = 0
    selected_bytes: int = 0

    def reset(self) -> None:
        self.gmm_calls = self.tgmm_calls = self.weight_bytes_read = self.selected_bytes = 0


STATS = GmmStats()
_lock = threading.RLock()


def gmm_weight_reads(group_sizes: list[int], k: int, n: int, tiling: tuple[int, int, int], itemsize: int) -> int:
    """Bytes of ``rhs`` (``[groups, k, n]``, or its transposition) ``gmm`` reads for these group sizes."""
    tm, tk, tn = tiling
    visits = []  # (row tile, group) in grid order: groups in order, each over the row tiles its rows touch
    start = 0
    for group, size in enumerate(group_sizes):
        if size > 0:
            visits.extend((tile, group) for tile in range(start // tm, (start + size - 1) // tm + 1))
        start += size
    total = 0
    for n_i in range(-(-n // tn)):
        previous = None
        for _, group in visits:
            for k_i in range(-(-k // tk)):
                if (group, k_i, n_i) != previous:
                    total += min(tk, k - k_i * tk) * min(tn, n - n_i * tn) * itemsize
                    previous = (group, k_i, n_i)
    return total


def _module() -> Any:
    return sys.modules.get(MODULE)


def imported() -> bool:
    """Whether megablox's module is imported (a JAX function may call its kernels)."""
    return _module() is not None


@contextlib.contextmanager
def on_cpu() -> Any:
    """While a JAX function runs on the CPU: ``gmm`` and ``tgmm`` are their definitions (nothing when megablox
    is not imported)."""
    module = _module()
    if module is None:
        yield
        return
    with _lock:
        saved = module.gmm, module.tgmm
        module.gmm, module.tgmm = _gmm, _tgmm
        try:
            yield
        finally:
            module.gmm, module.tgmm = saved


def _rows(group_sizes: Any) -> list[int]:
    import numpy as np

    return [int(s) for s in np.asarray(group_sizes)]


def _gmm(lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any = None, tiling: Any = (128, 128, 128),
         group_offset: Any = None, existing_out: Any = None, transpose_rhs: bool = False, interpret: bool = False) -> Any:
    import jax.numpy as jnp
    import numpy as np

    if group_offset is not None or existing_out is not None:
        raise NotImplementedError("the simulated megablox gmm takes no group_offset or existing_out")
    sizes = _rows(group_sizes)
    m, k = lhs.shape
    weights = np.asarray(jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs, dtype=np.float32)  # [groups, k, n]
    n = weights.shape[2]
    left = np.asarray(lhs, dtype=np.float32)
    out = np.full((m, n), np.nan, dtype=np.float32)  # rows no group covers: unwritten
    start = 0
    for group, size in enumerate(sizes):
        if size:
            out[start : start + size] = left[start : start + size] @ weights[group]
        start += size
    if callable(tiling):
        tiling = tiling(m, k, n)
    with _lock:
        STATS.gmm_calls += 1
        STATS.weight_bytes_read += gmm_weight_reads(sizes, k, n, tuple(tiling), rhs.dtype.itemsize)
        STATS.selected_bytes += sum(1 for s in sizes if s) * k * n * rhs.dtype.itemsize
    return jnp.asarray(out).astype(preferred_element_type or jnp.float32)


def _tgmm(lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any = None, tiling: Any = (128, 128, 128),
          group_offset: Any = None, num_actual_groups: Any = None, existing_out: Any = None, interpret: bool = False) -> Any:
    import jax.numpy as jnp
    import numpy as np

    if group_offset is not None or existing_out is not None or num_actual_groups not in (None, len(_rows(group_sizes))):
        raise NotImplementedError("the simulated megablox tgmm takes no group_offset, num_actual_groups or existing_out")
    sizes = _rows(group_sizes)
    left, right = np.asarray(lhs, dtype=np.float32), np.asarray(rhs, dtype=np.float32)  # [k, m], [m, n]
    out = np.zeros((len(sizes), left.shape[0], right.shape[1]), dtype=np.float32)  # empty groups: zeros
    start = 0
    for group, size in enumerate(sizes):
        out[group] = left[:, start : start + size] @ right[start : start + size]
        start += size
    with _lock:
        STATS.tgmm_calls += 1
    return jnp.asarray(out).astype(preferred_element_type or jnp.float32)
