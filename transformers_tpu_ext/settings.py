"""Every ``TRANSFORMERS_TPU_EXT_*`` setting checked up front, with the variable named.

Each module that reads a variable owns its parser; :data:`CHECKS` lists one function per module
returning a message per invalid value (``environ -> list[str]``, pure, cheap, never importing torch
or a target library). :func:`problems` runs them all; activation calls :func:`warn_about_problems`,
which issues one warning per problem, once per process; ``transformers-tpu doctor`` lists them.

A module with a new variable adds its check function to :data:`CHECKS`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping

from . import log

__all__ = ["CHECKS", "problems", "warn_about_problems"]


def _error_of(check: Callable[[], object]) -> list[str]:
    """``[message]`` when ``check()`` raises ``ValueError`` (the parsers name their variable), else ``[]``."""
    try:
        check()
    except ValueError as error:
        return [str(error)]
    return []


def _disable(environ: Mapping[str, str]) -> list[str]:
    from . import config

    return config.check_environment(dict(environ))


def _renamed(environ: Mapping[str, str]) -> list[str]:
    from . import config

    return config.check_renamed(environ)


def _simulate(environ: Mapping[str, str]) -> list[str]:
    from .testing import chips

    spec = environ.get(chips.SIMULATE_ENV, "")
    if not chips.simulate_requested(spec):
        return []
    try:
        chips.parse_spec(spec)
    except ValueError as error:
        return [f"{error}. The simulated TPU is not installed; the plugin itself is active."]
    return []


def _generation(environ: Mapping[str, str]) -> list[str]:
    from .generation import config as generation_config

    return generation_config.check_environment(environ)


def _placement(environ: Mapping[str, str]) -> list[str]:
    from .placement import budget as placement

    raw = environ.get(placement.HEADROOM_ENV, "").strip()
    return _error_of(lambda: placement.parse_headroom(raw)) if raw else []


def _tensor_parallel(environ: Mapping[str, str]) -> list[str]:
    from .parallelism import tp_plans

    return _error_of(lambda: tp_plans.rewrite_mode(environ))


def _serving(environ: Mapping[str, str]) -> list[str]:
    from .serving import policy as serving

    return serving.check_environment(environ)


def _training(environ: Mapping[str, str]) -> list[str]:
    from .training import buckets as batch_buckets

    return _error_of(lambda: batch_buckets.settings(environ))


def _compilation(environ: Mapping[str, str]) -> list[str]:
    from .compilation import guard

    return guard.check_environment(environ)


def _verbosity(environ: Mapping[str, str]) -> list[str]:
    return log.check_environment(dict(environ))


#: One check per module that reads ``TRANSFORMERS_TPU_EXT_*`` variables.
CHECKS: list[Callable[[Mapping[str, str]], list[str]]] = [
    _disable,
    _renamed,
    _simulate,
    _generation,
    _placement,
    _tensor_parallel,
    _serving,
    _training,
    _compilation,
    _verbosity,
]


def problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """Every invalid setting in ``environ`` (default: ``os.environ``), each message naming its variable."""
    environ = os.environ if environ is None else environ
    found: list[str] = []
    for check in CHECKS:
        try:
            found.extend(check(environ))
        except Exception as error:  # noqa: BLE001 - a broken check must not hide the others
            found.append(f"checking the settings failed in {check.__name__} ({type(error).__name__}: {error})")
    return found


_lock = threading.Lock()
_warned: set[str] = set()


def warn_about_problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """Warn once per process for each invalid setting; returns the problems. Never raises."""
    try:
        found = problems(environ)
        with _lock:
            new = [p for p in found if p not in _warned]
            _warned.update(new)
        for problem in new:
            log.warn(f"transformers-tpu-ext: {problem}", stacklevel=2)
        return found
    except Exception:  # noqa: BLE001 - never break activation
        return []
