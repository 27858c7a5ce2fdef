"""Files safetensors reads for the TPU are read on the host: safetensors validates the device name itself and
knows no ``tpu`` (``SafetensorError: device tpu is invalid``). Shared by the patches whose callers hand it a TPU
device (``accelerate_offload``: ``safe_open``; ``peft_load``: ``load_file``); the caller moves what it read to
the chip itself, as it does for any tensor not already there."""

from __future__ import annotations

from typing import Any, Callable

from .. import backend
from ..core.wrapping import Wrapper, fail_safe

__all__ = ["device_on_host"]


def device_on_host(position: int) -> Wrapper:
    """A wrapper for a safetensors reader whose device is its ``position``-th argument (or ``device=``): a TPU
    device becomes ``"cpu"``; any other device is passed on unchanged. Its own failures fall back (``fail_safe``)."""

    def read_on_host(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        device = args[position] if len(args) > position else kwargs.get("device")
        if not backend.is_tpu(device):
            return wrapped(*args, **kwargs)
        if len(args) > position:
            return wrapped(*args[:position], "cpu", *args[position + 1 :], **kwargs)
        return wrapped(*args, **{**kwargs, "device": "cpu"})

    return fail_safe(read_on_host)
