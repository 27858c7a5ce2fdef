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
for: ``torch.empty(..., pin_memory=True)``, and DDP's reducer, which with
``find_unused_parameters=True`` copies its map of used parameters through a pinned buffer at every
step. For DDP, the simulator builds the reducer of a TPU module without ``find_unused_parameters``
(one warning): the gradients are the same whenever every parameter receives one.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

__all__ = ["DDP_WARNING", "register"]

_aten = torch.ops.aten
_UPSTREAM = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)

#: storage address -> the pinned tensor that owns it (an entry dies with its tensor).
_PINNED: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
_LIBRARY: Any = None

DDP_WARNING = (
    "simulated TPU: DistributedDataParallel(find_unused_parameters=True) needs a pinned host allocator "
    "that a Python backend cannot register; the reducer is built without it (every parameter must "
    "receive a gradient in every step)"
)


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


def _ddp_without_unused_map(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    module = args[0] if args else kwargs.get("module")
    if kwargs.get("find_unused_parameters") and any(p.device.type == "tpu" for p in module.parameters()):
        warnings.warn(DDP_WARNING, stacklevel=3)
        kwargs = {**kwargs, "find_unused_parameters": False}
    return wrapped(*args, **kwargs)


def register() -> None:
    """Register the CPU kernels and the DDP adjustment (once per process)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    import wrapt

    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - a process-wide kernel is the point
    lib.impl("_pin_memory", _pin_memory, "CPU")
    lib.impl("is_pinned", _is_pinned, "CPU")
    wrapt.wrap_function_wrapper(
        "torch.nn.parallel.distributed", "DistributedDataParallel.__init__", _ddp_without_unused_map
    )
    _LIBRARY = lib
