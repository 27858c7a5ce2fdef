"""Which generator a handled ``generate()`` draws its samples from: the TPU's, on every loop.

Without the plugin, a TPU call samples on the TPU (``torch.multinomial`` over probabilities on the
device) and so draws from the TPU's default generator. The device loop (``device_decode``) does the
same. Upstream's loop inside a handled call (the host loop: options that need the logits on the host,
and beam sampling) computes the probabilities on the CPU, where its growing tensors live, so its
``torch.multinomial`` would draw from the CPU's generator: the same seed would give other tokens than
with the plugin disabled (and the CPU's stream, which data shuffling also reads, would decide them).
:func:`draws_on_device` sends those draws to the TPU: the probabilities go to the model's device, are
drawn from there, and the chosen indices come back, so every path draws from the TPU's generator.

Upstream calls ``torch.multinomial`` by its module attribute; while at least one such loop runs, that
attribute is a function that redirects only the calls made inside a loop of this thread or task (a
context variable) and passes every other call through; the original is put back when the last loop
ends. A ``generator=`` passed explicitly is respected. Nothing compiled reads it: no graph changes
(a ``TorchFunctionMode`` would, as TorchDynamo guards on the mode stack).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Any, Iterator

__all__ = ["draws_on_device"]

_DEVICE: contextvars.ContextVar[Any] = contextvars.ContextVar("transformers_tpu_ext_draw_device", default=None)
_lock = threading.Lock()
_users = 0
_original: Any = None


def _multinomial(input: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A002 - torch's parameter name
    device = _DEVICE.get()
    original = _original
    if device is not None and kwargs.get("generator") is None and getattr(input, "device", None) is not None:
        if input.device.type == "cpu":
            return original(input.to(device), *args, **kwargs).to(input.device)
    return original(input, *args, **kwargs)


@contextlib.contextmanager
def draws_on_device(device: Any, active: bool = True) -> Iterator[None]:
    """Within the block (this thread or task), ``torch.multinomial`` over CPU probabilities draws on ``device``."""
    if not active:
        yield
        return
    import torch

    global _users, _original
    with _lock:
        if _users == 0:
            _original = torch.multinomial
            torch.multinomial = _multinomial
        _users += 1
    token = _DEVICE.set(device)
    try:
        yield
    finally:
        _DEVICE.reset(token)
        with _lock:
            _users -= 1
            if _users == 0:
                torch.multinomial = _original
