"""``torch.accelerator.synchronize()`` and ``torch.accelerator.empty_cache()`` on the simulated TPU.

torch_tpu implements its device guard in C++, so ``torch.accelerator.synchronize()`` (the public way
to wait for the chip, since ``torch.tpu.synchronize`` is internal to torch_tpu) reaches it. A Python
backend's device guard cannot implement ``synchronizeDevice``: PyTorch raises ``Backend doesn't
support synchronizing all streams on device``. The simulator wraps ``torch.accelerator.synchronize``:
for the TPU it returns at once (operations already ran, on the CPU) and counts the call in
``SimulatedTPU.synchronizations``; for any other device it calls PyTorch's.

``torch.accelerator.empty_cache()`` works on a chip (torch_tpu's allocator is a c10 device allocator:
reference notes, "Memory"); a Python backend has none, and PyTorch fails an internal assertion
(``Allocator for tpu is not a DeviceAllocator``). Accelerate 1.16 calls it at the start of every
``Trainer.train()`` (``free_memory``). For the TPU the simulator's returns at once (it holds no cached
blocks); otherwise PyTorch's runs.

``torch.accelerator.random`` (torch >= 2.14: ``get_rng_state``, ``initial_seed``; what Accelerate saves in
``save_state()`` there) asks the backend's hooks for its default generator
(``torch._C._accelerator_getDefaultGenerator``); torch_tpu's C++ hooks give it (``TpuHooksInterface::
getDefaultGenerator``, in the wheel's glue for every torch), a Python backend's hooks cannot (PyTorch raises
``implement getDefaultGenerator``). For the TPU the simulator's returns ``torch.tpu.default_generators[i]``;
for any other accelerator PyTorch's runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]

_registered = False


def _on_simulated_tpu(device: Any) -> Any:
    """The simulator when ``device`` (``None``: the current accelerator) is its TPU, else ``None``."""
    import torch

    from .instance import simulated_tpu

    sim = simulated_tpu()
    if sim is None or sim.is_hidden:
        return None
    if device is None:
        current = torch.accelerator.current_accelerator()
        on_tpu = current is not None and current.type == "tpu"
    else:
        on_tpu = isinstance(device, int) or torch.device(device).type == "tpu"
    return sim if on_tpu else None


def _synchronize(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    sim = _on_simulated_tpu(args[0] if args else kwargs.get("device"))
    if sim is None:
        return wrapped(*args, **kwargs)
    sim.synchronizations += 1
    return None


def _empty_cache(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _on_simulated_tpu(None) is None:
        return wrapped(*args, **kwargs)
    return None


def _default_generator(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _on_simulated_tpu(None) is None:
        return wrapped(*args, **kwargs)
    import torch

    index = args[0] if args else kwargs.get("device_index", -1)
    generators = torch.tpu.default_generators
    return generators[index if isinstance(index, int) and 0 <= index < len(generators) else 0]


def register() -> None:
    """Wrap ``torch.accelerator.synchronize``, ``empty_cache`` and the default-generator hook (once per process)."""
    global _registered
    if _registered:
        return
    import torch
    import wrapt

    wrapt.wrap_function_wrapper("torch.accelerator", "synchronize", _synchronize)
    wrapt.wrap_function_wrapper("torch.accelerator", "empty_cache", _empty_cache)
    if hasattr(torch._C, "_accelerator_getDefaultGenerator"):  # torch >= 2.14
        wrapt.wrap_function_wrapper(torch._C, "_accelerator_getDefaultGenerator", _default_generator)
    _registered = True
