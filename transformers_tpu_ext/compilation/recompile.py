"""The recompile guard at run time: counting programs around a call, cache-only mode, the report.

The three guard patches run each call of their work inside :func:`guarded`; the warm-ups run inside
:func:`warming_up` (or call :func:`begin_warmup` / :func:`end_warmup`). The decisions (steady state,
messages) are :mod:`.guard`'s.

Counting: the TPU backend's own tier-1 misses (``torch.tpu._get_cache_misses()``: programs the
process did not hold, compiled or loaded from the persistent cache) where it has them, as torch_tpu
0.2.0 and the simulated TPU do; otherwise the plugin's own count: graphs TorchDynamo compiled, plus
one for a call whose shape the guard had not seen. In ``error`` mode, a call in steady state runs
with ``torch.tpu._set_cache_only(True)`` where the backend has it, so a program that would compile
fails at once (before a chip spends minutes compiling it); that switch is process-wide while the call
runs. Elsewhere the call runs, then raises.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from . import guard
from ..core.wrapping import user_error

__all__ = [
    "CallFacts",
    "RecompileError",
    "begin_warmup",
    "end_warmup",
    "guarded",
    "program_count",
    "state",
    "warming_up",
]

logger = logging.getLogger("transformers_tpu_ext")

_CACHE_ONLY_TEXT = "no more compilation should happen"


class RecompileError(RuntimeError):
    """A program compiled in steady state with ``TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE=error``."""


@dataclass(frozen=True)
class CallFacts:
    """What a guarded call looks like, for the report: ``call`` describes its shape, ``advice`` the
    setting that covers it, ``signature`` identifies its shape (for the plugin's own count)."""

    call: str
    advice: str
    signature: Any = None


_lock = threading.RLock()
#: work -> owner (a model, a Trainer) -> its state; owners that cannot be weakly referenced go by id.
_states: dict[str, weakref.WeakKeyDictionary] = {work: weakref.WeakKeyDictionary() for work in guard.WORKS}
_by_id: dict[tuple[str, int], guard.WorkState] = {}
_local = threading.local()
_cache_only_users = 0


def state(work: str, owner: Any) -> guard.WorkState:
    """The guard's state of ``work`` for ``owner`` (created on first use)."""
    with _lock:
        try:
            found = _states[work].get(owner)
            if found is None:
                found = _states[work][owner] = guard.WorkState()
            return found
        except TypeError:  # not weakly referenceable, or unhashable
            return _by_id.setdefault((work, id(owner)), guard.WorkState())


def reset() -> None:
    """Forget every state (tests; a new service in the same process)."""
    with _lock:
        for work in guard.WORKS:
            _states[work] = weakref.WeakKeyDictionary()
        _by_id.clear()


# ---------------------------------------------------------------------------------------------
# Counting


def _tpu_module() -> Any:
    torch = sys.modules.get("torch")
    return getattr(torch, "tpu", None) if torch is not None else None


def _dynamo_graphs() -> int:
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    if dynamo_utils is None:
        return 0
    try:
        return int(dynamo_utils.counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001
        return 0


def program_count() -> tuple[int | None, int]:
    """``(backend programs, TorchDynamo graphs)``: the backend's tier-1 misses so far (None when it
    does not count them), and the graphs TorchDynamo compiled so far."""
    misses = getattr(_tpu_module(), "_get_cache_misses", None)
    backend = None
    if callable(misses):
        try:
            backend = int(misses())
        except Exception:  # noqa: BLE001
            backend = None
    return backend, _dynamo_graphs()


def set_cache_only(enabled: bool) -> bool:
    """Turn the backend's cache-only mode on (counted: nested or concurrent calls) or off; False if absent."""
    global _cache_only_users
    switch = getattr(_tpu_module(), "_set_cache_only", None)
    if not callable(switch):
        return False
    with _lock:
        if enabled:
            _cache_only_users += 1
            if _cache_only_users == 1:
                switch(True)
        else:
            _cache_only_users = max(0, _cache_only_users - 1)
            if _cache_only_users == 0:
                switch(False)
    return True


def cache_only_key(error: BaseException) -> str | None:
    """torch_tpu's cache-only error anywhere in ``error``'s chain (TorchDynamo wraps it): its text."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        if _CACHE_ONLY_TEXT in text:
            line = next(line for line in text.splitlines() if _CACHE_ONLY_TEXT in line)
            key = line.split("for key:", 1)[-1].strip() or line.strip()
            return key if len(key) <= 160 else key[:157] + "..."
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return None


# ---------------------------------------------------------------------------------------------
# Warm-ups


def begin_warmup(work: str, owner: Any) -> None:
    """A warm-up of ``work`` for ``owner`` begins: the guard does not report its calls."""
    with _lock:
        state(work, owner).warming += 1


def end_warmup(work: str, owner: Any, covered: Mapping[str, Any] | None = None, completed: bool = True) -> None:
    """A warm-up of ``work`` for ``owner`` ended; when it ``completed``, the work is in steady state."""
    with _lock:
        current = state(work, owner)
        current.warming = max(0, current.warming - 1)
        if completed and not current.warming:
            guard.warmed_up(current, covered)


@contextlib.contextmanager
def warming_up(work: str, owner: Any, covered: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Calls inside are warm-up calls; at the end, without an error, ``work`` is in steady state."""
    begin_warmup(work, owner)
    completed = False
    try:
        yield
        completed = True
    finally:
        end_warmup(work, owner, covered, completed)


# ---------------------------------------------------------------------------------------------
# A guarded call


@contextlib.contextmanager
def guarded(work: str, owner: Any, describe: Callable[[Mapping[str, Any]], CallFacts]) -> Iterator[None]:
    """Run one call of ``work`` for ``owner`` under the guard. ``describe(covered)`` is called only to
    report (and, without backend counts, for the call's shape)."""
    if getattr(_local, "active", False):  # a call inside a guarded call: the outer one accounts for it
        yield
        return
    try:
        settings = guard.current()
    except ValueError as error:  # an invalid TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE / _SETTLE: the user's to fix
        raise user_error(error) from None
    if settings.on_recompile == "ignore":
        yield
        return
    work_state = state(work, owner)
    backend_before, graphs_before = program_count()
    cache_only = (
        settings.on_recompile == "error"
        and work_state.steady is not None
        and not work_state.warming
        and backend_before is not None
        and set_cache_only(True)
    )
    _local.active = True
    try:
        yield
    except Exception as error:
        key = cache_only_key(error) if cache_only else None
        if key is None:
            raise
        facts = _describe(describe, work_state)
        raise RecompileError(
            guard.message(work, f"a new program ({key})", facts.call, facts.advice, work_state.steady, "error")
        ) from error
    finally:
        _local.active = False
        if cache_only:
            set_cache_only(False)
    backend_after, graphs_after = program_count()
    graphs = graphs_after - graphs_before
    facts = None
    if backend_before is not None and backend_after is not None:
        new = backend_after - backend_before
    else:  # the plugin's own count: TorchDynamo's graphs, and a shape not seen before
        new = graphs
        facts = _describe(describe, work_state)
        with _lock:
            if facts.signature is not None and facts.signature not in work_state.seen:
                work_state.seen.add(facts.signature)
                if work_state.steady is not None and not work_state.warming:
                    new = max(new, 1)
    with _lock:
        report = guard.observe(work_state, new, settings.settle)
        count = work_state.reported
    if not report:
        return
    facts = facts or _describe(describe, work_state)
    text = guard.message(
        work, guard.programs_text(new, graphs), facts.call, facts.advice, work_state.steady, settings.on_recompile
    )
    if settings.on_recompile == "error":
        raise RecompileError(text)
    if count <= guard.WARN_LIMIT:
        if count == guard.WARN_LIMIT:
            text += f" Further recompiles of this work are not logged ({guard.ENV['on_recompile']}=error fails on them)."
        logger.warning("%s", text)


def _describe(describe: Callable[[Mapping[str, Any]], CallFacts], work_state: guard.WorkState) -> CallFacts:
    try:
        return describe(work_state.covered)
    except Exception as error:  # noqa: BLE001 - a report must not fail the call
        return CallFacts(call=f"(its shape could not be described: {type(error).__name__})", advice="")
