"""Device memory as torch_tpu shows it: storages whose data pointer is an opaque handle."""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

from .device_state import STATE

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
            STATE.handles_issued = True
            handle = _HANDLE_BASE + (next(_handles) % _HANDLE_SLOTS) * _HANDLE_STRIDE
            setattr(host, _HANDLE, handle)
        storage = torch._C._construct_storage_from_data_pointer(handle, STATE.device, host.nbytes())
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
