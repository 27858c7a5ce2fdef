"""PyTorch: an optimizer never updates TPU replicas that nothing synchronises.

``accelerator.prepare(model)`` refuses a model no data-parallel wrapper synchronises
(``accelerate_prepare``), but a model moved to the chip by hand (``model.to(accelerator.device)``)
with only the optimizer and the loader prepared never goes through it: each process reads its own
shard of the data, gradients are never all-reduced, and the replicas silently diverge. So a global
optimizer step pre-hook (``torch.optim.optimizer.register_optimizer_step_pre_hook``: every
``Optimizer.step``, prepared or not, Trainer or plain loop) checks each optimizer once, at its first
step, before any update: on the TPU process group with several processes, a trainable TPU parameter
that is neither in a ``DistributedDataParallel`` (the ``torch_ddp`` patch records their modules) nor
sharded (a DTensor: FSDP2, tensor parallelism) raises ``RuntimeError`` saying what to do
(:func:`multiprocess.step_replica_problem`).

Anything else passes untouched: one process, another backend, host parameters, and runs where the
``torch_ddp`` patch is off (nothing then tells which parameters DDP owns). A step TorchDynamo traces
(the plugin compiles some optimizer steps) is not checked; such steps come from
``accelerator.prepare``, whose own check covers the model.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from . import multiprocess
from . import patch_torch_ddp
from ..core.relies import Signature
from ..core.wrapping import warn_once

NAME = "torch_optimizer"
TARGET = "torch.optim.optimizer"
DISTRIBUTION = "torch"
RELIES_ON = (
    Signature("register_optimizer_step_pre_hook", positional=("hook",)),  # hook(optimizer, args, kwargs)
)

_handle: Any = None
#: Optimizers already checked (optimizers compare by identity).
_checked: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _torch() -> Any:
    return sys.modules["torch"]


def _process_group() -> tuple[int, str | None]:
    dist = _torch().distributed
    if not (dist.is_available() and dist.is_initialized()):
        return 1, None
    return dist.get_world_size(), str(dist.get_backend())


def _counts(optimizer: Any) -> tuple[int, int]:
    """(trainable TPU parameters, those neither in a DDP module nor DTensors)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        DTensor = ()  # noqa: N806
    synchronised = patch_torch_ddp.ddp_parameter_ids()
    trainable = unsynchronised = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not getattr(param, "requires_grad", False) or getattr(param.device, "type", None) != "tpu":
                continue
            trainable += 1
            if not isinstance(param, DTensor) and id(param) not in synchronised:
                unsynchronised += 1
    return trainable, unsynchronised


def _check(optimizer: Any) -> str | None:
    world, backend = _process_group()
    if world <= 1 or not patch_torch_ddp.tracks_ddp():
        return None
    trainable, unsynchronised = _counts(optimizer)
    return multiprocess.step_replica_problem(
        world_size=world, backend=backend, trainable=trainable, unsynchronised=unsynchronised,
        optimizer=type(optimizer).__name__,
    )


def _pre_step(optimizer: Any, args: tuple, kwargs: dict) -> None:
    if _torch().compiler.is_compiling():
        return None
    if optimizer in _checked:
        return None
    try:
        problem = _check(optimizer)
    except Exception as error:  # noqa: BLE001 - a bug of ours never breaks a step
        warn_once(f"checking the optimizer's replicas failed ({type(error).__name__}: {error})")
        problem = None
    if problem:  # raised at every step until the model is synchronised
        raise RuntimeError(f"transformers-tpu-ext: {problem}")
    _checked.add(optimizer)
    return None


def apply(module: Any) -> None:
    global _handle
    if _handle is not None:
        return
    _handle = module.register_optimizer_step_pre_hook(_pre_step)


def revert() -> None:
    global _handle
    if _handle is not None:
        _handle.remove()
        _handle = None
    _checked.clear()
