"""Environment variables that steer activation, read when they are needed (never cached)."""

from __future__ import annotations

import os

#: ``1``/``true``/``all`` disables every patch; a comma list of patch names disables those.
DISABLE_ENV = "TRANSFORMERS_TPU_EXT_DISABLE"

_ALL = {"1", "true", "yes", "on", "all", "*"}


def disabled_patches(environ: dict[str, str] | None = None) -> frozenset[str] | None:
    """The patch names switched off by ``TRANSFORMERS_TPU_EXT_DISABLE``.

    ``None`` means "all of them"; an empty set means none.
    """
    raw = (os.environ if environ is None else environ).get(DISABLE_ENV, "").strip()
    if raw.lower() in _ALL:
        return None
    return frozenset(part.strip() for part in raw.split(",") if part.strip() and part.strip() != "0")
