"""``torch.accelerator.synchronize()`` on the simulated TPU.

torch_tpu implements its device guard in C++, so ``torch.accelerator.synchronize()`` (the public way
to wait for the chip, since ``torch.tpu.synchronize`` is internal to torch_tpu) reaches it. A Python
backend's device guard cannot implement ``synchronizeDevice``: PyTorch raises ``Backend doesn't
support synchronizing all streams on device``. The simulator wraps ``torch.accelerator.synchronize``:
for the TPU it returns at once (operations already ran, on the CPU) and counts the call in
``SimulatedTPU.synchronizations``; for any other device it calls PyTorch's.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]

_registered = False


def _synchronize(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    import torch

    from .instance import simulated_tpu

    sim = simulated_tpu()
    device = args[0] if args else kwargs.get("device")
    if sim is None or sim.is_hidden:
        return wrapped(*args, **kwargs)
    if device is None:
        current = torch.accelerator.current_accelerator()
        on_tpu = current is not None and current.type == "tpu"
    else:
        on_tpu = isinstance(device, int) or torch.device(device).type == "tpu"
    if not on_tpu:
        return wrapped(*args, **kwargs)
    sim.synchronizations += 1
    return None


def register() -> None:
    """Wrap ``torch.accelerator.synchronize`` (once per process)."""
    global _registered
    if _registered:
        return
    import wrapt

    wrapt.wrap_function_wrapper("torch.accelerator", "synchronize", _synchronize)
    _registered = True
