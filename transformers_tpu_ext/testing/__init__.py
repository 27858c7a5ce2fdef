"""The simulated TPU: a CPU-backed ``tpu`` device with torch_tpu 0.2.0's public surface.

For the project's tests and for users' own CI (see ``docs/simulated-tpu.md``)::

    from transformers_tpu_ext import testing

    sim = testing.install(chips=4, generation="v6e")
    x = torch.ones(2, device="tpu")
    print(sim.counters())

Importing this package is cheap: torch is imported when :func:`install` runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .counters import Counters

if TYPE_CHECKING:
    from .instance import SimulatedTPU

__all__ = [
    "Counters", "SimulatedTPU", "install", "install_from_env", "is_installed", "cache_only", "no_new_programs", "simulated_tpu",
]


def install(
    chips: int = 4,
    generation: str = "v6e",
    hbm_bytes: int | str | None = None,
    untie_on_move: bool = False,
) -> SimulatedTPU:
    """Install the simulated TPU in this process (once; a later call reconfigures it)."""
    from .simulator import install as _install

    return _install(chips=chips, generation=generation, hbm_bytes=hbm_bytes, untie_on_move=untie_on_move)


def install_from_env(spec: str) -> SimulatedTPU:
    """Install from a ``TRANSFORMERS_TPU_EXT_SIMULATE`` value: ``"1"`` or ``"chips=4,generation=v6e,hbm=1GiB,untie_on_move=1"``."""
    from .simulator import install_from_env as _install_from_env

    return _install_from_env(spec)


def is_installed() -> bool:
    """Whether the simulated TPU is installed in this process (never imports torch)."""
    import sys

    instance = sys.modules.get(__name__ + ".instance")
    return bool(instance is not None and instance.is_installed())


def simulated_tpu() -> SimulatedTPU | None:
    """The installed simulator, or ``None``."""
    import sys

    instance = sys.modules.get(__name__ + ".instance")
    return None if instance is None else instance.simulated_tpu()


def __getattr__(name: str) -> Any:
    if name == "SimulatedTPU":
        from .instance import SimulatedTPU

        return SimulatedTPU
    if name == "no_new_programs":  # also the pytest fixture of the same name
        from .programs import no_new_programs

        return no_new_programs
    if name == "cache_only":  # also the pytest fixture of the same name
        from .programs import cache_only

        return cache_only
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
