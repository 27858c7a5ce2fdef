"""Saving and loading tpu tensors on the simulated TPU (``torch.save`` / ``torch.load``).

A tensor of torch_tpu has no storage PyTorch can see: ``torch.save`` writes its host copy and the
device name, and ``torch.load`` rebuilds it with ``_rebuild_device_tensor_from_cpu_tensor``, which
``weights_only=True`` allows and which honours ``map_location``. ``TpuTensor.__reduce_ex__`` does
the same. What a Python backend cannot do is create a *storage* on the device, which
``torch.load(..., map_location="tpu")`` asks for every storage of the file (the host copies
included; PyTorch would segfault): the simulator's deserializer keeps such storages on the host.
A tensor saved from the TPU is then rebuilt on the TPU; a tensor saved from the CPU and loaded with
``map_location="tpu"`` stays on the CPU (on a real TPU it would move; code that uses it with TPU
tensors, like an optimizer's ``load_state_dict``, moves it anyway).
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]

#: Before PyTorch's own PrivateUse1 deserializer (priority 23; lower runs first; 22 is meta's).
_PRIORITY = 22.5

_registered = False


def _no_tag(obj: Any) -> None:
    return None


def _keep_on_host(obj: Any, location: str) -> Any:
    if isinstance(location, str) and location.split(":", 1)[0] == "tpu":
        return obj
    return None


def register() -> None:
    """Register the deserializer (once per process)."""
    global _registered
    if _registered:
        return
    import torch.serialization

    torch.serialization.register_package(_PRIORITY, _no_tag, _keep_on_host)
    _registered = True
