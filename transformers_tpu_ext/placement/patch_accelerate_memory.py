"""Accelerate: ``get_max_memory()`` lists the TPU, with its memory budget.

Accelerate 1.15 enumerates npu, mlu, sdaa, musa, xpu, hpu and cuda, then ``cpu``: on a TPU host it
returns only ``{"cpu": ...}`` and ``device_map="auto"`` silently loads on CPU. With a TPU present, the
wrapper puts ``"tpu": budget`` first (the budget rule is :mod:`transformers_tpu_ext.placement.budget`), so
``get_balanced_memory`` / ``infer_auto_device_map`` fill the chip first and offload the rest to CPU
and disk exactly as they do for a GPU. A user's ``max_memory`` wins: its TPU entry (``"tpu"``,
``"tpu:0"`` or ``0``) is taken as given; without one, the TPU is not used, as for a GPU.

Accelerate's own callers (``get_balanced_memory``, ``infer_auto_device_map``) look the name up in
``accelerate.utils.modeling``; ``accelerate.utils`` re-exports it and Transformers binds it at import
as ``transformers.integrations.accelerate.accelerate_max_memory``: every such binding is rebound, and
restored by ``revert()``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable

from .. import backend
from . import budget as placement
from ..core.relies import Default, Signature
from ..core.wrapping import Wraps, fail_safe, warn_once

NAME = "accelerate_memory"
TARGET = "accelerate.utils.modeling"
DISTRIBUTION = "accelerate"
RELIES_ON = (
    # with_tpu reads args[0] / max_memory=, and None means "every device" (its first branch).
    Signature("get_max_memory", ("max_memory",), positional=("max_memory",)),
    Default("get_max_memory", "max_memory", None),
    Signature("convert_file_size_to_int", positional=("size",)),
    # The aliases (accelerate.utils.get_max_memory, transformers.integrations.accelerate.accelerate_max_memory)
    # are rebound only where they exist and still are the original.
)

logger = logging.getLogger("transformers_tpu_ext")

#: Modules that bind ``accelerate.utils.modeling.get_max_memory`` under a name of their own.
ALIASES: tuple[tuple[str, str], ...] = (
    ("accelerate.utils", "get_max_memory"),
    ("transformers.integrations.accelerate", "accelerate_max_memory"),
)

_wraps = Wraps()
_state: dict[str, Any] = {}


def default_tpu_budget() -> int | None:
    """Bytes of weights the chip may hold by default (``None`` without a TPU)."""
    info = backend.chip_info()
    if info is None:
        return None
    try:
        budget = placement.tpu_budget(info.total_memory)
    except ValueError as error:
        warn_once(f"{error}; using the default headroom")
        budget = placement.tpu_budget(info.total_memory, environ={})
    headroom = info.total_memory - budget
    logger.info(
        "transformers-tpu-ext: device_map budget on %s: %d bytes (%d bytes of HBM minus %d bytes of headroom; "
        "set max_memory={'tpu': ...} or %s to change it)",
        info.name,
        budget,
        info.total_memory,
        headroom,
        placement.HEADROOM_ENV,
    )
    return budget


def _to_bytes(size: Any) -> int:
    if isinstance(size, str):
        from accelerate.utils.modeling import convert_file_size_to_int

        return int(convert_file_size_to_int(size))
    return size


def _max_memory_arg(args: tuple, kwargs: dict) -> tuple[Any, Callable[[Any], tuple[tuple, dict]]]:
    """The ``max_memory`` argument of a ``get_max_memory(max_memory=None)`` call, and a way to replace it."""
    if args:
        return args[0], lambda value: ((value, *args[1:]), kwargs)
    return kwargs.get("max_memory"), lambda value: (args, {**kwargs, "max_memory": value})


def with_tpu(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> dict:
    """Wrapper for a ``get_max_memory(max_memory=None)``: add this process' chip when a TPU is present.

    The upstream function never sees a TPU key (it would reject it); like upstream, the sizes of the
    caller's dict are converted to ints in place (Transformers relies on it).
    """
    if not backend.tpu_available():
        return wrapped(*args, **kwargs)
    max_memory, rebind = _max_memory_arg(args, kwargs)
    user_tpu, rest, ignored = placement.split_tpu_entry(max_memory)
    for key in ignored:
        warn_once(
            f"max_memory key {key!r} ignored: this process is bound to one TPU chip, named 'tpu' (or 0); "
            "run one process per chip to use several"
        )
    if max_memory is None:
        result = wrapped(*args, **kwargs)
        tpu_bytes = result.get(placement.TPU_KEY)  # an inner wrapper may have added it already
        if tpu_bytes is None:
            tpu_bytes = default_tpu_budget()
        return placement.merge_tpu_entry(result, tpu_bytes)
    new_args, new_kwargs = rebind(rest)
    result = wrapped(*new_args, **new_kwargs)
    tpu_bytes = None if user_tpu is None else _to_bytes(user_tpu)
    # Upstream converts the caller's sizes in place; keep that side effect for the keys it saw.
    if isinstance(max_memory, dict):
        for key, value in rest.items():
            max_memory[key] = value
        if tpu_bytes is not None:
            for key in max_memory:
                if placement.is_tpu_key(key) and key not in ignored:
                    max_memory[key] = tpu_bytes
    return placement.merge_tpu_entry(result, tpu_bytes)


_wrapper = fail_safe(with_tpu)


def apply(module: Any) -> None:
    if _wraps:
        return
    original = module.get_max_memory
    _wraps.wrap(module, "get_max_memory", _wrapper)
    patched = module.get_max_memory
    _state.update(original=original, patched=patched)
    for module_name, attribute in ALIASES:
        alias = sys.modules.get(module_name)
        if alias is not None and getattr(alias, attribute, None) is original:
            _wraps.replace(alias, attribute, patched)


def revert() -> None:
    _wraps.unwrap_all()
    original, patched = _state.pop("original", None), _state.pop("patched", None)
    if patched is None:
        return
    # Modules imported after apply() bound the wrapper themselves: give them the original back too.
    for module_name, attribute in ALIASES:
        alias = sys.modules.get(module_name)
        if alias is not None and getattr(alias, attribute, None) is patched:
            setattr(alias, attribute, original)
