"""Environment variables that steer activation, read when they are needed (never cached)."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from .settings.parser import OFF_WORDS, ON_WORDS

#: ``1``/``all`` (or any on word of the settings layer) disables every patch, ``0`` (or any off word) none; a comma list of patch
#: names disables those.
DISABLE_ENV = "TRANSFORMERS_TPU_EXT_DISABLE"

_ALL = ON_WORDS | {"all", "*"}
_NONE = OFF_WORDS | {"none"}


#: Every setting is ``TRANSFORMERS_TPU_EXT_<CAPABILITY>_<SETTING>`` (``GENERATE_``, ``SERVE_``, ``TRAIN_``,
#: ``TP_``), except the few that concern the whole plugin or the chip (``DISABLE``, ``SIMULATE``,
#: ``VERBOSITY``, ``HBM_HEADROOM``). The names that did not follow it, old -> new: the old ones are still
#: read, with one warning each, until release 0.2 (:func:`with_renamed`, :func:`check_renamed`).
RENAMED: dict[str, str] = {
    f"TRANSFORMERS_TPU_EXT_{name}": f"TRANSFORMERS_TPU_EXT_GENERATE_{name}"
    for name in (
        "STATIC_CACHE", "BUCKETS", "COMPILE_PREFILL", "DEVICE_DECODE", "PROMPT_BUCKETS", "STEPS_PER_OCTAVE",
        "PREFILL_CHUNK", "BATCH_BUCKETS", "CACHE_BUCKETS", "MAX_CACHE_LEN", "RECOMPILE_LIMIT",
    )
}
#: The naming scheme: a capability's prefix, or one of the plugin-wide names.
SCHEME_PREFIXES = ("GENERATE_", "SERVE_", "TRAIN_", "TP_", "COMPILE_")
PLUGIN_WIDE = ("DISABLE", "SIMULATE", "SIMULATE_REPORT", "VERBOSITY", "HBM_HEADROOM")
#: The release that stops reading the old names.
RENAMED_UNTIL = "0.2"


def with_renamed(environ: Mapping[str, str]) -> Mapping[str, str]:
    """``environ`` with each old name's value under its new name (the new name wins when both are set)."""
    if not any(environ.get(old, "").strip() for old in RENAMED):
        return environ
    merged = dict(environ)
    for old, new in RENAMED.items():
        if merged.get(old, "").strip() and not merged.get(new, "").strip():
            merged[new] = merged[old]
    return merged


def check_renamed(environ: Mapping[str, str] | None = None) -> list[str]:
    """One message per old name in use, naming the new one."""
    environ = os.environ if environ is None else environ
    messages = []
    for old, new in RENAMED.items():
        raw = environ.get(old, "").strip()
        if not raw:
            continue
        if environ.get(new, "").strip():
            messages.append(f"{old}={raw!r} is ignored: it was renamed {new}, which is set too (the old name is read "
                            f"until release {RENAMED_UNTIL}); remove {old}")
        else:
            messages.append(f"{old} was renamed {new} (one naming scheme: TRANSFORMERS_TPU_EXT_GENERATE_* for "
                            f"generate()); the old name is still read until release {RENAMED_UNTIL}: rename it")
    return messages


def disabled_patches(environ: dict[str, str] | None = None) -> frozenset[str] | None:
    """The patch names switched off by ``TRANSFORMERS_TPU_EXT_DISABLE``.

    ``None`` means "all of them"; an empty set means none.
    """
    raw = (os.environ if environ is None else environ).get(DISABLE_ENV, "").strip()
    if raw.lower() in _ALL:
        return None
    if raw.lower() in _NONE:
        return frozenset()
    return frozenset(part.strip() for part in raw.split(",") if part.strip() and part.strip() != "0")


def check_environment(environ: dict[str, str] | None = None, names: tuple[str, ...] | None = None) -> list[str]:
    """Names in ``TRANSFORMERS_TPU_EXT_DISABLE`` that are not patches (a typo disables nothing).

    ``names``: the patch names (default: the registry).
    """
    if names is None:
        from .registry import REGISTRY as names

    disabled = disabled_patches(environ)
    unknown = sorted(disabled - set(names)) if disabled else []
    if not unknown:
        return []
    raw = (os.environ if environ is None else environ).get(DISABLE_ENV, "").strip()
    return [
        f"{DISABLE_ENV}={raw!r} names no patch called {', '.join(map(repr, unknown))}, so it disables nothing "
        f"there: use 1 (every patch) or a comma list of {', '.join(names)}"
    ]


def check_variables(
    environ: Mapping[str, str],
    variables: Mapping[str, str],
    parse: Callable[[str, str], Any],
    settings_class: Callable[..., Any],
) -> list[str]:
    """One message per invalid variable of a settings dataclass, each naming its variable.

    ``variables`` maps field names to environment variables; each set value is parsed with
    ``parse(field, raw)`` and checked by building ``settings_class(field=value)`` alone.
    """
    problems = []
    for name, var in variables.items():
        raw = environ.get(var, "")
        if not raw.strip():
            continue
        try:
            settings_class(**{name: parse(name, raw)})
        except ValueError as error:
            detail = str(error).replace(f"{settings_class.__name__}.{name}", "it")
            problems.append(detail if var in detail else f"{var}={raw.strip()!r} is invalid: {detail}")
    return problems


class Overrides:
    """The ``configure()`` values of a settings dataclass: validated before they are stored, thread-safe.

    ``what`` names the settings in errors (``"serving"``); the ``sequences`` fields are stored as tuples.
    """

    def __init__(self, settings_class: Callable[..., Any], what: str, sequences: tuple[str, ...] = ()) -> None:
        self._class = settings_class
        self._what = what
        self._sequences = sequences
        self._lock = threading.Lock()
        self._values: dict[str, Any] = {}

    def update(self, changes: dict[str, Any]) -> None:
        """Store ``changes`` on top of the earlier ones; ``TypeError``/``ValueError`` leave nothing changed."""
        names = {f.name for f in dataclasses.fields(self._class) if f.init}
        unknown = set(changes) - names
        if unknown:
            raise TypeError(f"unknown {self._what} setting(s) {sorted(unknown)}; known: {sorted(names)}")
        changes = {k: tuple(v) if k in self._sequences and v is not None else v for k, v in changes.items()}
        with self._lock:
            self._class(**{**self._values, **changes})  # validate before storing
            self._values.update(changes)

    def values(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._values)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
