"""The ``torch.tpu`` names torch_tpu 0.2.0 keeps for PyTorch itself, and the simulator's check of their callers.

torch_tpu declares each of them in ``torch_tpu/_internal/device/_device_module.py`` with
``@annotations.internal_or_experimental(internal_when=get_torch_version() >= (a, b), prefer=...,
strict=_STRICT_INTERNAL_DEVICE_APIS)``: when the installed torch is at least ``(a, b)`` (read once,
when torch_tpu is imported), a call from any module outside the ``torch`` and ``torch_tpu`` packages

- raises ``RuntimeError: <name> is internal to TorchTPU and can only be called by the PyTorch
  framework (torch and torch_tpu). Use <prefer> instead.`` on every such call, or,
- with ``TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1`` (read once), warns once per name
  (``UserWarning: <TorchTpu/ApiStage/InternalApi/> <name> is internal to TorchTPU and may change or
  be removed without notice. Use <prefer> instead.``);

the caller is the frame that called the name (``sys._getframe(1)``); it is not checked while
TorchDynamo traces the call (``torch.compiler.is_compiling()``). A class (``torch.tpu.device``,
torch_tpu's ``_DeviceContext``) is checked when it is instantiated, and named by its class name.
Below ``(a, b)`` the name is only experimental and anyone may call it.

:data:`INTERNAL_APIS` is that table, in one place; the simulated ``torch.tpu`` (:mod:`.tpu_module`)
applies it with :func:`internal`, its own package standing for ``torch_tpu``.
``tests/simulator/test_internal_apis.py`` compares the table with the wheel's sources (with the
``ast`` of ``_device_module.py``) wherever torch_tpu is installed (``scripts/check_torch_tpu.sh``).

The table and the rules are plain data and plain functions (no torch at import).
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

__all__ = [
    "ALLOW_ENV", "FRAMEWORK_PACKAGES", "INTERNAL_APIS", "InternalAPI", "error_message", "internal",
    "internal_names", "is_framework_module", "parse_version", "warning_message",
]

_T = TypeVar("_T")


@dataclass(frozen=True)
class InternalAPI:
    """One internal ``torch.tpu`` name: from which torch release it is internal, and what to call instead."""

    since: tuple[int, int]
    prefer: str


#: ``torch.tpu`` name -> its torch threshold and replacement, as torch_tpu 0.2.0 declares them.
INTERNAL_APIS: Mapping[str, InternalAPI] = {
    "current_device": InternalAPI((2, 11), "torch.accelerator.current_device_index"),
    "current_stream": InternalAPI((2, 11), "torch.accelerator.current_stream"),
    "device": InternalAPI((2, 11), "torch.accelerator.device_index"),
    "device_count": InternalAPI((2, 11), "torch.accelerator.device_count"),
    "get_rng_state": InternalAPI((2, 13), "torch.accelerator.random.get_rng_state"),
    "initial_seed": InternalAPI((2, 13), "torch.accelerator.random.initial_seed"),
    "is_available": InternalAPI((2, 11), "torch.accelerator.is_available"),
    "set_device": InternalAPI((2, 11), "torch.accelerator.set_device_index"),
    "set_stream": InternalAPI((2, 11), "torch.accelerator.set_stream"),
    "synchronize": InternalAPI((2, 11), "torch.accelerator.synchronize"),
}

#: The packages whose modules may call an internal name: PyTorch, torch_tpu, and the simulator
#: (this package), which stands for torch_tpu here.
FRAMEWORK_PACKAGES: tuple[str, ...] = ("torch", "torch_tpu", __name__.rpartition(".")[0])

#: torch_tpu's switch from the error to a one-time warning.
ALLOW_ENV = "TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


#: Whether an outside call raises (True) or warns once (False): read once, at import, as torch_tpu does.
STRICT: bool = not _env_flag(ALLOW_ENV)


def parse_version(version: str) -> tuple[int, ...]:
    """The leading numeric components of a version (``"2.13.0+cpu"`` -> ``(2, 13, 0)``), as torch_tpu reads torch's."""
    components = []
    for part in version.split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        components.append(int(digits))
    return tuple(components)


def internal_names(torch_version: tuple[int, ...]) -> frozenset[str]:
    """The ``torch.tpu`` names that are internal under a torch of ``torch_version``."""
    return frozenset(name for name, api in INTERNAL_APIS.items() if torch_version >= api.since)


def is_framework_module(module: Any) -> bool:
    """Whether a frame of the module named ``module`` may call internal names."""
    if not isinstance(module, str) or not module:
        return False
    return any(module == package or module.startswith(package + ".") for package in FRAMEWORK_PACKAGES)


def error_message(display: str, prefer: str) -> str:
    """torch_tpu's error for an outside call of ``display`` (a function's or class's ``__name__``)."""
    return (
        f"{display} is internal to TorchTPU and can only be called by the PyTorch framework (torch and "
        f"torch_tpu). Use {prefer} instead."
    )


def warning_message(display: str, prefer: str) -> str:
    """torch_tpu's one-time warning, under ``TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1``."""
    return (
        f"<TorchTpu/ApiStage/InternalApi/> {display} is internal to TorchTPU and may change or be removed "
        f"without notice. Use {prefer} instead."
    )


def _compiling() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.compiler.is_compiling())


#: The names that warned already (torch_tpu warns once per name and process).
_warned: set[str] = set()


def _guarded(function: Callable[..., Any], display: str, prefer: str) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # As torch_tpu: not while TorchDynamo traces (it cannot trace the frame lookup).
        if (STRICT or display not in _warned) and not _compiling():
            caller = sys._getframe(1).f_globals.get("__name__")
            if not is_framework_module(caller):
                if STRICT:
                    raise RuntimeError(error_message(display, prefer))
                warnings.warn(warning_message(display, prefer), UserWarning, stacklevel=2)
                _warned.add(display)
        return function(*args, **kwargs)

    return wrapper


def internal(name: str, torch_version: tuple[int, ...] | None = None) -> Callable[[_T], _T]:
    """Decorate the simulated ``torch.tpu.<name>`` (a function, or a class: its ``__init__``) with
    torch_tpu's rule, when ``name`` is internal under ``torch_version`` (default: the installed torch's)."""
    api = INTERNAL_APIS[name]
    if torch_version is None:
        torch_version = parse_version(sys.modules["torch"].__version__)

    def decorate(target: _T) -> _T:
        if torch_version < api.since:
            return target
        if isinstance(target, type):
            target.__init__ = _guarded(target.__init__, target.__name__, api.prefer)  # type: ignore[misc]
            return target
        return _guarded(target, getattr(target, "__name__", name), api.prefer)  # type: ignore[arg-type, return-value]

    return decorate
