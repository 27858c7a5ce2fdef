"""Transfers between the host and the simulated TPU, with the bytes they move counted.

The dispatcher's special handlers (``device._SPECIAL``): ``copy_`` and ``_to_copy`` (``.to()``,
``.cpu()``, ``torch.tensor(..., device="tpu")``), ``_local_scalar_dense`` (``.item()``) and ``set_`` onto
a device storage (how ``storage.cpu()``, ``torch.save`` and ``torch.load`` reach device memory).
"""

from __future__ import annotations

from typing import Any

import torch

from .device import STATE, TpuTensor, _aten, _CPU, _fake_mode_active, _host_view, _is_tpu_wrapper, _run_generic
from .handles import _host_storage, _written

__all__: list[str] = []


def _local_scalar_dense(args: tuple, kwargs: dict) -> Any:
    inner = args[0]._cpu
    if type(inner) is torch.Tensor:
        STATE.d2h_bytes += inner.element_size()
    return _aten._local_scalar_dense.default(inner)



def _copy_(args: tuple, kwargs: dict) -> Any:
    dst, src = args[0], args[1]
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    dst_tpu, src_tpu = _is_tpu_wrapper(dst), _is_tpu_wrapper(src)
    d = dst._cpu if dst_tpu else dst
    s = src._cpu if src_tpu else src
    if not dst_tpu and d.device.type == "tpu":
        d = _host_view(d)
    if not src_tpu and s.device.type == "tpu":
        s = _host_view(s)
    if not _fake_mode_active() and type(d) is torch.Tensor and type(s) is torch.Tensor:
        if dst_tpu and not src_tpu:
            STATE.h2d_bytes += d.numel() * d.element_size()
        elif src_tpu and not dst_tpu:
            STATE.d2h_bytes += d.numel() * d.element_size()
    d.copy_(s, non_blocking)
    if dst_tpu and STATE.handles_issued:
        _written(dst)
    return dst


def _to_copy(args: tuple, kwargs: dict) -> Any:
    src = args[0]
    device = kwargs.get("device")
    target = "tpu" if device is None else torch.device(device).type
    target_tpu = target == "tpu"
    from_tpu = _is_tpu_wrapper(src)
    inner = src._cpu if from_tpu else src
    if inner.device.type == "tpu":
        inner = _host_view(inner)
    new_kwargs = dict(kwargs)
    if target not in ("tpu", "cpu"):
        # ``.to("meta")`` (Accelerate's offload hooks, ``init_empty_weights``) gives a meta tensor
        # and copies nothing, as on a real device.
        return _aten._to_copy.default(inner, **new_kwargs)
    new_kwargs["device"] = _CPU
    out = _aten._to_copy.default(inner, **new_kwargs)
    if target_tpu:
        if not from_tpu and not _fake_mode_active() and type(out) is torch.Tensor:
            STATE.h2d_bytes += out.numel() * out.element_size()
        return TpuTensor._wrap_cpu(out)
    if not _fake_mode_active() and type(out) is torch.Tensor:
        STATE.d2h_bytes += out.numel() * out.element_size()
    return out


def _set_storage(func: Any) -> Any:
    """``set_`` of a tpu tensor onto a device storage (torch_tpu registers ``set_.source_Storage``):
    how torch's own storage paths reach device memory. ``storage.cpu()`` (behind ``torch.save``) is
    ``empty(0, device=tpu).set_(storage)`` then a copy; ``torch.load`` rebuilds each tensor with
    ``empty(0, device=tpu).set_(storage, offset, size, stride)``."""

    def handler(args: tuple, kwargs: dict) -> Any:
        self = args[0]
        source = args[1] if len(args) > 1 else kwargs.get("source")
        host = _host_storage(source)
        if host is None or not _is_tpu_wrapper(self):
            return _run_generic(func, args, kwargs)
        dtype = self.dtype
        if len(args) > 2 or "storage_offset" in kwargs:
            offset = args[2] if len(args) > 2 else kwargs["storage_offset"]
            size = args[3] if len(args) > 3 else kwargs["size"]
            stride = args[4] if len(args) > 4 else kwargs.get("stride", ())
        else:
            offset, size, stride = 0, (host.nbytes() // dtype.itemsize,), ()
        inner = torch.empty(0, dtype=dtype)
        inner = inner.set_(host, offset, size, stride) if stride else inner.set_(host, offset, size)
        # The wrapper takes the new shape on an empty storage large enough for it.
        shell = torch.Tensor._make_wrapper_subclass(TpuTensor, (host.nbytes(),), dtype=torch.uint8, device=STATE.device)
        _aten.set_.source_Storage_storage_offset.redispatch(
            _META_KEYS, self, torch.Tensor.untyped_storage(shell), inner.storage_offset(), inner.size(), inner.stride()
        )
        self._cpu = inner
        return self

    return handler


_META_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
