"""Accelerate: ``save_state()`` / ``load_state()`` and ``synchronize_rng_state`` keep the TPU's random state
through torch_tpu's public API.

Accelerate 1.16 (``checkpointing.save_accelerator_state`` / ``load_accelerator_state``,
``utils.random.synchronize_rng_state``) reads and restores the accelerator's random state with
``torch.get_device_module("tpu").get_rng_state()`` / ``.set_rng_state()`` when
``torch.accelerator.random`` is missing (torch < 2.14). torch_tpu 0.2.0 makes ``torch.tpu.get_rng_state``
internal from torch 2.13: called from Accelerate, it raises ``RuntimeError: get_rng_state is internal to
TorchTPU ...``, so ``Accelerator.save_state()`` fails on a chip (after writing the model and the
optimizer), and so does ``synchronize_rng_state("tpu")``. ``set_rng_state`` is only experimental (one
warning), so ``load_state()`` restores a state; it goes through the same generator here, so what is
saved and what is restored are one state.

The hook is the narrowest one that leaves Accelerate's code in Accelerate: the two modules' own
``torch`` name becomes a transparent proxy of ``torch`` (:class:`_Torch`) whose only difference is
``get_device_module``: for ``"tpu"``, while the TPU is the current accelerator, it returns the TPU
module behind an RNG facade (:class:`_RngFacade`), whose ``get_rng_state`` / ``set_rng_state`` read
and restore this process's chip's default generator through ``backend.rng_state`` /
``backend.set_rng_state`` (``torch.tpu.default_generators``, public on every supported torch);
everything else on it is torch_tpu's. Every other name of ``torch`` (``torch.accelerator``, so
Accelerate's ``device_module is torch.accelerator`` test and its torch >= 2.14 path through
``torch.accelerator.random``; ``torch.save``; the CPU's state), every other device and every host
without a TPU get PyTorch's own objects: upstream runs untouched. Wrapping the three functions instead
would still need this substitution inside them (their lookups of ``torch.get_device_module`` are the
TPU branch), and patching ``torch.get_device_module`` itself would change it for every library.

The saved state is a CPU ``ByteTensor`` under Accelerate's own key (``torch_tpu_manual_seed``), so a
checkpoint loads where torch_tpu is not installed.
"""

from __future__ import annotations

import sys
from typing import Any

import wrapt

from .. import backend
from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps, warn_once

NAME = "accelerate_rng"
TARGET = "accelerate.checkpointing"
DISTRIBUTION = "accelerate"
#: The functions whose TPU branch reaches ``torch.get_device_module(...).get_rng_state`` / ``set_rng_state``
#: through their module's own ``torch`` (``apply`` also checks that name is PyTorch itself).
RELIES_ON = (
    Attribute("torch"),
    Signature("save_accelerator_state", positional=("output_dir",)),
    Signature("load_accelerator_state", positional=("input_dir",)),
    Attribute("accelerate.utils.random:torch"),
    Signature("accelerate.utils.random:synchronize_rng_state", positional=("rng_type",)),
)

#: The modules whose ``torch`` becomes :class:`_Torch` (``accelerate.utils.random`` is imported before
#: ``accelerate.checkpointing``, which imports it through ``accelerate.utils``).
MODULES = ("accelerate.checkpointing", "accelerate.utils.random")

_wraps = Wraps()


class _RngFacade(wrapt.ObjectProxy):  # type: ignore[misc]
    """The TPU's device module, with its random state read and restored through the public generators."""

    def get_rng_state(self, device: Any = "tpu") -> Any:
        try:
            return backend.rng_state()
        except Exception as error:  # noqa: BLE001 - a bug of ours falls back to torch_tpu's own function
            warn_once(f"reading the TPU's random state failed ({type(error).__name__}: {error}); Accelerate's call runs")
            return self.__wrapped__.get_rng_state(device)

    def set_rng_state(self, new_state: Any, device: Any = "tpu") -> None:
        try:
            backend.set_rng_state(new_state)
        except Exception as error:  # noqa: BLE001
            warn_once(f"restoring the TPU's random state failed ({type(error).__name__}: {error}); Accelerate's call runs")
            self.__wrapped__.set_rng_state(new_state, device)


class _Torch(wrapt.ObjectProxy):  # type: ignore[misc]
    """``torch`` as the patched modules see it: PyTorch's own, but for the TPU's device module."""

    def get_device_module(self, device: Any = None) -> Any:
        module = self.__wrapped__.get_device_module(device)
        if device is not None and backend.is_tpu(device) and backend.tpu_available():
            return _RngFacade(module)
        return module


def apply(module: Any) -> None:
    if _wraps:
        return
    torch = sys.modules["torch"]
    modules = [module if name == TARGET else sys.modules[name] for name in MODULES]
    for target in modules:  # what the proxy relies on: each module's own ``torch`` is PyTorch
        if getattr(target, "torch", None) is not torch:
            raise AttributeError(f"{target.__name__}.torch is not the torch module; the TPU random-state proxy stands aside")
    for target in modules:
        _wraps.replace(target, "torch", _Torch(torch))


def revert() -> None:
    _wraps.unwrap_all()
