"""The machine the simulated TPU runs on: how much memory it can give the simulated chips.

Everything on the simulated TPU lives in this machine's memory, so a simulated chip cannot honestly
claim more HBM than the host can back: code that sizes a buffer from the chip's HBM (the serving KV
cache, a user's own) would allocate that much host memory. Standard library only.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

__all__ = ["memory_bytes"]

_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


@functools.lru_cache(maxsize=1)
def memory_bytes() -> int | None:
    """This process' usable memory: the physical RAM, or a smaller cgroup (container) limit; ``None`` if unknown."""
    sizes = []
    try:
        sizes.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        pass
    for path in _CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < 1 << 60:  # "max" or a huge number: no limit
            sizes.append(int(text))
    return min(sizes) if sizes else None
