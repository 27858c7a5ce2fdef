"""Accelerate: ``prepare`` never trains unsynchronised replicas on TPU, and prepares the optimizer
so its step compiles once.

On a TPU host, and only there:

- ``Accelerator.prepare_model``: after upstream prepared a model for training, a run whose
  processes would each train their own copy (several processes and no DDP/FSDP2 wrapping, or a
  launcher that started several processes while Accelerate set up one) raises ``RuntimeError``
  saying what to do, before the first step (:func:`training_policy.replica_problem`). (FSDP1 is
  refused earlier, when its plugin is made: ``accelerate_dataclasses``; FSDP2 is supported.)
- ``Accelerator.prepare_optimizer``: after upstream prepared it, the user's optimizer steps as
  :func:`training_policy.optimizer_plan` decides, group by group (:func:`.optimizer.adapt_step`):
  Adam and AdamW hold, during ``step()`` only, a device tensor learning rate (and, unless fused,
  ``foreach=True, capturable=True``), so no Python float that changes at every step reaches a TPU
  program; every other optimizer, and any group the plan does not prove exact, steps as made (said
  once in the log). What the user, the schedule and checkpoints read stays a float. With
  Accelerate's ``tpu`` dynamo backend (``torch_compile=True`` in a Trainer), an adapted foreach step
  is compiled with that backend too, once for the whole run.
- ``fsdp2_prepare_model`` (as ``accelerate.accelerator`` calls it): a model still on the host is
  moved to the chip before ``fully_shard``. FSDP2 moves each parameter with ``param.data = ...``,
  which PyTorch refuses between the CPU and a PrivateUse1 device such as torch_tpu's (the same
  restriction that unties weights on a move); a model already on its device is left in place.

Off TPU, each wrapper calls the original and nothing else.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable

from .. import backend
from . import policy as training_policy
from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps, fail_safe, warn_once

NAME = "accelerate_prepare"
TARGET = "accelerate.accelerator"
DISTRIBUTION = "accelerate"
RELIES_ON = (
    Signature(
        "Accelerator.prepare_model", ("evaluation_mode",), positional=("model", "device_placement", "evaluation_mode")
    ),
    Signature("Accelerator.prepare_optimizer", ("optimizer",), positional=("optimizer",)),
    Attribute("Accelerator.device"),
    Attribute("Accelerator.num_processes"),
    Attribute("Accelerator.distributed_type"),
    Attribute("DistributedType.FSDP"),
    # fsdp2_prepare_model(accelerator, model), bound here, exists from Accelerate 1.6 on: wrapped only where it
    # does (apply), not declared.
)

logger = logging.getLogger("transformers_tpu_ext")

_wraps = Wraps()


def _torch() -> Any:
    return sys.modules["torch"]


def wrapper_names(model: Any) -> list[str]:
    """Class names from the outermost wrapper inwards (compiled module, DDP, the model)."""
    names: list[str] = []
    seen: set[int] = set()
    while model is not None and id(model) not in seen:
        seen.add(id(model))
        names.append(type(model).__name__)
        model = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
    return names


def _has_dtensor(model: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


def replica_problem(accelerator: Any, model: Any) -> str | None:
    """Why training ``model`` as prepared would run diverging replicas, or ``None``."""
    return training_policy.replica_problem(
        world_size=int(os.environ.get("WORLD_SIZE", "1") or 1),
        num_processes=int(accelerator.num_processes),
        wrapper=training_policy.wrapper_kind(wrapper_names(model), _has_dtensor(model)),
        trainable=any(p.requires_grad for p in model.parameters()),
    )


def _prepare_model(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for ``prepare_model(model, device_placement=None, evaluation_mode=False)``."""
    evaluation = args[2] if len(args) > 2 else kwargs.get("evaluation_mode", False)
    model = wrapped(*args, **kwargs)
    if evaluation or not (backend.tpu_available() and backend.is_tpu(getattr(instance, "device", None))):
        return model
    try:
        problem = replica_problem(instance, model)
    except Exception as error:  # noqa: BLE001 - a bug of ours never breaks prepare()
        warn_once(f"checking the prepared model's replicas failed ({type(error).__name__}: {error})")
        return model
    if problem:
        raise RuntimeError(f"transformers-tpu-ext: {problem}")
    return model


def _shards_parameters(accelerator: Any) -> bool:
    from accelerate.utils import DistributedType

    config = getattr(accelerator, "parallelism_config", None)
    return accelerator.distributed_type == DistributedType.FSDP or bool(getattr(config, "tp_enabled", False))


def _compiles_with_tpu(accelerator: Any) -> bool:
    plugin = getattr(getattr(accelerator, "state", None), "dynamo_plugin", None)
    value = getattr(getattr(plugin, "backend", None), "value", "")
    return str(value).lower() == training_policy.COMPILE_BACKEND


def _prepare_optimizer(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    optimizer = args[0] if args else kwargs.get("optimizer")
    on_tpu = (
        backend.tpu_available()
        and backend.is_tpu(getattr(instance, "device", None))
        and not getattr(optimizer, "_is_accelerate_prepared", False)
        and hasattr(optimizer, "param_groups")
    )
    prepared = wrapped(*args, **kwargs)
    if on_tpu:
        _after_prepare(instance, optimizer)
    return prepared


def _after_prepare(accelerator: Any, optimizer: Any) -> None:
    """The user's optimizer steps as :func:`training_policy.optimizer_plan` says (said once per decision)."""
    from . import optimizer as tpu_optimizer

    name = type(optimizer).__name__
    try:
        plans = tpu_optimizer.adapt_step(
            optimizer,
            sharded=_shards_parameters(accelerator),
            compile_backend=training_policy.COMPILE_BACKEND if _compiles_with_tpu(accelerator) else None,
        )
    except Exception as error:  # noqa: BLE001 - ours: the optimizer stays as the user made it
        warn_once(f"adapting {name} for TPU failed ({type(error).__name__}: {error}); it steps as you made it")
        return
    for plan in dict.fromkeys((p.action, p.reason) for p in plans):
        if plan[0] == training_policy.ADAPT:
            logger.info("transformers-tpu-ext: %s on TPU: %s, during the step only", name, plan[1])
        else:
            warn_once(f"{name} on TPU steps as you made it: {plan[1]}")


def _on_host(model: Any) -> bool:
    return any(p.device.type == "cpu" for p in model.parameters())


def _fsdp2_prepare_model(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for ``fsdp2_prepare_model(accelerator, model)``: a host model goes to the chip first."""
    accelerator = args[0] if args else kwargs.get("accelerator")
    model = args[1] if len(args) > 1 else kwargs.get("model")
    device = getattr(accelerator, "device", None)
    if backend.tpu_available() and backend.is_tpu(device) and _on_host(model):
        model.to(device)
    return wrapped(*args, **kwargs)


def apply(module: Any) -> None:
    if _wraps:
        return
    # The replica check raises on purpose (a user error), after the upstream call: not fail_safe.
    _wraps.wrap(module, "Accelerator.prepare_model", _prepare_model)
    _wraps.wrap(module, "Accelerator.prepare_optimizer", fail_safe(_prepare_optimizer))
    if hasattr(module, "fsdp2_prepare_model"):  # Accelerate >= 1.6: the name FSDP2 preparation calls
        _wraps.wrap(module, "fsdp2_prepare_model", fail_safe(_fsdp2_prepare_model))


def revert() -> None:
    _wraps.unwrap_all()
