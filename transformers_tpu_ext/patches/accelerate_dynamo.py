"""Accelerate: ``TorchDynamoPlugin(backend="tpu")`` compiles with torch_tpu's backend.

Accelerate validates the compile backend against its ``DynamoBackend`` enum, which lists
``HPU_BACKEND`` and ``NEURON`` for those accelerators but no ``TPU``: ``torch_compile_backend="tpu"``
raises ``ValueError: 'TPU' is not a valid DynamoBackend``. On a TPU host the enum's ``_missing_``
hook answers ``"TPU"`` with a ``DynamoBackend`` value whose ``.value.lower()`` is ``"tpu"``, so
``torch.compile(model, backend="tpu")`` is what ``Accelerator.prepare`` runs; off TPU the lookup
fails exactly as upstream's.

``TorchDynamoPlugin.__post_init__``: with the ``tpu`` backend and ``dynamic`` unset, ``dynamic=False``
(torch_tpu's own ``torch.compile`` default for TPU backends: a TPU program has static shapes, and
the batches are bucketed), as the Trainer already does for Neuron.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import backend, training_policy
from ._wrap import Wraps, fail_safe

NAME = "accelerate_dynamo"
TARGET = "accelerate.utils.dataclasses"
DISTRIBUTION = "accelerate"

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


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "DynamoBackend._missing_", fail_safe(_missing))
    _wraps.wrap(module, "TorchDynamoPlugin.__post_init__", fail_safe(_post_init))


def revert() -> None:
    _wraps.unwrap_all()
