"""The plugin's only door to the TPU backend.

Everything here goes through the public surface of torch_tpu 0.2.0 (``torch.accelerator.*``, device
type ``"tpu"``, ``torch.tpu.get_device_properties``/``get_device_name``/``default_generators``) so the
same code runs on a real TPU VM, on the project's simulated TPU and on any other stand-in offering that
surface. Never the ``torch.tpu`` names torch_tpu keeps for PyTorch (``device_count``, ``is_available``,
``synchronize``, ``current_device``, ``set_device``, streams, ``device`` from torch 2.11;
``get_rng_state``, ``initial_seed`` from torch 2.13: they raise for user code; the list is
``testing.internal_apis.INTERNAL_APIS``) and never ``hasattr(torch, "tpu")`` (torch_tpu registers the
module even where it finds no chip).

Every question is answered when it is asked, never cached at import: torch_tpu may register its
device after the plugin was activated (entry points load in no fixed order).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from .core.topology import normalize_generation

DEVICE_TYPE = "tpu"

__all__ = [
    "DEVICE_TYPE", "ChipInfo", "chip_info", "device_count", "is_tpu", "rng_state", "set_rng_state", "tpu_available",
]


def _torch() -> Any:
    # The plugin never imports torch itself: every caller runs after torch is imported.
    return sys.modules.get("torch")


def tpu_available() -> bool:
    """Whether the current accelerator is a TPU with at least one chip."""
    torch = _torch()
    if torch is None:
        return False
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return False
    try:
        current = accelerator.current_accelerator()
        return current is not None and current.type == DEVICE_TYPE and bool(accelerator.is_available())
    except Exception:
        return False


def device_count() -> int:
    """Chips attached to this host (0 without a TPU)."""
    if not tpu_available():
        return 0
    return int(_torch().accelerator.device_count())


def is_tpu(device: Any) -> bool:
    """Whether ``device`` (a ``torch.device``, a string, a tensor or a module) lives on a TPU."""
    if device is None:
        return False
    dev = getattr(device, "device", device)
    if isinstance(dev, str):
        return dev.split(":", 1)[0] == DEVICE_TYPE
    return getattr(dev, "type", None) == DEVICE_TYPE


@dataclass(frozen=True)
class ChipInfo:
    """What the backend says of the chip this process is bound to."""

    name: str
    generation: str | None
    total_memory: int
    count: int


def chip_info() -> ChipInfo | None:
    """Name, generation, HBM (bytes) and chip count, or ``None`` without a TPU."""
    if not tpu_available():
        return None
    tpu = getattr(_torch(), "tpu")
    props = tpu.get_device_properties()
    name = str(getattr(props, "name", "") or tpu.get_device_name())
    return ChipInfo(
        name=name,
        generation=normalize_generation(name),
        total_memory=int(props.total_memory),
        count=device_count(),
    )


def _default_generator() -> Any:
    torch = _torch()
    return getattr(torch, DEVICE_TYPE).default_generators[torch.accelerator.current_device_index()]


def rng_state() -> Any:
    """The random state of this process's chip (a CPU ``ByteTensor``).

    Through ``torch.tpu.default_generators`` (one generator per chip; public in torch_tpu 0.2.0 on every
    supported torch): ``torch.tpu.get_rng_state()`` is internal to torch_tpu from torch 2.13 and raises
    for user code.
    """
    return _default_generator().get_state()


def set_rng_state(state: Any) -> None:
    """Restore a state :func:`rng_state` returned."""
    _default_generator().set_state(state)
