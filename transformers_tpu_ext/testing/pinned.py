"""Pinned host memory for the simulated TPU, as torch_tpu registers a pinned host allocator.

PyTorch pins host memory for the current accelerator through that backend's hooks
(``getPinnedMemoryAllocator``), which a Python backend cannot provide: without this module,
``tensor.pin_memory()`` raises ``NotImplementedError`` once the simulator is installed, and so do
DataLoaders with ``pin_memory=True`` (Trainer's default ``dataloader_pin_memory``).

The simulator registers CPU kernels for ``aten::_pin_memory`` and ``aten::is_pinned``: pinning for
the TPU (``device=None`` or ``"tpu"``) returns a host copy with the same sizes and strides, which
``is_pinned()`` then reports as pinned (as real pinned memory; its views included). Any other device
(``pin_memory("cuda")`` next to a real GPU) goes to PyTorch's own kernels. Nothing is counted: pinning
is a host-to-host copy.

What a Python backend cannot offer is the allocator itself, which C++ code asks the backend's hooks
for: ``torch.empty(..., pin_memory=True)`` still raises. One C++ caller matters: DDP's reducer with
``find_unused_parameters=True``, which copies its map of used parameters through a pinned host buffer
(``empty_like(..., pin_memory=True)``) before it all-reduces the map on the device, at every step. On a
chip, torch_tpu's ``TpuPinnedAllocator`` serves that buffer and ``tpu_dist`` all-reduces the map, so
DDP finds unused parameters as on a GPU. The simulator serves it too: while a
``DistributedDataParallel(find_unused_parameters=True)`` of a TPU module is alive, a ``BackendSelect``
kernel of ``aten::empty_strided`` answers ``pin_memory=True`` on the host with a pinned copy as above
(every other call goes on to its backend, at some cost per call: it is registered only then).
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

__all__ = ["pinned_host_buffers", "register"]

_aten = torch.ops.aten
_UPSTREAM = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)

#: storage address -> the pinned tensor that owns it (an entry dies with its tensor).
_PINNED: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
_LIBRARY: Any = None


def _for_tpu(device: Any) -> bool:
    if device is None:
        current = torch.accelerator.current_accelerator()
        return current is not None and current.type == "tpu"
    return torch.device(device).type == "tpu"


def _storage_address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _pin_memory(tensor: torch.Tensor, device: Any = None) -> torch.Tensor:
    if not _for_tpu(device):
        return _aten._pin_memory.default.redispatch(_UPSTREAM, tensor, device)
    pinned = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device="cpu")
    pinned.copy_(tensor)
    if pinned.untyped_storage().nbytes():
        _PINNED[_storage_address(pinned)] = pinned
    return pinned


def _is_pinned(tensor: torch.Tensor, device: Any = None) -> bool:
    if not _for_tpu(device):
        return bool(_aten.is_pinned.default.redispatch(_UPSTREAM, tensor, device))
    if not tensor.untyped_storage().nbytes():
        return False
    return _PINNED.get(_storage_address(tensor)) is not None


def _backend_keys(device: Any) -> Any:
    """The dispatch keys ``BackendSelect`` passes a factory call on to (``computeDispatchKey``)."""
    name = torch._C._dispatch_key_for_device(torch.device(device).type if device is not None else "cpu")
    return torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, name))


def _empty_strided(size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> Any:
    keys = _backend_keys(device)
    if not pin_memory or (device is not None and torch.device(device).type != "cpu") or not _for_tpu(None):
        return _aten.empty_strided.default.redispatch(keys, size, stride, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)
    pinned = _aten.empty_strided.default.redispatch(keys, size, stride, dtype=dtype, layout=layout, device=device, pin_memory=False)
    if pinned.untyped_storage().nbytes():
        _PINNED[_storage_address(pinned)] = pinned
    return pinned


#: The BackendSelect library while a pinned-buffer user is alive, and how many are.
_PINNED_EMPTY: dict[str, Any] = {"library": None, "users": 0}


def _release_pinned_empty() -> None:
    _PINNED_EMPTY["users"] -= 1
    if _PINNED_EMPTY["users"] == 0 and _PINNED_EMPTY["library"] is not None:
        _PINNED_EMPTY["library"]._destroy()
        _PINNED_EMPTY["library"] = None


def pinned_host_buffers(owner: Any) -> None:
    """Serve ``empty_strided(..., pin_memory=True)`` on the host for as long as ``owner`` lives."""
    if _PINNED_EMPTY["library"] is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Overriding a previously registered kernel"
            lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - a process-wide kernel is the point
            lib.impl("empty_strided", _empty_strided, "BackendSelect")
        _PINNED_EMPTY["library"] = lib
    _PINNED_EMPTY["users"] += 1
    weakref.finalize(owner, _release_pinned_empty)


def _ddp_finds_unused_parameters(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    # ``_ddp_init_helper`` builds the reducer; ``__init__`` is the plugin's to wrap (and unwrap).
    if instance.find_unused_parameters and any(p.device.type == "tpu" for p in instance.module.parameters()):
        pinned_host_buffers(instance)
    return wrapped(*args, **kwargs)


def register() -> None:
    """Register the CPU kernels, and the pinned buffers of DDP's ``find_unused_parameters`` (once per process)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    import wrapt

    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - a process-wide kernel is the point
    lib.impl("_pin_memory", _pin_memory, "CPU")
    lib.impl("is_pinned", _is_pinned, "CPU")
    wrapt.wrap_function_wrapper(
        "torch.nn.parallel.distributed", "DistributedDataParallel._ddp_init_helper", _ddp_finds_unused_parameters
    )
    _LIBRARY = lib
