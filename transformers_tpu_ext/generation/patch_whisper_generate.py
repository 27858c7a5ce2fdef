"""Patch of ``transformers.models.whisper.generation_whisper``: Whisper's ``generate()`` gives its result on the
device of its input features, on TPU.

Whisper's own ``generate()`` calls ``GenerationMixin.generate`` once per 30-s segment; the ``generation`` patch
returns that inner result on the host (``wrap_media.plan_encoder_decoder``), where Whisper's post-processing reads
every row's tokens (on the device, a new program per transcript length). This thin wrapper puts Whisper's final
result back where upstream's would be: on the input's device. Off TPU, or with inputs on the host, it calls the
original at once and changes nothing.
"""

from __future__ import annotations

from typing import Any

from ..backend import is_tpu
from ..core.relies import Signature
from ..core.wrapping import Wraps

NAME = "whisper_generate"
TARGET = "transformers.models.whisper.generation_whisper"
DISTRIBUTION = "transformers"
RELIES_ON = (
    # The input features: the first positional argument or input_features=.
    Signature("WhisperGenerationMixin.generate", positional=("input_features",)),
)

_wraps = Wraps()


def apply(module: Any) -> None:
    _wraps.wrap(module.WhisperGenerationMixin, "generate", _generate)


def revert() -> None:
    _wraps.unwrap_all()


def _generate(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not is_tpu(getattr(instance, "device", None)):
        return wrapped(*args, **kwargs)
    features = args[0] if args else kwargs.get("input_features")
    device = getattr(features, "device", None)
    result = wrapped(*args, **kwargs)
    if device is None or device.type == "cpu":
        return result
    return _on(result, device)


def _on(value: Any, device: Any) -> Any:
    """``value`` with its tensors on ``device`` (a tensor, a dict or ModelOutput of them, a list or tuple)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device) if value.device.type == "cpu" else value
    if isinstance(value, dict):  # ModelOutput too: its keys and attributes are set together
        for key in list(value.keys()):
            value[key] = _on(value[key], device)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_on(item, device) for item in value) if isinstance(value, list) or type(value) is tuple else value
    return value
