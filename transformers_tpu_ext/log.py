"""The plugin's logging follows Transformers' verbosity, centrally.

Every module logs through the stdlib logger ``logging.getLogger("transformers_tpu_ext")`` (or a child
of it). :func:`setup` (run when the package is imported) gives that logger a parent that is not the
root logger but a small proxy whose level is, in this order:

1. ``TRANSFORMERS_TPU_EXT_VERBOSITY`` (``debug``, ``info``, ``warning``, ``error``, ``critical``), the
   plugin's own override;
2. the level of Transformers' library logger, i.e. ``TRANSFORMERS_VERBOSITY`` and
   ``transformers.logging.set_verbosity_*()``, read each time it changes;
3. ``TRANSFORMERS_VERBOSITY`` itself while Transformers is not imported yet;
4. otherwise the root logger's level (``WARNING``).

So ``TRANSFORMERS_VERBOSITY=info`` shows the plugin's info lines and ``=error`` silences its warnings,
for every logger named ``transformers_tpu_ext`` or ``transformers_tpu_ext.*``, whoever created it and
whenever. Records still propagate to the root logger (``logging.basicConfig``, pytest's ``caplog``);
when the root logger has no handler, the proxy prints them to stderr itself, as Transformers does
with its own records.

The plugin's Python warnings (:class:`TransformersTPUExtWarning`) go through :func:`warn`, which
follows the same level and never raises, even under ``-W error``: a warning of ours must not turn
``import torch`` (or a user's import of Transformers) into a failure.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

__all__ = [
    "LOGGER_NAME",
    "TransformersTPUExtWarning",
    "VERBOSITY_ENV",
    "check_environment",
    "logger",
    "setup",
    "warn",
]

LOGGER_NAME = "transformers_tpu_ext"
#: The plugin's own verbosity, overriding Transformers' for the plugin's messages only.
VERBOSITY_ENV = "TRANSFORMERS_TPU_EXT_VERBOSITY"
TRANSFORMERS_VERBOSITY_ENV = "TRANSFORMERS_VERBOSITY"
#: The names Transformers accepts for ``TRANSFORMERS_VERBOSITY`` (``detail`` is its verbose debug).
LEVELS = {
    "detail": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

logger = logging.getLogger(LOGGER_NAME)


class TransformersTPUExtWarning(UserWarning):
    """Warnings issued by transformers-tpu-ext (skipped patches, invalid settings, adapted settings)."""


def _env_level(name: str) -> int | None:
    return LEVELS.get(os.environ.get(name, "").strip().lower())


class _VerbosityProxy(logging.Logger):
    """The parent of the plugin's logger: its ``level`` is computed, never stored."""

    def __init__(self) -> None:
        super().__init__("transformers_tpu_ext(follows transformers)")
        self.parent = logging.root
        self.addHandler(_StderrWhenUnhandled())

    @property  # type: ignore[override]
    def level(self) -> int:
        override = _env_level(VERBOSITY_ENV)
        if override is not None:
            return override
        library = logging.Logger.manager.loggerDict.get("transformers")
        if isinstance(library, logging.Logger) and library.level:
            return library.level
        if "transformers.utils.logging" not in sys.modules:
            return _env_level(TRANSFORMERS_VERBOSITY_ENV) or logging.NOTSET
        return logging.NOTSET

    @level.setter
    def level(self, value: int) -> None:  # Logger.__init__ assigns it; the computed level wins
        pass


class _StderrWhenUnhandled(logging.StreamHandler):
    """Prints a record to stderr only when no root handler will (no duplicate lines, no lost ones)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if logging.root.handlers:
            return
        self.stream = sys.stderr  # the current one (pytest and users swap it)
        super().emit(record)


_proxy: _VerbosityProxy | None = None


def setup() -> logging.Logger:
    """Attach the plugin's logger to the verbosity proxy (idempotent); returns the logger."""
    global _proxy
    if _proxy is None:
        _proxy = _VerbosityProxy()
    if logger.parent is not _proxy:
        logger.parent = _proxy
        logging.Logger.manager._clear_cache()
    return logger


def warn(message: str, category: type[Warning] | None = None, stacklevel: int = 2) -> None:
    """Issue ``message`` as a Python warning when the plugin's verbosity shows warnings.

    Never raises: where a filter turns the warning into an error (``-W error``), the message is
    logged instead. ``stacklevel`` counts from the caller, as for ``warnings.warn``.
    """
    if not logger.isEnabledFor(logging.WARNING):
        return
    try:
        warnings.warn(message, category or TransformersTPUExtWarning, stacklevel=stacklevel + 1)
    except Exception:  # noqa: BLE001 - a filter made it an error: say it, do not raise it
        logger.warning("%s", message)


def check_environment(environ: dict[str, str] | None = None) -> list[str]:
    """Problems with :data:`VERBOSITY_ENV` (for ``transformers_tpu_ext.settings``)."""
    raw = (os.environ if environ is None else environ).get(VERBOSITY_ENV, "").strip()
    if raw and raw.lower() not in LEVELS:
        return [f"{VERBOSITY_ENV}={raw!r} is not a level: use one of {', '.join(LEVELS)}"]
    return []
