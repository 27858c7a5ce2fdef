"""Progress of long work (``warmup()``, ``transformers-tpu doctor``), shown the way Transformers shows it.

A :class:`Progress` counts finished steps: a tqdm bar on stderr that honours Transformers'
progress-bar switch (``transformers.utils.logging.disable_progress_bar()``,
``HF_HUB_DISABLE_PROGRESS_BARS=1``), and one line per step on the plugin's logger at ``info`` level
(``TRANSFORMERS_VERBOSITY=info`` shows them) with the seconds the step took::

    with Progress(len(shapes), desc="warmup", unit="bucket") as progress:
        for shape in shapes:
            compile(shape)
            progress.step(f"compiled {shape}")
"""

from __future__ import annotations

import logging
import time
from typing import Any

__all__ = ["Progress"]

logger = logging.getLogger("transformers_tpu_ext")


def _transformers_logging() -> Any:
    try:
        from transformers.utils import logging as hf_logging
    except Exception:  # noqa: BLE001 - without Transformers: no bar; the log lines still come
        return None
    return hf_logging


class Progress:
    """``total`` steps of ``desc``: a bar (when Transformers shows bars) and an info line per step."""

    def __init__(self, total: int, *, desc: str, unit: str = "it") -> None:
        self.desc = desc
        hf_logging = _transformers_logging()
        self._bar = hf_logging.tqdm(total=total, desc=desc, unit=unit) if hf_logging is not None else None
        self._last = time.perf_counter()

    def step(self, what: str) -> None:
        """One step finished: advance the bar, log ``"<desc>: <what> (N.N s)"`` at info level."""
        now = time.perf_counter()
        if self._bar is not None:
            self._bar.update(1)
        logger.info("transformers-tpu-ext: %s: %s (%.1f s)", self.desc, what, now - self._last)
        self._last = now

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
