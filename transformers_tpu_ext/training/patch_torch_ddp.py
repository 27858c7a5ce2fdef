"""PyTorch: ``DistributedDataParallel`` of a TPU module takes no device ids.

torch_tpu runs one process per chip and every process sees its chip as ``tpu:0``, so DDP needs
``device_ids=None``. Code written for GPUs passes the local rank instead (``DDP(model,
device_ids=[local_rank])``), and so does Accelerate's ``prepare_model`` for every multi-accelerator
type: rank 1 would then move its inputs to ``tpu:1``, a chip it does not own. For a module whose
parameters are on the TPU, the wrapper drops ``device_ids`` and ``output_device`` (the module
already is on the process's only chip, and the batches are moved there by the data loader).
Anything else goes to DDP unchanged.

Every ``DistributedDataParallel`` made while the patch is applied is remembered (weakly): the
``torch_optimizer`` patch asks :func:`ddp_parameter_ids` which parameters a DDP synchronises.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from .. import backend
from ..core.relies import Signature
from ..core.wrapping import Wraps, fail_safe

NAME = "torch_ddp"
TARGET = "torch.nn.parallel.distributed"
DISTRIBUTION = "torch"
RELIES_ON = (
    # The wrapper reads args[0] / module=, and args[1:3] / device_ids=, output_device= (_POSITIONAL).
    Signature(
        "DistributedDataParallel.__init__",
        ("module", "device_ids", "output_device"),
        positional=("module", "device_ids", "output_device"),
    ),
)

_wraps = Wraps()

_POSITIONAL = ("device_ids", "output_device")  # DDP.__init__(module, device_ids=None, output_device=None, ...)

#: The DDP instances made since the patch was applied (modules compare by identity).
_made: "weakref.WeakSet[Any]" = weakref.WeakSet()


def tracks_ddp() -> bool:
    """Whether DDP instances are being recorded (the patch is applied)."""
    return bool(_wraps)


def ddp_parameter_ids() -> set[int]:
    """``id()`` of every parameter of the modules the live DDP instances synchronise."""
    return {id(p) for ddp in list(_made) for p in ddp.module.parameters()}


def _module_on_tpu(module: Any) -> bool:
    parameters = getattr(module, "parameters", None)
    if parameters is None:
        return False
    return any(backend.is_tpu(p) for p in parameters())


def _without_device_ids(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    module = args[0] if args else kwargs.get("module")
    named = {name: (args[i + 1] if len(args) > i + 1 else kwargs.get(name)) for i, name in enumerate(_POSITIONAL)}
    if any(named.values()) and backend.tpu_available() and _module_on_tpu(module):
        args = args[:1] + tuple(None for _ in args[1 : 1 + len(_POSITIONAL)]) + args[1 + len(_POSITIONAL) :]
        kwargs = {**kwargs, **{name: None for name in _POSITIONAL if name in kwargs}}
    result = wrapped(*args, **kwargs)
    _made.add(instance)
    return result


_wrapper = fail_safe(_without_device_ids)


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "DistributedDataParallel.__init__", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
    _made.clear()
