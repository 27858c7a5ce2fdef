"""Saving and loading tpu tensors on the simulated TPU (``torch.save`` / ``torch.load``), as torch_tpu does.

A torch_tpu tensor has a real storage on ``tpu`` whose data pointer is an opaque handle
(internals Q1), and torch_tpu adds no serialization hooks: ``torch.save`` writes each storage with
location ``tpu:0`` and reads its bytes with ``storage.cpu()``; ``torch.load`` restores a ``tpu``
location with ``storage.to("tpu")`` and rebuilds each tensor with ``set_``. ``TpuTensor.__reduce_ex__``
hands torch the device storage (``device._device_storage``), and the simulator's ``set_`` reads it.
What a Python backend cannot do is allocate a storage on the device (``storage.to("tpu")`` would):
the simulator's deserializer turns the host copy torch read from the file into a device storage
over it instead. ``map_location`` is honoured both ways: ``"cpu"`` gives host tensors, ``"tpu"``
puts tensors saved from the CPU on the TPU.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]

#: Before PyTorch's own PrivateUse1 deserializer (priority 23; lower runs first; 22 is meta's).
_PRIORITY = 22.5

_registered = False


def _no_tag(obj: Any) -> None:
    return None


def _to_device(obj: Any, location: str) -> Any:
    if isinstance(location, str) and location.split(":", 1)[0] == "tpu":
        from .device import _device_storage

        if obj.device.type == "cpu":
            return _device_storage(obj)
        return obj
    return None


def register() -> None:
    """Register the deserializer (once per process)."""
    global _registered
    if _registered:
        return
    import torch.serialization

    torch.serialization.register_package(_PRIORITY, _no_tag, _to_device)
    _registered = True
