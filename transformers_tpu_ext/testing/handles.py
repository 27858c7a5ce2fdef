"""Device memory as torch_tpu shows it to code outside PyTorch: storages whose data pointer is an opaque handle.

``TpuTensor.untyped_storage()``, ``.storage()`` and ``.data_ptr()`` (in ``device``) answer through
:func:`_device_storage` for callers outside torch (internals Q1): the same handle for every tensor
sharing the memory, a new one after every in-place write (:func:`_written`, :func:`_mark_written`,
called by the dispatcher), nothing readable through it. PyTorch's own code keeps the wrapper's storage;
FSDP2 gets the data's storage, which it resizes.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from typing import Any

import torch

from . import device as _d

__all__: list[str] = []


def _user_caller(t: Any) -> bool:
    if type(t._cpu) is not torch.Tensor or _d._get_mode(_d._FAKE) is not None:
        return False
    caller = sys._getframe(2).f_globals.get("__name__", "")
    return caller != "torch" and not caller.startswith("torch.")


#: Modules that free and re-allocate device memory through ``untyped_storage().resize_()``.
_STORAGE_RESIZERS = ("torch.distributed.fsdp.",)


def _fsdp_caller(t: Any) -> bool:
    """FSDP2 frees its all-gather buffers with ``untyped_storage().resize_(0)`` and re-allocates them
    the same way: it gets the data's storage, which can be resized (the wrapper's own is empty)."""
    if type(t._cpu) is not torch.Tensor or _d._get_mode(_d._FAKE) is not None:
        return False
    return sys._getframe(2).f_globals.get("__name__", "").startswith(_STORAGE_RESIZERS)


#: Handles are non-canonical addresses (reading through one faults instead of finding host data),
#: 4 GiB apart so that ``handle + offset`` of one storage never reaches the next; all below 2**63.
_HANDLE_BASE = 0x5450_0000_0000_0000
_HANDLE_STRIDE = 1 << 32
_HANDLE_SLOTS = 1 << 28
_handles = itertools.count(1)
_HANDLE = "_tpu_handle"  # on a host storage: the handle of its memory until the next write
_DEVICE_STORAGE = "_tpu_device_storage"  # on a host storage: weakref to the device storage showing it
_HOST = "_tpu_host"  # on a device storage: the host storage that holds its data


def _device_storage(host: Any) -> Any:
    """The ``tpu`` storage user code sees for the host storage ``host``: its data pointer is a handle
    that stays the same until the next in-place write to that memory, then is a new one. (Attributes
    live on the storages' Python objects, which PyTorch keeps as long as the storage lives.)"""
    handle = getattr(host, _HANDLE, None)
    ref = getattr(host, _DEVICE_STORAGE, None)
    storage = ref() if ref is not None and handle is not None else None
    if storage is None:
        if handle is None:
            _d.STATE.handles_issued = True
            handle = _HANDLE_BASE + (next(_handles) % _HANDLE_SLOTS) * _HANDLE_STRIDE
            setattr(host, _HANDLE, handle)
        storage = torch._C._construct_storage_from_data_pointer(handle, _d.STATE.device, host.nbytes())
        setattr(storage, _HOST, host)
        setattr(host, _DEVICE_STORAGE, weakref.ref(storage))
    return storage


def _host_storage(storage: Any) -> Any:
    """The host storage behind a device storage from :func:`_device_storage`, or ``None``."""
    return getattr(storage, _HOST, None)


def _written(tensor: Any) -> None:
    """``tensor`` (a TpuTensor) was written in place: its memory gets a new handle."""
    inner = tensor._cpu
    if type(inner) is torch.Tensor:
        host = inner.untyped_storage()
        if getattr(host, _HANDLE, None) is not None:
            setattr(host, _HANDLE, None)


def _mark_written(info: Any, args: tuple, kwargs: dict) -> None:
    for index, name in info.written:
        value = args[index] if index < len(args) else kwargs.get(name)
        if isinstance(value, _d.TpuTensor):
            _written(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, _d.TpuTensor):
                    _written(item)
                elif isinstance(item, (list, tuple)):
                    for x in item:
                        if isinstance(x, _d.TpuTensor):
                            _written(x)

