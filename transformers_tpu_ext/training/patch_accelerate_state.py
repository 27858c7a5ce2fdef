"""Accelerate: ``PartialState`` finds the TPU, one chip or one process per chip.

Accelerate 1.15 has no TPU in its device selection (``DistributedType.XLA`` is torch_xla's): on a
TPU host ``Accelerator()`` reports ``device=cpu`` and a plain training loop silently runs on the
CPU; the Trainer's ``accelerator.prepare`` moves the model back to the CPU; under torchrun the
ranks either train alone on the whole dataset or shard the data without any DDP wrapping.

The wrappers follow what Accelerate does for its other accelerators (HPU, Neuron):

- ``PartialState.default_device`` (a property): ``tpu`` when the host has a TPU and upstream found
  nothing better than ``cpu``. ``cpu=True`` / ``use_cpu`` and ``ACCELERATE_TORCH_DEVICE`` still win.
- ``PartialState._prepare_backend``: in a launched process (``LOCAL_RANK`` set, not ``cpu``) on a TPU
  host where upstream found no accelerator (``NO``, or Accelerate 1.1's fallback to ``MULTI_CPU`` on
  gloo), the run is multi-process on the ``tpu_dist`` process group
  (``DistributedType.MULTI_GPU``: Accelerate's "one accelerator per process, DDP" type; it has no TPU
  member). A backend that cannot reduce TPU tensors is refused (:mod:`training_policy`).
- ``PartialState.set_device``: on that process group every process is bound to ``tpu:0`` (the index
  is the one ``torch.accelerator`` reports), not ``tpu:<local rank>``.
- ``PartialState.wait_for_everyone``: the barrier names that device (upstream passes the local
  rank as a device id).
- ``AcceleratorState.__init__``: fp16 mixed precision (``fp16=True``, ``mixed_precision="fp16"``,
  ``ACCELERATE_MIXED_PRECISION=fp16``) on a TPU becomes bf16 with one warning naming ``bf16=True``
  (:func:`training_policy.mixed_precision`), before upstream reads it: ``Accelerator`` would refuse it
  ("fp16 mixed precision requires a device in (...)"), and an FSDP plugin gets bf16 too.

Off TPU, each wrapper calls the original and nothing else.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from .. import backend
from . import policy as training_policy
from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps, fail_safe, warn_once

NAME = "accelerate_state"
TARGET = "accelerate.state"
DISTRIBUTION = "accelerate"
RELIES_ON = (
    Attribute("PartialState.default_device"),  # a property of PartialState's own
    # _tpu_backend reads args[0] / cpu=, args[2] / backend= and the (backend, distributed type) it returns.
    Signature("PartialState._prepare_backend", ("cpu", "backend"), positional=("cpu", "sagemaker_dp", "backend")),
    Signature("PartialState.set_device"),
    Signature("PartialState.wait_for_everyone"),
    Signature("PartialState", ("cpu",), positional=("cpu",)),  # made first, as upstream's __init__ does
    Attribute("PartialState._shared_state"),
    Attribute("AcceleratorState._shared_state"),
    # _STATE_PARAMETERS: the wrapper reads mixed_precision, cpu and deepspeed_plugin, positional or by name. The
    # order holds up to fsdp_plugin in every release (1.1 has no torch_tp_plugin or parallelism_config after it).
    Signature(
        "AcceleratorState.__init__",
        ("mixed_precision", "cpu", "deepspeed_plugin"),
        positional=("mixed_precision", "cpu", "dynamo_plugin", "deepspeed_plugin", "fsdp_plugin"),
    ),
    Attribute("DistributedType.NO"),
    Attribute("DistributedType.MULTI_CPU"),
    Attribute("DistributedType.MULTI_GPU"),
)

_wraps = Wraps()


def _torch() -> Any:
    return sys.modules["torch"]


def _tpu_device() -> Any:
    torch = _torch()
    return torch.device(backend.DEVICE_TYPE, torch.accelerator.current_device_index())


def on_tpu_process_group(state: Any) -> bool:
    """Whether ``state`` (a ``PartialState``) runs on the TPU process group."""
    return getattr(state, "backend", None) in training_policy.PROCESS_GROUP_BACKENDS


def _default_device(original: property) -> property:
    def fget(self: Any) -> Any:
        device = original.fget(self)
        try:
            if getattr(device, "type", None) == "cpu" and backend.tpu_available():
                return _tpu_device()
        except Exception as error:  # noqa: BLE001 - a bug of ours never breaks Accelerator()
            warn_once(f"choosing the TPU as Accelerate's device failed ({type(error).__name__}: {error})")
        return device

    fget.__doc__ = original.__doc__
    fget.__wrapped__ = original.fget  # type: ignore[attr-defined]
    return property(fget, original.fset, original.fdel, original.__doc__)


def _prepare_backend(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for ``_prepare_backend(cpu=False, sagemaker_dp=False, backend=None)``."""
    result = wrapped(*args, **kwargs)
    try:
        return _tpu_backend(result, args, kwargs)
    except training_policy.UnsupportedBackend:
        raise  # the user's choice, refused with what to do
    except Exception as error:  # noqa: BLE001 - a bug of ours never breaks PartialState()
        warn_once(f"choosing the TPU process group failed ({type(error).__name__}: {error}); Accelerate's choice stands")
        return result


def _tpu_backend(result: Any, args: tuple, kwargs: dict) -> Any:
    cpu = args[0] if args else kwargs.get("cpu", False)
    requested = args[2] if len(args) > 2 else kwargs.get("backend")
    _, distributed_type = result
    if cpu or int(os.environ.get("LOCAL_RANK", -1)) == -1 or not backend.tpu_available():
        return result
    from accelerate.utils import DistributedType

    # No accelerator found: NO (Accelerate >= 1.2), or its CPU fallback, MULTI_CPU on gloo (1.1).
    if distributed_type not in (DistributedType.NO, DistributedType.MULTI_CPU):
        return result
    return training_policy.process_group_backend(requested), DistributedType.MULTI_GPU


def _set_device(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    if getattr(instance, "device", None) is None and on_tpu_process_group(instance) and backend.tpu_available():
        instance.device = _tpu_device()
        return None
    return wrapped(*args, **kwargs)


def _wait_for_everyone(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    if not (on_tpu_process_group(instance) and backend.is_tpu(getattr(instance, "device", None))):
        return wrapped(*args, **kwargs)
    torch = _torch()
    if instance.num_processes > 1:
        torch.distributed.barrier(device_ids=[torch.accelerator.current_device_index()])
    return None


#: ``AcceleratorState.__init__``'s named parameters; the rest of its keywords go to ``PartialState``.
_STATE_PARAMETERS = (
    "mixed_precision", "cpu", "dynamo_plugin", "deepspeed_plugin", "fsdp_plugin", "torch_tp_plugin",
    "megatron_lm_plugin", "parallelism_config", "_from_accelerator",
)


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "y", "on")


def _accelerator_state_init(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for ``AcceleratorState.__init__(mixed_precision=None, cpu=False, ..., **kwargs)``."""
    named = dict(zip(_STATE_PARAMETERS, args))
    requested = named.get("mixed_precision", kwargs.get("mixed_precision"))
    if requested is None:
        if sys.modules["accelerate.state"].AcceleratorState._shared_state:
            # Accelerate's own later AcceleratorState() calls pass no precision: upstream keeps the
            # initialised state's and checks nothing; an fp16 read from the environment must not be
            # turned into a changed bf16 request there ("already initialized").
            return wrapped(*args, **kwargs)
        requested = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if str(requested).lower() != "fp16" or not backend.tpu_available():
        return wrapped(*args, **kwargs)
    state = sys.modules["accelerate.state"].PartialState
    if state._shared_state == {}:  # what upstream's __init__ does first, done here to know the device
        cpu = bool(named.get("cpu", kwargs.get("cpu", False))) or _flag("ACCELERATE_USE_CPU")
        state(cpu, **{k: v for k, v in kwargs.items() if k not in _STATE_PARAMETERS})
    deepspeed = named.get("deepspeed_plugin", kwargs.get("deepspeed_plugin")) is not None or _flag("ACCELERATE_USE_DEEPSPEED")
    precision, note = training_policy.mixed_precision(
        str(requested), on_tpu=backend.is_tpu(getattr(state(), "device", None)), deepspeed=deepspeed
    )
    if note is None:
        return wrapped(*args, **kwargs)
    warn_once(note)
    if "mixed_precision" in named:
        args = (precision, *args[1:])
    else:
        kwargs = {**kwargs, "mixed_precision": precision}
    return wrapped(*args, **kwargs)


def apply(module: Any) -> None:
    if _wraps:
        return
    state = module.PartialState
    _wraps.replace(state, "default_device", _default_device(vars(state)["default_device"]))
    # A backend that cannot reduce TPU tensors is the user's error and must surface: not fail_safe
    # (the wrapper guards its own code itself).
    _wraps.wrap(module, "PartialState._prepare_backend", _prepare_backend)
    _wraps.wrap(module, "PartialState.set_device", fail_safe(_set_device))
    _wraps.wrap(module, "PartialState.wait_for_everyone", fail_safe(_wait_for_everyone))
    _wraps.wrap(module, "AcceleratorState.__init__", fail_safe(_accelerator_state_init))


def revert() -> None:
    _wraps.unwrap_all()
