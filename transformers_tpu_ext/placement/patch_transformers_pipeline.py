"""Transformers: ``pipeline(...)`` reads an integer device as the TPU on a TPU host.

``Pipeline.__init__`` turns an integer device (``device=0``, the first value of an ``hf_device_map``,
or its own default ``0`` when neither ``device`` nor ``device_map`` is given) into ``cuda:N``,
``xpu:N``, ``npu:N``..., and into ``cpu`` when none of those is present: on a TPU host the pipeline
then ran on the CPU (with a model split across the chip and the CPU, its inputs went to the CPU).
Here an integer means this process' chip, as it means the GPU on a GPU host: the pipeline and its
model go to ``tpu:0``. Strings and ``torch.device`` values, ``-1`` and every non-TPU host are upstream's.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import backend
from ..core.relies import Default, Signature
from ..core.wrapping import Wraps, fail_safe, warn_once

NAME = "transformers_pipeline"
TARGET = "transformers.pipelines.base"
DISTRIBUTION = "transformers"
RELIES_ON = (
    Signature("Pipeline.__init__", ("model", "device"), positional=("model",)),
    # No device and no device map is upstream's default device 0, the accelerator: the wrapper gives it the chip.
    Default("Pipeline.__init__", "device", None),
)

_wraps = Wraps()


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _chip(index: int) -> Any:
    import torch

    if index != 0:
        warn_once(f"pipeline device {index} means this process' TPU chip (tpu:0); a process reaches one chip only")
    return torch.device(backend.DEVICE_TYPE, 0)


def _init(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    model = args[0] if args else kwargs.get("model")
    device_map = getattr(model, "hf_device_map", None)
    device = kwargs.get("device")
    if _is_index(device):
        kwargs = {**kwargs, "device": _chip(device)}
    elif device is None and device_map is None:
        kwargs = {**kwargs, "device": _chip(0)}  # upstream's default, 0: the accelerator
    result = wrapped(*args, **kwargs)
    if device is None and isinstance(device_map, dict) and device_map and _is_index(next(iter(device_map.values()))):
        instance.device = _chip(next(iter(device_map.values())))
    return result


_guarded = fail_safe(_init)


def _wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    if not backend.tpu_available():
        return wrapped(*args, **kwargs)
    return _guarded(wrapped, instance, args, kwargs)


def apply(module: Any) -> None:
    _wraps.wrap(module.Pipeline, "__init__", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
