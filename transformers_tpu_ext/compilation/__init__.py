"""Compile once, a service below the capabilities: the persistent compile cache, the recompile guard.

The decisions (pure modules, no torch, no Transformers):

- :mod:`.cache`: whether the plugin points torch_tpu's persistent compile cache at a directory, and
  which (``TRANSFORMERS_TPU_EXT_COMPILE_CACHE``);
- :mod:`.guard`: when a work (generate, serve, train) is in steady state, what a recompile report
  says, the guard's settings (``TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE``, :func:`configure`).

The runtime: :mod:`.persistent` (sets the cache up at activation, :func:`cache_report`),
:mod:`.recompile` (counts programs around a call, cache-only mode, :class:`RecompileError`, the
warm-ups' marks), :mod:`.recompile_limit` (TorchDynamo's recompile limit, raised to the graphs each
capability plans). Each capability's warm-up lives in its own folder (``generation/warm_up.py``, ...);
``transformers_tpu_ext.warmup`` chooses one.

The guard's glue lives with each capability, which calls this service: ``generation/patch_recompile_guard_generate``
(``generate()``), ``serving/patch_recompile_guard_serve`` (continuous-batching steps and warm-up),
``training/patch_recompile_guard_train`` (``Trainer.training_step``). See ``docs/compile-cache.md``.
"""

from __future__ import annotations

from typing import Any

from .guard import GuardSettings, configure, current, reset

__all__ = ["GuardSettings", "RecompileError", "cache_report", "configure", "current", "reset"]


def cache_report() -> dict[str, Any]:
    """The persistent compile cache of this process: root, who set it, entries, size, hits and misses."""
    from .persistent import report

    return report()


def __getattr__(name: str) -> Any:
    if name == "RecompileError":
        from .recompile import RecompileError

        return RecompileError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
