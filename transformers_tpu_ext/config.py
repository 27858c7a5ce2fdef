"""Environment variables that steer activation, read when they are needed (never cached)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

#: ``1``/``true``/``all`` disables every patch, ``0``/``false``/``off`` none; a comma list of patch
#: names disables those.
DISABLE_ENV = "TRANSFORMERS_TPU_EXT_DISABLE"

_ALL = {"1", "true", "yes", "on", "all", "*"}
_NONE = {"0", "false", "no", "off", "none"}


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
        from .patches import REGISTRY as names

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
