"""The plugin's only door to the TPU backend.

Everything here goes through the public surface of torch_tpu 0.2.0 (``torch.accelerator.*``, device
type ``"tpu"``, ``torch.tpu.get_device_properties``/``get_device_name``) so the same code runs on a
real TPU VM, on the project's simulated TPU and on any other stand-in offering that surface. Never
``torch.tpu.device_count()``/``is_available()`` (they raise for user code) and never
``hasattr(torch, "tpu")`` (torch_tpu registers the module even where it finds no chip).

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


def rng_state() -> Any:
    """The random state of this process's chip (a CPU ``ByteTensor``).

    Through ``torch.tpu.default_generators``, public in torch_tpu 0.2.0: ``torch.tpu.get_rng_state()``
    is internal to torch_tpu and raises for user code.
    """
    return getattr(_torch(), DEVICE_TYPE).default_generators[0].get_state()


def set_rng_state(state: Any) -> None:
    """Restore a state :func:`rng_state` returned."""
    getattr(_torch(), DEVICE_TYPE).default_generators[0].set_state(state)
