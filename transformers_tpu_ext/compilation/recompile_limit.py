"""TorchDynamo's recompile limit: one owner for the plugin, raised to what the capabilities plan.

Every bucket of a compiled function is a recompilation of that function; past
``torch._dynamo.config.recompile_limit`` TorchDynamo stops compiling it and the remaining shapes run
op by op in every call (each op a program of its own on a chip). So a capability that compiles one
function per planned shape (generation's forward graphs, serving's step shapes) calls
:func:`require` with the number of graphs it plans; :func:`release` (when its patch is reverted) gives
TorchDynamo back the limit it had once no capability needs a raised one.

The limit one capability needs is :func:`needed`: twice its graphs plus 8 (a second cache length
before a warm-up fixed one, and the model's other compiled functions), at least ``floor``. No torch at
import: TorchDynamo's config is read when a limit is required.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

__all__ = ["DEFAULT_FLOOR", "needed", "release", "require", "required"]

logger = logging.getLogger("transformers_tpu_ext")

#: The least limit the plugin sets when it raises it (TorchDynamo's default is 8).
DEFAULT_FLOOR = 64

_lock = threading.Lock()
_saved: int | None = None  # TorchDynamo's limit before the plugin raised it
_needs: dict[str, int] = {}  # work -> the limit it required


def needed(graphs: int, floor: int = DEFAULT_FLOOR) -> int:
    """The recompile limit ``graphs`` planned graphs of one function need: ``2 * graphs + 8``, at least ``floor``."""
    return max(floor, 2 * graphs + 8)


def required() -> dict[str, int]:
    """The limit each work (``generate``, ``serve``) required, as long as its patch is applied."""
    with _lock:
        return dict(_needs)


def _dynamo_config(load: bool) -> Any:
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None and load:
        import torch._dynamo as dynamo
    return getattr(dynamo, "config", None)


def require(work: str, graphs: int, floor: int = DEFAULT_FLOOR) -> int:
    """Raise TorchDynamo's recompile limit to what ``work``'s ``graphs`` planned graphs need
    (:func:`needed`); never lowers it. Returns the limit ``work`` needs."""
    global _saved
    limit = needed(graphs, floor)
    with _lock:
        _needs[work] = max(limit, _needs.get(work, 0))
        dynamo_config = _dynamo_config(load=True)
        current = dynamo_config.recompile_limit
        if current < limit:
            if _saved is None:
                _saved = current
            dynamo_config.recompile_limit = limit
            logger.info("transformers-tpu-ext: TorchDynamo recompile_limit raised from %d to %d (%s)", current, limit, work)
    return limit


def release(work: str) -> None:
    """``work`` no longer needs a raised limit; once no work does, TorchDynamo gets back the limit it had."""
    global _saved
    with _lock:
        _needs.pop(work, None)
        if _needs or _saved is None:
            return
        dynamo_config = _dynamo_config(load=False)
        if dynamo_config is not None:
            dynamo_config.recompile_limit = _saved
        _saved = None
