"""Which host (CPU) tensors an operator on the simulated TPU accepts next to TPU tensors.

A device refuses an operator that mixes a CPU tensor with device tensors ("tensor is expected to be
on tpu, got cpu", the error of the public TPU test report), except where PyTorch's own rules for a
device backend take host tensors:

- transfers (``_to_copy``, ``copy_``, ``set_``...): their point is to cross;
- a 0-dim CPU tensor is a *CPU scalar* in element-wise operators (``torch.Tag.pointwise``: TensorIterator
  reads it as a number) and as the value of the operators that read one number
  (``masked_fill``, ``fill_``, ``index_fill``, ``index_put_``), and in the lists of ``_foreach_*`` (run pair
  by pair where a list holds CPU scalars);
- the index tensors of advanced indexing (``index``, ``index_put_``) may stay on the CPU.

Everything else is refused, 0-dim or not: a 0-dim CPU tensor given to ``mm``, ``cat``, ``embedding``,
``index_select`` or ``gather`` fails on a device. (torch_tpu's notes say nothing about CPU scalars;
these are PyTorch's rules for every backend, which torch_tpu's TensorIterator-based operators follow.)

Plain data in, plain data out: :func:`host_rule` reads an operator's name, overload and tags.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["HostRule", "host_rule"]

#: Operators that read one number from a 0-dim value tensor (``name`` of ``aten::name.overload``).
SCALAR_VALUE_OPS = frozenset({
    "masked_fill", "masked_fill_", "fill", "fill_", "index_fill", "index_fill_",
    "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put",  # ``x[mask] = 0.5``: the value is a 0-dim CPU tensor
})
#: Operators whose ``Tensor?[] indices`` may be CPU tensors.
INDEXING_OPS = frozenset({"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put"})


class HostRule(NamedTuple):
    scalars: bool  # a 0-dim CPU tensor is accepted as a number
    indices: bool  # CPU tensors are accepted inside the operator's tensor lists (indexing)


def host_rule(name: str, overload: str, pointwise: bool) -> HostRule:
    """``name`` without its ``aten::`` namespace; ``pointwise``: the operator has ``torch.Tag.pointwise``."""
    # ``_foreach_*``: a device runs a list with CPU scalars pair by pair (PyTorch's slow path), each pair an
    # element-wise operator; torch.optim's compiled Adam divides by a list of 0-dim CPU step corrections.
    scalars = pointwise or name in SCALAR_VALUE_OPS or name.startswith("_foreach_")
    return HostRule(scalars=scalars, indices=name in INDEXING_OPS)
