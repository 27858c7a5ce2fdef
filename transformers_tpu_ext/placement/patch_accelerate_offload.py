"""Accelerate: weights offloaded to disk load back onto the TPU.

When ``from_pretrained(device_map="auto", offload_folder=...)`` puts modules on ``"disk"``,
Transformers hands Accelerate an offload index pointing into the checkpoint's safetensors files, and
``dispatch_model`` builds an ``OffloadedWeightsLoader(..., device=<main device>)``. Before each
forward of a disk module, the loader opens the file with
``safetensors.safe_open(file, framework="pt", device="tpu")``; safetensors (0.8) validates the device
name itself and knows no ``tpu`` (``SafetensorError: device tpu is invalid``), so the first
generation step fails on a TPU where the same code works on a GPU. (It catches only ``TypeError``
for its CPU fallback.)

The wrapper rebinds ``safe_open`` inside ``accelerate.utils.offload`` only: a TPU device opens the
file on the host, and the loader's own ``tensor.to(device)`` that follows moves the tensor to the
chip, as it does for any tensor not already there. Any other device is passed to safetensors
unchanged.
"""

from __future__ import annotations

from typing import Any

from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps
from .host_reads import device_on_host

NAME = "accelerate_offload"
TARGET = "accelerate.utils.offload"
DISTRIBUTION = "accelerate"
RELIES_ON = (
    # safetensors' safe_open(filename, framework, device="cpu") as bound here; the wrapper reads args[2] / device=.
    Signature("safe_open", ("device",), positional=("filename", "framework", "device")),
    Attribute("OffloadedWeightsLoader.__getitem__"),  # the caller: safe_open(..., device=<the main device>)
)

_wraps = Wraps()


#: ``safe_open(filename, framework, device="cpu")``: a TPU device reads on the host.
_wrapper = device_on_host(2)


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "safe_open", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
