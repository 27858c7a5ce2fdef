"""Bytes the simulated TPU's operations read of some tensors (:func:`watch`): how benchmarks weigh a path's weights.

``with reads.watch(tensors) as counter:`` counts, for every operation that takes one of ``tensors`` (or a view of
it) while the block runs, eagerly or inside a compiled graph, the bytes it reads of it:

- a gather (``index.Tensor``, ``index_select``, ``embedding``): the rows it picks (its output's bytes), once per
  picked row, repeats included: ``gate_up_proj[expert_ids]`` reads an expert once per (token, expert) pair;
- any other operation (``mm``, ``bmm``, ``_grouped_mm``...): the whole operand it is given. For
  ``torch._grouped_mm`` on a TPU (XLA's ``chlo.ragged_dot``, whose TPU lowering is not public) that is an upper
  bound: every expert's weights.

JAX kernels run through ``torch.tpu.pallas.jax_op`` count their own reads (``testing.megablox.STATS`` for the
grouped matmul, which reads only the experts that have rows). ``counter.bytes`` is the total, ``counter.by_op``
per operator.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from . import device

__all__ = ["Reads", "watch"]

_aten = torch.ops.aten
_GATHERS = (_aten.index.Tensor, _aten.index_select.default, _aten.embedding.default)
_OPERANDS = (_aten.mm.default, _aten.bmm.default, _aten.addmm.default, _aten.baddbmm.default, _aten._grouped_mm.default,
             _aten.matmul.default, _aten.linear.default, _aten._to_copy.default, _aten.clone.default)
_lock = threading.Lock()


@dataclass
class Reads:
    """Bytes read of the watched tensors, in all and per operator."""

    bytes: int = 0
    by_op: Counter = field(default_factory=Counter)


def _storage(t: Any) -> int | None:
    inner = getattr(t, "_cpu", None)
    return None if inner is None else inner.untyped_storage().data_ptr()


@contextlib.contextmanager
def watch(tensors: Iterable[torch.Tensor]) -> Iterator[Reads]:
    """Count what operations read of ``tensors`` (tpu tensors) while the block runs."""
    storages = {s for s in (_storage(t) for t in tensors) if s is not None}
    counter = Reads()
    handlers = {func: _counting(func, device._SPECIAL.get(func), storages, counter) for func in (*_GATHERS, *_OPERANDS)}
    with _lock:
        saved = {func: device._SPECIAL.get(func) for func in handlers}
        for func, handler in handlers.items():
            device._SPECIAL[func] = handler
            device._INFO.pop(func, None)
    try:
        yield counter
    finally:
        with _lock:
            for func, before in saved.items():
                if before is None:
                    device._SPECIAL.pop(func, None)
                else:
                    device._SPECIAL[func] = before
                device._INFO.pop(func, None)


def _counting(func: Any, before: Any, storages: set[int], counter: Reads) -> Any:
    gather = func in _GATHERS

    def count(args: tuple, kwargs: dict) -> Any:
        out = before(args, kwargs) if before is not None else device._run_generic(func, args, kwargs)
        if device._get_mode(device._FAKE) is not None:  # traced, not run
            return out
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if func is _aten.embedding.default:
            tensors = tensors[:1]  # the weight; the indices are read whole
        watched = [t for t in (tensors[:1] if gather else tensors) if _storage(t) in storages]
        if watched:
            read = out.numel() * out.element_size() if gather else sum(t.numel() * t.element_size() for t in watched)
            with _lock:
                counter.bytes += read
                counter.by_op[str(func)] += read
        return out

    return count
