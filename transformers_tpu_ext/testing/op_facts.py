"""Per-operator facts of the simulated device, computed once per ``OpOverload`` (:func:`_info`)."""

from __future__ import annotations

from typing import Any

import torch

from .mixing import host_rule

_aten = torch.ops.aten

class _OpInfo:
    __slots__ = ("counted", "mutable", "generator", "mixed_ok", "host", "special", "written", "refused")

    def __init__(self, func: Any) -> None:
        schema = func._schema
        name = schema.name
        self.mutable = bool(schema.is_mutable)
        # Arguments the operator writes in place: their device memory gets a new handle (see
        # ``_device_storage``). c10d's collectives write their tensors in place without saying so.
        collective = name.startswith("c10d::")
        self.written = tuple(
            (i, a.name)
            for i, a in enumerate(schema.arguments)
            if (a.alias_info is not None and a.alias_info.is_write) or (collective and "Tensor" in str(a.type))
        )
        # What torch_tpu's ProcessGroupTpu does not implement (internals Q7).
        self.refused = _REFUSED_COLLECTIVES.get(name)
        self.generator = any(a.name == "generator" for a in schema.arguments)
        # Views, aliases and transfers compile no program on the device.
        self.counted = not (
            getattr(func, "is_view", False)
            or func in _UNCOUNTED
            or name.startswith("aten::_foreach")  # counted per tensor below, not as a fused op
        )
        # Transfers take host tensors; other ops only CPU scalars and indices where PyTorch allows them (``mixing``).
        self.mixed_ok = func in _MIXED_OK
        self.host = host_rule(name.partition("::")[2], schema.overload_name, torch.Tag.pointwise in func.tags)
        # Transfers and scalar reads have their own handlers (they count host<->device bytes).
        self.special = _SPECIAL.get(func)


_UNCOUNTED = {
    _aten._to_copy.default,
    _aten.copy_.default,
    _aten.detach.default,
    _aten.alias.default,
    _aten.lift_fresh.default,
    _aten._local_scalar_dense.default,
    _aten.empty.memory_format,
    _aten.empty_strided.default,
    _aten.empty_like.default,
    _aten.new_empty.default,
    _aten.new_empty_strided.default,
    _aten.set_.source_Tensor,
    _aten.is_pinned.default,
    _aten.is_same_size.default,
}
_MIXED_OK = {
    _aten._to_copy.default,
    _aten.copy_.default,
    _aten.set_.source_Tensor,
    _aten.is_same_size.default,
    _aten.lift_fresh.default,
}

#: c10d operators ProcessGroupTpu lacks, with the error c10d's ``Backend`` base class raises for them.
_REFUSED_COLLECTIVES = {
    f"c10d::{op}": f"Backend tpu_dist does not support {what}"
    for op, what in (
        ("reduce_", "reduce"),
        ("allreduce_coalesced_", "allreduce_coalesced"),
        ("allgather_coalesced_", "allgather_coalesced"),
        ("recv_any_source_", "recvAnysource"),
    )
}

_INFO: dict[Any, _OpInfo] = {}
_SPECIAL: dict[Any, Any] = {}  # filled below, once the handlers are defined


def _info(func: Any) -> _OpInfo:
    info = _INFO.get(func)
    if info is None:
        info = _INFO[func] = _OpInfo(func)
    return info
