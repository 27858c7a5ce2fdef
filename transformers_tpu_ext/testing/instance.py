"""The process's simulated TPU: its configuration, counters and switches (no PyTorch registration).

:mod:`.simulator` registers the device with PyTorch and sets the instance here; the pieces that
stand in for torch_tpu (``tpu_module``, ``tpu_distributed``, ``compile_backend``, ``synchronize``)
read it through :func:`simulated_tpu` when they are called, so they import this module, never the
installer: no import cycle.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from . import device
from .chips import CHIPS, default_hbm, parse_bytes
from .compile_cache import CACHE, SimulatedCompileCache
from .counters import Counters

__all__ = ["DEFAULTS", "SimulatedTPU", "is_installed", "simulated_tpu"]

DEFAULTS: dict[str, Any] = dict(chips=4, generation="v6e", hbm_bytes=None, untie_on_move=False)

class SimulatedTPU:
    """The process's simulated TPU: its configuration, counters and switches."""

    def __init__(self) -> None:
        self.chips: int = DEFAULTS["chips"]
        self.generation: str = DEFAULTS["generation"]
        self.hbm_bytes: int | None = DEFAULTS["hbm_bytes"]
        self.untie_on_move: bool = DEFAULTS["untie_on_move"]
        self._hidden = 0
        self._graphs_compiled = 0
        #: kwargs of every ``torch.tpu.distributed.set_tpu_launch_env`` call in this process.
        self.launch_env_calls: list[dict[str, Any]] = []
        #: ``torch.accelerator.synchronize()`` calls on the TPU in this process (see ``synchronize.py``).
        self.synchronizations = 0

    # -- configuration -------------------------------------------------------------------------
    def configure(
        self,
        *,
        chips: int | None = None,
        generation: str | None = None,
        hbm_bytes: int | str | None = None,
        untie_on_move: bool | None = None,
    ) -> SimulatedTPU:
        """Change what the simulator reports; arguments left out keep their value.

        ``generation`` may be one torch_tpu does not know (then ``get_device_properties`` raises
        ``RuntimeError`` as on such a chip). ``hbm_bytes`` overrides the generation's HBM.
        """
        if chips is not None:
            if int(chips) < 1:
                raise ValueError(f"chips must be >= 1, got {chips}")
            self.chips = int(chips)
        if generation is not None:
            generation = str(generation).lower()
            if not generation.startswith("v"):
                raise ValueError(f"generation looks like 'v6e', got {generation!r} (known: {sorted(CHIPS)})")
            self.generation = generation
        if hbm_bytes is not None:
            self.hbm_bytes = parse_bytes(hbm_bytes)
        if untie_on_move is not None:
            self.untie_on_move = bool(untie_on_move)
        return self

    def reset_config(self) -> SimulatedTPU:
        """Back to the defaults (4 v6e chips, the generation's HBM, no untie quirk)."""
        self.chips = DEFAULTS["chips"]
        self.generation = DEFAULTS["generation"]
        self.hbm_bytes = DEFAULTS["hbm_bytes"]
        self.untie_on_move = DEFAULTS["untie_on_move"]
        self._hidden = 0
        return self

    def hbm(self) -> int:
        """HBM per chip, as ``get_device_properties().total_memory`` reports it: ``hbm_bytes`` when set,
        else the generation's, capped so that the host's chips fit in half of this machine's memory
        (:func:`.chips.default_hbm`). ``KeyError`` for a generation torch_tpu does not know."""
        if self.hbm_bytes is not None:
            return self.hbm_bytes
        from .host import memory_bytes

        return default_hbm(CHIPS[self.generation], self.chips, memory_bytes())

    @property
    def is_hidden(self) -> bool:
        return self._hidden > 0 or self.is_parked

    # -- parking (the pytest fixture's scope) ------------------------------------------------
    @property
    def is_parked(self) -> bool:
        """Hidden between tests by the ``simulated_tpu`` fixture (see :meth:`park`)."""
        return getattr(self, "_parked", False)

    def park(self) -> None:
        """Hide the simulator until :meth:`unpark` (or ``install()``): what the ``simulated_tpu``
        fixture does after its test, so later tests that did not ask for it see no TPU."""
        self._parked = True

    def unpark(self) -> None:
        self._parked = False

    @contextlib.contextmanager
    def hidden(self) -> Iterator[None]:
        """Within the block the process sees no TPU: ``torch.accelerator.is_available()`` is
        False, ``device_count()`` is 0 and ``current_accelerator(check_available=True)`` is
        None. (``current_accelerator()`` without the check still names ``tpu``: PyTorch fixes
        it once the backend is registered.)"""
        self._hidden += 1
        try:
            yield
        finally:
            self._hidden -= 1

    # -- counters ------------------------------------------------------------------------------
    def counters(self) -> Counters:
        state = device.STATE
        return Counters(
            graphs_compiled=self._graphs_compiled,
            eager_programs=state.eager_programs,
            h2d_bytes=state.h2d_bytes,
            d2h_bytes=state.d2h_bytes,
            programs_loaded=CACHE.loaded,
            graph_calls=state.graph_calls,
            eager_ops=state.eager_ops,
        )

    def write_report(self) -> None:
        """Write this process's report now (``TRANSFORMERS_TPU_EXT_SIMULATE_REPORT``; see ``testing/report.py``)."""
        from . import report

        report.write("asked")

    def reset_counters(self) -> None:
        """Zero every counter and forget the eager programs seen (the next run counts again)."""
        self._graphs_compiled = 0
        device.STATE.reset()
        CACHE.reset_stats()

    @property
    def compile_cache(self) -> SimulatedCompileCache:
        """torch_tpu's compile cache as simulated: statistics, cache-only mode, the persistent tier
        (see ``testing/compile_cache.py``)."""
        return CACHE

    def __repr__(self) -> str:
        hbm = f", hbm_bytes={self.hbm_bytes}" if self.hbm_bytes is not None else ""
        return (
            f"SimulatedTPU(chips={self.chips}, generation={self.generation!r}{hbm}, "
            f"untie_on_move={self.untie_on_move}{', hidden' if self.is_hidden else ''})"
        )


_current: SimulatedTPU | None = None


def simulated_tpu() -> SimulatedTPU | None:
    """The installed simulator, or ``None``."""
    return _current


def is_installed() -> bool:
    return _current is not None


def set_current(sim: SimulatedTPU) -> None:
    """Called once, by the installer, after the device is registered with PyTorch."""
    global _current
    _current = sim
