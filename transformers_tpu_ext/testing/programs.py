"""``no_new_programs()`` and ``cache_only()``: fail a test when a block makes the TPU compile in steady state.

``cache_only()`` is the stricter proof (a warm-up is done when the same work then runs in it): the block
runs in torch_tpu's cache-only mode (``torch.tpu._set_cache_only(True)``), so the first program the
process does not hold, a graph or an eager operation, raises at once, before a chip would spend time
compiling it.

Counts what the TPU backend counts: ``torch.tpu._get_cache_misses()``, the programs the process did
not hold yet (compiled, or loaded from the persistent compile cache), on torch_tpu 0.2.0 and on the
simulated TPU alike; so the same test runs in CI on the simulator and on a TPU VM. On the simulator
the failure lists what compiled (kind and key of each program). The ``no_new_programs`` pytest
fixture (``pytest_plugin``) hands this function to a test.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

__all__ = ["NewProgramsError", "cache_only", "no_new_programs"]

#: How many programs a failure lists.
SHOWN = 5


class NewProgramsError(AssertionError):
    """A block under :func:`no_new_programs` made the TPU compile (or load) programs."""


def _backend() -> Any:
    torch = sys.modules.get("torch")
    tpu = getattr(torch, "tpu", None) if torch is not None else None
    misses = getattr(tpu, "_get_cache_misses", None)
    if not callable(misses):
        raise RuntimeError(
            "no_new_programs(): the TPU backend here does not count compiled programs (torch.tpu._get_cache_misses); "
            "run on torch_tpu or on the simulated TPU (the simulated_tpu fixture)"
        )
    return tpu


def _entries(tpu: Any) -> list[dict[str, Any]] | None:
    stats = getattr(tpu, "_get_cache_stats", None)
    try:
        value = stats() if callable(stats) else None
    except Exception:  # noqa: BLE001
        return None
    entries = value.get("entries") if isinstance(value, dict) else None
    return list(entries) if isinstance(entries, list) else None


@contextlib.contextmanager
def no_new_programs(what: str = "the block") -> Iterator[None]:
    """Raise :class:`NewProgramsError` (an ``AssertionError``) if ``what`` needs a program the
    process did not hold when the block began::

        warmup(model, max_prompt_length=128, max_new_tokens=32)
        with no_new_programs("a call within the warmed-up buckets"):
            model.generate(**inputs, max_new_tokens=16)
    """
    tpu = _backend()
    before = int(tpu._get_cache_misses())
    entries_before = _entries(tpu)
    yield
    new = int(tpu._get_cache_misses()) - before
    if new <= 0:
        return
    entries_after = _entries(tpu)
    detail = ""
    if entries_before is not None and entries_after is not None:
        added = entries_after[len(entries_before):]
        lines = [f"  - {e.get('kind')} ({e.get('source')}): {str(e.get('key'))[:160]}" for e in added[:SHOWN]]
        if len(added) > SHOWN:
            lines.append(f"  - ... {len(added) - SHOWN} more")
        detail = ":\n" + "\n".join(lines) if lines else ""
    raise NewProgramsError(f"{what} needed {new} new TPU program{'s' if new != 1 else ''} in steady state{detail}")


@contextlib.contextmanager
def cache_only(what: str = "the block") -> Iterator[None]:
    """Run the block in torch_tpu's cache-only mode: the first program it needs that the process
    does not hold (a graph, or an eager operation of a new signature) raises
    :class:`NewProgramsError` naming it::

        warmup(model, max_prompt_length=128, max_new_tokens=32)
        with cache_only("calls within the warmed-up buckets"):
            model.generate(**inputs, max_new_tokens=16)

    The mode is process-wide while the block runs (shared with the recompile guard's ``error`` mode).
    """
    from ..compilation import recompile

    _backend()
    if not recompile.set_cache_only(True):
        raise RuntimeError("cache_only(): the TPU backend here has no cache-only mode (torch.tpu._set_cache_only)")
    try:
        yield
    except Exception as error:
        key = recompile.cache_only_key(error)
        if key is None:
            raise
        raise NewProgramsError(f"{what} needed a new TPU program in cache-only mode: {key}") from error
    finally:
        recompile.set_cache_only(False)
