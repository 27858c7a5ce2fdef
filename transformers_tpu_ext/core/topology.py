"""Which process counts a TPU generation can run: pure data and logic, no torch.

torch_tpu builds a slice topology for the processes of one host (one process per chip). Only some
counts have one; any other fails late, in every worker, with ``No TPU topology found for count: N``.
``transformers-tpu launch`` checks the count up front with :func:`check_process_count`, and
``transformers-tpu doctor`` shows :func:`supported_counts` for the chip it sees.

This table is the plugin's one copy (the simulated TPU keeps its own, as a stand-in for the backend).
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Mapping

__all__ = ["TOPOLOGIES", "check_process_count", "normalize_generation", "supported_counts"]

#: Generation → process counts (per host) that have a topology, from torch_tpu 0.2.0.
TOPOLOGIES: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {
        "v4": (1, 2, 4, 8),
        "v5p": (1, 2, 4, 8),
        "v5e": (1, 4, 8),
        "v6e": (1, 4, 8),
        "v7": (2, 4, 8),
    }
)

# "TPU v6e", "v5litepod", "TPU v5 lite", "TPU v5" (v5p), "TPU7x" (v7), "v7x".
_NAME = re.compile(r"v?\s*(\d+)\s*([a-z]*)(\s+lite)?", re.IGNORECASE)
_ALIASES = {"v5lite": "v5e", "v5litepod": "v5e", "v6lite": "v6e", "v5": "v5p", "v7x": "v7"}


def normalize_generation(name: str | None) -> str | None:
    """The generation key of a device name (``"TPU v6e"`` → ``"v6e"``), ``None`` if there is none.

    Accepts the spellings torch_tpu and the TPU runtime use: ``"TPU v5 lite"`` and ``"v5litepod"``
    are v5e, ``"TPU v6 lite"`` is v6e, ``"TPU v5"`` is v5p, ``"TPU7x"`` is v7.
    """
    text = (name or "").strip().lower()
    if text.startswith("tpu"):
        text = text[3:].strip()
    match = _NAME.match(text)
    if not match:
        return None
    number, suffix, lite = match.groups()
    key = f"v{number}{suffix}{'lite' if lite else ''}"
    return _ALIASES.get(key, key)


def supported_counts(generation: str | None) -> tuple[int, ...] | None:
    """Process counts with a topology for ``generation`` (any spelling), ``None`` if unknown."""
    return TOPOLOGIES.get(normalize_generation(generation) or "")


def check_process_count(generation: str | None, count: int) -> str | None:
    """``None`` when ``count`` processes per host can run on ``generation``, else what to do.

    An unknown generation passes (the backend has the last word).
    """
    counts = supported_counts(generation)
    if counts is None or count in counts:
        return None
    listed = ", ".join(str(c) for c in counts)
    key = normalize_generation(generation)
    fits = [c for c in counts if c <= count]
    hint = f" (e.g. --nproc_per_node={fits[-1]})" if fits else ""
    return (
        f"TPU {key} has no topology for {count} process{'' if count == 1 else 'es'} per host: "
        f"supported counts are {listed}. Pass one of them as --nproc_per_node{hint}."
    )
