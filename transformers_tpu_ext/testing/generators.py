"""``torch.Generator(device="tpu")``: a random generator of the device, as torch_tpu has one.

On a chip, ``torch.Generator(device="tpu")`` is a generator of the TPU: ``.device`` is ``tpu:0``,
``manual_seed`` makes its draws reproducible, and random operators on TPU tensors take it
(``torch.randperm(n, device="tpu", generator=g)``, Transformers' watermarking processors).

A Python backend cannot register a C++ generator (PyTorch's ``PrivateUse1HooksInterface::getNewGenerator``
has no Python binding), so the simulated generator is a CPU generator whose class says ``tpu``:
:class:`Generator` replaces ``torch.Generator`` (a subclass of ``torch._C.Generator``; ``isinstance``
and ``issubclass`` against ``torch.Generator`` still hold for every plain generator). The TPU's
default generator (``torch.tpu.default_generators[0]``, what ``torch.tpu.manual_seed`` seeds) is one
too. Limits (kinder than a chip): a CPU operator handed a TPU generator runs (PyTorch checks that in
C++, which sees a CPU generator), and so does a TPU operator handed a CPU generator (the dispatcher
gets a fresh Python object for every generator, so the two cannot be told apart there); a chip
refuses both ("Expected a 'tpu' device type for generator but found 'cpu'").
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Generator", "is_tpu_generator", "make_default", "register", "resolve"]

_BASE = torch._C.Generator
_TPU: list[Any] = [None]  # torch.device("tpu", 0) once registered


class _Meta(type(_BASE)):  # type: ignore[misc]
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _BASE)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return isinstance(sub, type) and issubclass(sub, _BASE)


class Generator(_BASE, metaclass=_Meta):
    """``torch.Generator`` while the simulated TPU is installed: ``device="tpu"`` makes a TPU generator."""

    def __new__(cls, device: Any = "cpu") -> Any:
        if _is_tpu(device):
            return _BASE.__new__(cls, "cpu")
        return _BASE(device)

    def __init__(self, device: Any = "cpu") -> None:  # the state is made by __new__
        pass

    @property
    def device(self) -> Any:  # noqa: D102
        return _TPU[0]

    def __reduce__(self) -> Any:
        return (_rebuild, (self.get_state(),))

    def __repr__(self) -> str:
        return f"<torch.Generator object at {hex(id(self))} on {self.device}>"


def _rebuild(state: Any) -> Generator:
    generator = Generator("tpu")
    generator.set_state(state)
    return generator


def _is_tpu(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "tpu"
    return isinstance(device, str) and device.split(":", 1)[0] == "tpu"


def is_tpu_generator(generator: Any) -> bool:
    return type(generator) is Generator


def make_default() -> Generator:
    """A TPU generator for ``STATE.generator`` (made before ``register``: ``device`` is read lazily)."""
    return _BASE.__new__(Generator, "cpu")


def resolve(kwargs: dict, default: Any, tracing: bool) -> dict:
    """The kwargs a random TPU operator runs with: the TPU's default generator when none was given.

    A generator given is used as is: the dispatcher hands operators a new Python object for it, of
    the base class, so a CPU generator cannot be told from a TPU one here (a chip refuses the former).
    """
    if kwargs.get("generator") is not None or tracing:
        return kwargs
    kwargs = dict(kwargs)
    kwargs["generator"] = default
    return kwargs


def register(device: Any) -> None:
    """``torch.Generator`` becomes :class:`Generator` (idempotent)."""
    _TPU[0] = device
    torch.Generator = Generator  # type: ignore[misc]
