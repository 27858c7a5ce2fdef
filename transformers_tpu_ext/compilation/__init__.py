"""Compile once: the persistent compile cache.

The decision (pure module, no torch, no Transformers): :mod:`.cache`, whether the plugin points
torch_tpu's persistent compile cache at a directory, and which (``TRANSFORMERS_TPU_EXT_COMPILE_CACHE``).
The runtime: :mod:`.persistent` (sets the cache up at activation, :func:`cache_report`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["cache_report"]


def cache_report() -> dict[str, Any]:
    """The persistent compile cache of this process: root, who set it, entries, size, hits and misses."""
    from .persistent import report

    return report()
