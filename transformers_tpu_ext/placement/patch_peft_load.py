"""PEFT: adapter weights load onto a TPU model.

PEFT 0.22 infers the device to load adapter weights on from ``torch.accelerator`` (``infer_device()`` gives
``"tpu"`` on a TPU host, ``"cpu"`` in 0.21), then reads them with
``safetensors.torch.load_file(filename, device="tpu")``; safetensors validates the device name itself and
knows no ``tpu`` (``SafetensorError: device tpu is invalid``), so ``PeftModel.from_pretrained(tpu_model,
adapter)`` and ``load_adapter`` fail on a TPU where they work on a GPU.

The wrapper rebinds ``safe_load_file`` inside ``peft.utils.save_and_load`` only (the name
``load_peft_weights`` calls): a TPU device reads the file on the host, as PEFT 0.21 did, and
``set_peft_model_state_dict`` copies the values into the model's parameters on the chip, as it does for any
state dict. Any other device is passed to safetensors unchanged.
"""

from __future__ import annotations

from typing import Any

from ..core.relies import Signature
from ..core.wrapping import Wraps
from .host_reads import device_on_host

NAME = "peft_load"
TARGET = "peft.utils.save_and_load"
DISTRIBUTION = "transformers"  # PEFT is an optional library (the `test` extra here): its model holds a Transformers one
RELIES_ON = (
    Signature("safe_load_file", params=("device",), positional=("filename",)),
    Signature("load_peft_weights", params=("device",), positional=("model_id",)),
)

_wraps = Wraps()


#: ``load_file(filename, device="cpu")``: a TPU device reads on the host.
_wrapper = device_on_host(1)


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "safe_load_file", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
