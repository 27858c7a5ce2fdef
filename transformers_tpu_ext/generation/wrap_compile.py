"""``valid_auto_compile_criteria``: generation compiles with a configuration the ``tpu`` backend takes.

A ``CompileConfig`` the ``tpu`` backend rejects (``mode="reduce-overhead"``, ``backend="inductor"``...)
is adapted (``policy.tpu_compile_settings``), with one warning; TorchDynamo's recompile limit is
raised so each bucket gets its graph (``compilation.recompile_limit``, released by :func:`restore`).
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from ..backend import is_tpu
from ..compilation import recompile_limit
from ..core.wrapping import fail_safe
from . import config as settings_module
from . import policy
from .call import CURRENT, bind


_warned_lock = threading.Lock()
_warned_configs: set[str] = set()

def valid_auto_compile_criteria(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not is_tpu(getattr(instance, "device", None)):
        return wrapped(*args, **kwargs)
    return _valid_auto_compile_criteria_on_tpu(wrapped, instance, args, kwargs)


@fail_safe
def _valid_auto_compile_criteria_on_tpu(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    arguments = bind("_valid_auto_compile_criteria", args, kwargs)
    generation_config = arguments["generation_config"]
    adapted = _adapt_compile_config(generation_config.compile_config)
    if adapted is not None:
        generation_config.compile_config = adapted
    can_compile = wrapped(**arguments)
    if can_compile:
        state = CURRENT.get()
        settings = state.settings if state else settings_module.current()
        recompile_limit.require("generate", settings.forward_graphs(), floor=settings.recompile_limit)
    return can_compile


def _adapt_compile_config(config: Any) -> Any:
    """A TPU-safe copy of ``config`` (``policy.tpu_compile_settings``), or ``None`` if fine."""
    if config is None:
        return None
    settings, changes = policy.tpu_compile_settings(config.backend, config.mode, config.options, config.dynamic)
    if not changes:
        return None
    adapted = copy.copy(config)
    for name, value in settings.items():
        setattr(adapted, name, value)
    key = repr(sorted(changes))
    with _warned_lock:
        first = key not in _warned_configs
        _warned_configs.add(key)
    if first:
        from .. import log

        log.warn(
            "transformers-tpu-ext: the CompileConfig given to generate() cannot run on TPU; adapted it ("
            + ", ".join(changes)
            + "). Pass CompileConfig(backend='tpu', mode='default', dynamic=False) to silence this warning.",
            stacklevel=2,
        )
    return adapted


def restore() -> None:
    """Generation no longer needs a raised recompile limit (TorchDynamo gets its own back once no work does)."""
    recompile_limit.release("generate")
