"""Accelerate's plugin dataclasses on TPU: ``TorchDynamoPlugin(backend="tpu")`` compiles with
torch_tpu's backend, and FSDP configurations that cannot run say so.

Accelerate validates the compile backend against its ``DynamoBackend`` enum, which lists
``HPU_BACKEND`` and ``NEURON`` for those accelerators but no ``TPU``: ``torch_compile_backend="tpu"``
raises ``ValueError: 'TPU' is not a valid DynamoBackend``. On a TPU host the enum's ``_missing_``
hook answers ``"TPU"`` with a ``DynamoBackend`` value whose ``.value.lower()`` is ``"tpu"``, so
``torch.compile(model, backend="tpu")`` is what ``Accelerator.prepare`` runs; off TPU the lookup
fails exactly as upstream's.

``TorchDynamoPlugin.__post_init__``: with the ``tpu`` backend and ``dynamic`` unset, ``dynamic=False``
(torch_tpu's own ``torch.compile`` default for TPU backends: a TPU program has static shapes, and
the batches are bucketed), as the Trainer already does for Neuron.

``FullyShardedDataParallelPlugin.__post_init__``: on a TPU host, FSDP1 (``fsdp_version=1``) is refused
with a message naming FSDP2, which works (see the ``accelerate_prepare`` patch); upstream would fail
later, or at once with ``There are currently no available devices found, must be one of 'XPU',
'CUDA', ...`` when it looks for a device for ``sync_module_states`` (as it also does for FSDP2 with
``cpu_ram_efficient_loading``): that error gets a TPU explanation.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from .. import backend
from . import policy as training_policy
from ..core.relies import Attribute, Default, Signature
from ..core.wrapping import Wraps, fail_safe

NAME = "accelerate_dataclasses"
TARGET = "accelerate.utils.dataclasses"
DISTRIBUTION = "accelerate"
RELIES_ON = (
    Signature("DynamoBackend._missing_", positional=("value",)),  # Enum's hook, the value looked up
    Signature("TorchDynamoPlugin.__post_init__"),
    Attribute("TorchDynamoPlugin.backend"),
    # dynamic=None is "unset": the patch gives the tpu backend dynamic=False then.
    Default("TorchDynamoPlugin.__init__", "dynamic", None),
    Signature("FullyShardedDataParallelPlugin.__post_init__"),
    # FullyShardedDataParallelPlugin.fsdp_version exists from Accelerate 1.6 on (1.1: FSDP1 only, FSDP_VERSION
    # read from the environment): read with getattr, not declared.
)

_wraps = Wraps()
_members: dict[type, Any] = {}

_VALUE = training_policy.COMPILE_BACKEND.upper()


def tpu_member(enum_cls: type) -> Any:
    """The ``DynamoBackend`` value standing for the ``tpu`` backend (made once per enum class)."""
    member = _members.get(enum_cls)
    if member is None:
        member = str.__new__(enum_cls, _VALUE)
        member._name_ = _VALUE
        member._value_ = _VALUE
        member._sort_order_ = len(enum_cls._member_names_)
        _members[enum_cls] = member
    return member


def _missing(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    value = args[0] if args else kwargs.get("value")
    if isinstance(value, str) and value.upper() == _VALUE and backend.tpu_available():
        return tpu_member(instance)
    return wrapped(*args, **kwargs)


def _post_init(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    if getattr(instance, "dynamic", None) is None and getattr(instance.backend, "value", None) == _VALUE:
        instance.dynamic = False
    return result


#: What FSDP on TPU supports, for the error messages.
FSDP_ON_TPU = (
    "On TPU, use FSDP2 (fsdp_version=2: fsdp_config={'version': 2} in TrainingArguments, the default) "
    "without cpu_ram_efficient_loading / sync_module_states, or DDP."
)


def _fsdp_post_init(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    if not backend.tpu_available():
        return wrapped(*args, **kwargs)
    version = getattr(instance, "fsdp_version", None)  # Accelerate < 1.6 has FSDP1 only
    if version is None:
        version = int(os.environ.get("FSDP_VERSION", "1"))
    if int(version) == 1:
        raise RuntimeError(f"transformers-tpu-ext: FSDP1 (FullyShardedDataParallel) is not supported on TPU. {FSDP_ON_TPU}")
    try:
        return wrapped(*args, **kwargs)
    except RuntimeError as error:
        if "no available devices found" not in str(error):
            raise
        raise RuntimeError(
            "transformers-tpu-ext: FSDP's sync_module_states (set by cpu_ram_efficient_loading) needs a device "
            f"Accelerate knows, and it does not know the TPU. {FSDP_ON_TPU}"
        ) from error


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "DynamoBackend._missing_", fail_safe(_missing))
    _wraps.wrap(module, "TorchDynamoPlugin.__post_init__", fail_safe(_post_init))
    # Raises on purpose (configurations a user chose): not fail_safe.
    _wraps.wrap(module, "FullyShardedDataParallelPlugin.__post_init__", _fsdp_post_init)


def revert() -> None:
    _wraps.unwrap_all()
