"""Factories on the simulated device: the PrivateUse1 fallback, and :func:`register`, which routes them through it."""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import generators as _generators
from . import report
from .compile_cache import CACHE as _COMPILE_CACHE
from .device import _CPU, STATE, _aten, _info, _is_tpu_wrapper, _to_copy, _wrap

__all__ = ["register"]

def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    if "device" in kwargs:
        kwargs["device"] = _CPU
    new_args = []
    for a in args:
        if isinstance(a, torch.Tensor) and _is_tpu_wrapper(a):
            a = a._cpu
        elif isinstance(a, torch.device) and a.type == "tpu":
            a = _CPU
        new_args.append(a)
    info = _info(op)
    if info.generator:
        kwargs = _generators.resolve(kwargs, STATE.generator, False)
    out = op(*new_args, **kwargs)
    if info.counted and not STATE.in_graph:
        STATE.eager_ops += 1
        key = (op, tuple(_hashable(a) for a in args))
        try:
            if key not in STATE.seen:
                if _COMPILE_CACHE.miss("eager", key):
                    STATE.eager_programs += 1
                    report.compiled()
                STATE.seen.add(key)
            else:
                _COMPILE_CACHE.hits += 1
        except TypeError:
            pass
    return _wrap(out)


def _hashable(a: Any) -> Any:
    if isinstance(a, (int, float, bool)):
        return a
    if isinstance(a, (list, tuple)):
        return tuple(a)
    return None


def _to_copy_kernel(*args: Any, **kwargs: Any) -> Any:
    # ``torch.tensor(data, device="tpu")`` dispatches ``_to_copy`` of a CPU tensor to the
    # PrivateUse1 key; through the generic fallback PyTorch hits an internal assert, so the
    # operator gets its own kernel.
    return _to_copy(args, kwargs)


_RESIZING_FACTORIES = (
    "arange", "arange.start", "arange.start_step", "range", "range.step", "eye", "eye.m",
    "hann_window", "hann_window.periodic", "hamming_window", "hamming_window.periodic",
    "hamming_window.periodic_alpha", "hamming_window.periodic_alpha_beta", "bartlett_window",
    "bartlett_window.periodic", "blackman_window", "blackman_window.periodic", "kaiser_window",
    "kaiser_window.periodic", "kaiser_window.beta",
)


def _overload(name: str) -> Any:
    base, _, overload = name.partition(".")
    return getattr(getattr(_aten, base), overload or "default")


_LIBRARY: Any = None
_ATEN_LIBRARY: Any = None


def register(device: torch.device) -> None:
    """Route PrivateUse1 factories through :func:`_fallback`; wrappers are made on ``device``."""
    global _LIBRARY, _ATEN_LIBRARY
    STATE.device = device
    if _LIBRARY is None:
        lib = torch.library.Library("_", "IMPL")  # noqa: TOR901 - a process-wide fallback is the point
        lib.fallback(_fallback, "PrivateUse1")
        aten = torch.library.Library("aten", "IMPL")  # noqa: TOR901
        aten.impl("_to_copy", _to_copy_kernel, "PrivateUse1")
        # Factories PyTorch builds as ``empty(0)`` + an ``out=`` kernel that resizes it: a
        # wrapper cannot be resized, so they get kernels that build the CPU tensor directly.
        for name in _RESIZING_FACTORIES:
            aten.impl(name, functools.partial(_fallback, _overload(name)), "PrivateUse1")
        # ``torch.tensor([t, ...])`` of device scalars reads each with ``item()`` from C++ (Qwen-VL's
        # get_rope_index); through the generic fallback PyTorch hits the same internal assert.
        aten.impl("_local_scalar_dense", functools.partial(_fallback, _aten._local_scalar_dense.default), "PrivateUse1")
        _LIBRARY, _ATEN_LIBRARY = lib, aten
