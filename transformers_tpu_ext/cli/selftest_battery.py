"""The pieces of ``transformers-tpu selftest``'s battery: a check, its outcome, what the checks share.

Apart from :mod:`.selftest` (the command) so that the checks (:mod:`.selftest_checks`,
:mod:`.selftest_workers`) and the command import them without importing each other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Check", "CheckFailed", "Context", "Result", "Skip"]


class Skip(Exception):
    """Raised by a check that cannot run here; ``str()`` is the reason."""


class CheckFailed(AssertionError):
    """Raised by a check whose claim does not hold; ``str()`` is the difference."""


@dataclass(frozen=True)
class Check:
    """One claim: ``run(ctx)`` returns facts (a JSON-able dict) or raises :class:`Skip` / ``AssertionError``."""

    name: str
    proves: str
    run: Callable[[Context], dict[str, Any] | None]


@dataclass
class Result:
    name: str
    status: str  # "pass", "fail", "skip"
    detail: str = ""
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # CPU time of this process and the processes it started (the wall time counts other load too)
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """What the checks share: where they run, the simulator (or None), a scratch directory, timings."""

    simulated: bool
    sim: Any
    tmp: str
    timings: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    _models: dict[str, str] = field(default_factory=dict)

    @property
    def on_chip(self) -> bool:
        return not self.simulated

    def programs(self) -> int:
        """Programs this process needed so far (compiled or loaded): what torch_tpu counts as cache misses."""
        import torch

        return int(torch.tpu._get_cache_misses())

    def traffic(self) -> int | None:
        """Host<->device bytes so far (only the simulated TPU counts them)."""
        if self.sim is None:
            return None
        counters = self.sim.counters()
        return counters.h2d_bytes + counters.d2h_bytes

    def model_dir(self, arch: str = "qwen3", **overrides: Any) -> str:
        """A tiny model of ``arch`` saved once under the scratch directory (for ``from_pretrained``)."""
        key = arch + "".join(f",{k}={v}" for k, v in sorted(overrides.items()))
        if key not in self._models:
            from ..testing.tiny import save_tiny_model

            path = os.path.join(self.tmp, f"model-{len(self._models)}")
            self._models[key] = str(save_tiny_model(path, arch, seed=0, **overrides))
        return self._models[key]
