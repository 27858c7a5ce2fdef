"""Transformers: ``from_pretrained(device_map=...)`` resolves to the TPU.

Three names on the ``from_pretrained`` path (and so on ``pipeline(..., device_map=...)``):

- ``transformers.integrations.accelerate.get_max_memory``: Transformers' own wrapper around
  Accelerate's (bound there as ``accelerate_max_memory``), called by its ``get_balanced_memory``,
  ``_get_device_map`` and ``infer_auto_device_map``. Wrapped like Accelerate's so that the chip is
  listed with its budget and a user's ``max_memory={"tpu": ...}`` (or ``0``) reaches it unrejected.
- ``transformers.modeling_utils._get_device_map`` (the name ``from_pretrained`` calls; bound from
  ``transformers.integrations.accelerate`` at import): integer device ids become ``"tpu"``. torch_tpu
  ignores the index of ``Tensor.to(<int>)`` and one process sees its chip as ``tpu:0``, so an int can
  only mean this chip, and Accelerate's loaders need the device type (safetensors rejects ``"tpu"`` as
  an integer index's device). An ``"auto"`` map that puts nothing on a present TPU is logged as a
  warning with the budget, never silently.
- ``transformers.modeling_utils.accelerate_dispatch`` (bound from ``transformers.integrations.accelerate``):
  once the model is dispatched, ``hf_device_map`` records the chip as ``0``, the accelerator's index,
  as upstream records a GPU, so code that builds ``f"{device_type}:{index}"`` from it gets ``tpu:0``
  (``pipeline`` reads that ``0`` as the TPU: see the ``transformers_pipeline`` patch).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable

from .. import backend
from . import budget as placement
from ..core.relies import Default, Signature
from ..core.wrapping import Wraps, fail_safe, warn_once
from .patch_accelerate_memory import with_tpu

NAME = "transformers_device_map"
TARGET = "transformers.modeling_utils"
DISTRIBUTION = "transformers"
RELIES_ON = (
    Signature("_get_device_map", ("device_map", "max_memory"), positional=("model", "device_map", "max_memory")),
    Signature("accelerate_dispatch", ("model",), positional=("model",)),
    # Transformers' own get_max_memory, wrapped like Accelerate's (with_tpu reads args[0] / max_memory=).
    Signature("transformers.integrations.accelerate:get_max_memory", ("max_memory",), positional=("max_memory",)),
    Default("transformers.integrations.accelerate:get_max_memory", "max_memory", None),
)

logger = logging.getLogger("transformers_tpu_ext")

_AUTO = ("auto", "balanced", "balanced_low_0", "sequential")

_wraps = Wraps()
def _get_device_map(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    if not backend.tpu_available():
        return wrapped(*args, **kwargs)
    device_map = wrapped(*args, **kwargs)
    requested = args[1] if len(args) > 1 else kwargs.get("device_map")
    max_memory = args[2] if len(args) > 2 else kwargs.get("max_memory")
    if not isinstance(device_map, dict):
        return device_map
    if any(isinstance(device, int) and not isinstance(device, bool) for device in device_map.values()):
        device_map = type(device_map)((name, _chip(name, device)) for name, device in device_map.items())
    if (
        requested in _AUTO
        and placement.TPU_KEY not in device_map.values()
        and (max_memory is None or placement.split_tpu_entry(max_memory)[0] is not None)
    ):
        logger.warning(
            "transformers-tpu-ext: device_map=%r placed no module on the TPU (device map: %s). The first module "
            "does not fit the chip's budget; pass max_memory={'tpu': ..., 'cpu': ...} or lower %s (see the "
            "'Placement' docs).",
            requested,
            dict(device_map),
            placement.HEADROOM_ENV,
        )
    return device_map


def _chip(name: str, device: Any) -> Any:
    if not isinstance(device, int) or isinstance(device, bool):
        return device
    if device != 0:
        warn_once(
            f"device_map entry {name!r}: {device} means this process' TPU chip (tpu:0); a process reaches one "
            "chip only (run one process per chip)"
        )
    return placement.TPU_KEY


def _accelerate_dispatch(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    if backend.tpu_available():
        model = args[0] if args else kwargs.get("model")
        device_map = getattr(model, "hf_device_map", None)
        if isinstance(device_map, dict) and any(placement.is_tpu_key(device) for device in device_map.values()):
            model.hf_device_map = {name: 0 if placement.is_tpu_key(device) else device for name, device in device_map.items()}
    return result


_get_device_map_wrapper = fail_safe(_get_device_map)
_accelerate_dispatch_wrapper = fail_safe(_accelerate_dispatch)
_max_memory_wrapper = fail_safe(with_tpu)


def apply(module: Any) -> None:
    if _wraps:
        return
    integration = sys.modules.get("transformers.integrations.accelerate")
    if integration is not None and hasattr(integration, "get_max_memory"):
        _wraps.wrap(integration, "get_max_memory", _max_memory_wrapper)
    _wraps.wrap(module, "_get_device_map", _get_device_map_wrapper)
    _wraps.wrap(module, "accelerate_dispatch", _accelerate_dispatch_wrapper)


def revert() -> None:
    _wraps.unwrap_all()
