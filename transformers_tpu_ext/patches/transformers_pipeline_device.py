"""Transformers pipelines keep a TPU model on the TPU: ``transformers.pipelines.base.Pipeline.__init__``.

Without a ``device``, ``Pipeline.__init__`` falls back to device ``0`` and turns it into
``cuda:0``/``xpu:0``/... or, with none of those, ``cpu``, then moves the model there. On a GPU that
keeps a model on its GPU; on a TPU host it moves the model to the CPU, silently:

- ``pipeline(task, model=model)`` with a model already on the TPU (``device_map="auto"``,
  ``.to("tpu")``), in every Transformers release;
- ``pipeline(task, model=path, device_map="auto")`` before Transformers 5.24 (5.24 passes the
  model's device itself).

The wrapper passes the model's own device when the caller gave none and the model is on a TPU (and
has no multi-device ``hf_device_map``, which upstream handles), and reads an integer ``device`` as
this process' chip (``tpu:0``, as ``device_map`` integers do) when the host has a TPU. Anywhere else
the upstream call runs untouched.
"""

from __future__ import annotations

from typing import Any

from .. import backend
from ._wrap import Wraps, fail_safe

NAME = "transformers_pipeline_device"
TARGET = "transformers.pipelines.base"
DISTRIBUTION = "transformers"

_wraps = Wraps()


def _init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if len(args) > 1:  # everything but the model positional: pipeline() never calls it so; leave it be
        return wrapped(*args, **kwargs)
    model = args[0] if args else kwargs.get("model")
    device = kwargs.get("device")
    if "device" not in kwargs or device is None:
        if getattr(model, "hf_device_map", None) is None and backend.is_tpu(getattr(model, "device", None)):
            kwargs = {**kwargs, "device": model.device}
    elif isinstance(device, int) and not isinstance(device, bool) and device >= 0 and backend.tpu_available():
        kwargs = {**kwargs, "device": f"{backend.DEVICE_TYPE}:0"}
    return wrapped(*args, **kwargs)


_wrapper = fail_safe(_init)


def apply(module: Any) -> None:
    _wraps.wrap(module, "Pipeline.__init__", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
