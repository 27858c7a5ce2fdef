"""Random operators without a ``generator`` argument draw from the simulated TPU's generator.

The dispatcher hands the TPU's generator to every operator whose schema takes one (``bernoulli_``,
``normal_``, ``randint``, ...). ``aten::native_dropout`` takes none: run on the CPU data, it would
draw from the CPU's default generator, so dropout on the TPU would move the CPU's random stream and
ignore ``torch.tpu.manual_seed`` / the TPU's saved state. On a device, dropout draws from the device's
generator; the simulator lends the TPU's state to the CPU generator for the duration of the call.
"""

from __future__ import annotations

from typing import Any

import torch

from . import device

__all__ = ["RANDOM_WITHOUT_GENERATOR", "register"]

_aten = torch.ops.aten

#: Operators that draw random numbers from the default generator of their device.
RANDOM_WITHOUT_GENERATOR = (_aten.native_dropout.default,)


def _on_tpu_generator(func: Any) -> Any:
    def handler(args: tuple, kwargs: dict) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or not isinstance(tensors[0], device.TpuTensor) or device._fake_mode_active():
            return device._run_generic(func, args, kwargs)
        cpu = torch.default_generator
        saved = cpu.get_state()
        cpu.set_state(device.STATE.generator.get_state())
        try:
            return device._run_generic(func, args, kwargs)
        finally:
            device.STATE.generator.set_state(cpu.get_state())
            cpu.set_state(saved)

    return handler


def register() -> None:
    """Route :data:`RANDOM_WITHOUT_GENERATOR` through the TPU's generator (idempotent)."""
    for func in RANDOM_WITHOUT_GENERATOR:
        device._SPECIAL[func] = _on_tpu_generator(func)
        device._INFO.pop(func, None)  # recomputed with the special handler
