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
context variable) and made by upstream's loop itself (a callback's draw is left alone), and passes every
other call through; the original is put back when the last loop ends. A ``generator=`` passed
explicitly is respected. The plugin's own compiled token choice draws with the tensor method, so it does
not read the attribute (TorchDynamo guards on it: code compiled while it is swapped recompiles; a
``TorchFunctionMode`` would be worse, as TorchDynamo guards on the mode stack).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from typing import Any, Iterator

__all__ = ["draws_as_upstream", "draws_on_device"]

_DEVICE: contextvars.ContextVar[Any] = contextvars.ContextVar("transformers_tpu_ext_draw_device", default=None)
_lock = threading.Lock()
_users = 0
_original: Any = None


#: The module whose draws are redirected: upstream's decoding loops (``_sample``, beam sampling).
_UPSTREAM_LOOPS = "transformers.generation.utils"


def _multinomial(input: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A002 - torch's parameter name
    device = _DEVICE.get()
    original = _original
    if (
        device is not None
        and kwargs.get("generator") is None
        and getattr(input, "device", None) is not None
        and input.device.type == "cpu"
        # only upstream's own draw: a callback's (a processor that samples, a helper model's generate())
        # keeps the generator it would use without the plugin
        and sys._getframe(1).f_globals.get("__name__") == _UPSTREAM_LOOPS
    ):
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
            current = torch.multinomial
            # never our own function (another thread's patch of torch.multinomial may have put it back)
            _original = torch._C._VariableFunctions.multinomial if current is _multinomial else current
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


@contextlib.contextmanager
def draws_as_upstream() -> Iterator[None]:
    """Within the block (a ``generate()`` nested in a handled call: a callback's, an assistant's), no draw
    is redirected: that call is upstream's, with the generator it would use without the plugin."""
    token = _DEVICE.set(None)
    try:
        yield
    finally:
        _DEVICE.reset(token)
