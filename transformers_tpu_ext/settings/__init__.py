"""The settings layer: every ``TRANSFORMERS_TPU_EXT_*`` variable declared once, parsed one way, checked up front.

- **Declared once.** Each capability lists its variables in ``transformers_tpu_ext.<capability>.settings``
  as a ``SETTINGS`` tuple of :class:`Setting` (name, kind, default, accepted values, one doc line); the
  plugin-wide ones are :data:`PLUGIN_SETTINGS` below. :func:`declared` collects them from the registry of
  capabilities (``registry.CAPABILITIES``); the docs' table (``docs/configuration.md``) is
  :func:`settings_table`.
- **One parser.** :func:`parse` (``settings.parser``, the lowest layer: it imports nothing of the
  package, so every capability's declarations import it without a cycle) turns a raw value into a Python value by its setting's kind, with one
  vocabulary for every switch (:data:`ON_WORDS`, :data:`OFF_WORDS`): ``1``/``on``/``true``/``yes``/
  ``enable(d)`` and ``0``/``off``/``false``/``no``/``disable(d)``. A word that is a near miss of a
  vocabulary word (``of``, ``flase``) is an error naming the word meant (:func:`near_word`), never a value.
- **Every mistake at once.** :data:`CHECKS` lists one function per module returning a message per invalid
  value (``environ -> list[str]``, pure, cheap, never importing torch or a target library), plus
  :func:`unknown_names` (a ``TRANSFORMERS_TPU_EXT_*`` name nobody reads, with the closest known one).
  :func:`problems` runs them all; activation calls :func:`warn_about_problems`, which issues one warning
  per problem, once per process; ``transformers-tpu doctor`` lists them.

Pure: no torch, no target library; the capabilities' ``settings`` modules are imported when first needed.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from .. import log
from .parser import NEAR, OFF_WORDS, ON_WORDS, PREFIX, SWITCH_HELP, Setting, near_word, parse, switch  # noqa: F401

__all__ = [
    "CHECKS",
    "OFF_WORDS",
    "ON_WORDS",
    "PLUGIN_SETTINGS",
    "PREFIX",
    "Setting",
    "closest_name",
    "declared",
    "near_word",
    "parse",
    "problems",
    "settings_table",
    "switch",
    "unknown_names",
    "warn_about_problems",
]


#: The settings of the whole plugin (not of one capability).
PLUGIN_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "TRANSFORMERS_TPU_EXT_DISABLE", "text", "unset",
        "`1` (or any on word, `all`): no patch is applied; a comma list of patch names: those are not applied; "
        "`0` (or any off word): none is switched off",
        values="`1`, `all`, `generation,hub_kernels`, `0`",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_SIMULATE", "text", "unset",
        "installs the simulated TPU at `import torch` in every Python process that inherits the variable "
        "(see [testing.md](testing.md)); an off word or empty: off",
        values="`1`, `chips=4,generation=v6e,hbm=1GiB,untie_on_move=1`",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_SIMULATE_REPORT", "text", "unset",
        "a directory: every process that installs the simulated TPU writes `<pid>.json` there (its counters and "
        "the plugin's patch states; at install, at each compiled program, at exit), so a test can read what another "
        "process compiled (see [simulated-tpu.md](simulated-tpu.md))",
        values="`/tmp/sim-reports`",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_VERBOSITY", "choice", "Transformers' verbosity",
        "the plugin's log level, whatever Transformers' is",
        choices=("detail", "debug", "info", "warning", "error", "critical"),
    ),
)


#: Variables of the repository's scripts (``scripts/*.sh``), not of the plugin: known, never warned about.
TOOL_NAMES = frozenset({
    "TRANSFORMERS_TPU_EXT_VENV", "TRANSFORMERS_TPU_EXT_TORCH_TPU_VENV", "TRANSFORMERS_TPU_EXT_MATRIX_DIR",
    "TRANSFORMERS_TPU_EXT_TEST_WORKERS",
})


def _settings_module(capability: str) -> Any:
    name = f"{__package__.rpartition('.')[0]}.{capability}.settings"
    try:
        if importlib.util.find_spec(name) is None:
            return None
    except ModuleNotFoundError:
        return None
    return importlib.import_module(name)


_declared: dict[str, tuple[Setting, ...]] = {}
_declared_lock = threading.Lock()


def declared() -> dict[str, tuple[Setting, ...]]:
    """Capability (``"plugin"`` first) -> its settings, from each capability's ``settings`` module."""
    with _declared_lock:
        if not _declared:
            from ..registry import CAPABILITIES

            found = {"plugin": PLUGIN_SETTINGS}
            for capability in CAPABILITIES:
                module = _settings_module(capability)
                if module is not None and getattr(module, "SETTINGS", ()):
                    found[capability] = tuple(module.SETTINGS)
            _declared.update(found)
        return dict(_declared)


def known_names() -> frozenset[str]:
    """Every variable the plugin reads: the declared ones and the renamed ones (still read, with a warning)."""
    from ..config import RENAMED

    return frozenset(s.name for group in declared().values() for s in group) | frozenset(RENAMED) | TOOL_NAMES


def closest_name(name: str) -> str | None:
    """The declared variable ``name`` is most likely a typo or an old name of (``difflib``), or ``None``."""
    current = sorted(s.name for group in declared().values() for s in group)
    close = difflib.get_close_matches(name.upper(), current, n=1, cutoff=0.5)
    return close[0] if close else None


def unknown_names(environ: Mapping[str, str]) -> list[str]:
    """One message per ``TRANSFORMERS_TPU_EXT_*`` variable nothing reads, naming the closest known one."""
    known = known_names()
    messages = []
    for name in sorted(environ):
        if not name.startswith(PREFIX) or name in known:
            continue
        meant = closest_name(name)
        hint = f": did you mean {meant}?" if meant else ""
        messages.append(
            f"{name} is not a transformers-tpu-ext setting and is ignored{hint} (every setting: docs/configuration.md)"
        )
    return messages


BEGIN = "<!-- generated: transformers_tpu_ext.settings.settings_table -->"
END = "<!-- end of generated table -->"


def settings_table() -> str:
    """The docs' table of every setting, one row per declared variable, grouped by capability."""
    rows = ["| Variable | Capability | Values | Default | What it does |", "|---|---|---|---|---|"]
    for capability, group in declared().items():
        for s in group:
            rows.append(f"| `{s.name}` | {capability} | {s.shown_values()} | {s.default} | {s.doc} |")
    return "\n".join(rows)


def _error_of(check: Callable[[], object]) -> list[str]:
    """``[message]`` when ``check()`` raises ``ValueError`` (the parsers name their variable), else ``[]``."""
    try:
        check()
    except ValueError as error:
        return [str(error)]
    return []


def _disable(environ: Mapping[str, str]) -> list[str]:
    from .. import config

    return config.check_environment(dict(environ))


def _renamed(environ: Mapping[str, str]) -> list[str]:
    from .. import config

    return config.check_renamed(environ)


def _simulate(environ: Mapping[str, str]) -> list[str]:
    from ..testing import chips

    spec = environ.get(chips.SIMULATE_ENV, "")
    if not chips.simulate_requested(spec):
        return []
    try:
        chips.parse_spec(spec)
    except ValueError as error:
        return [f"{error}. The simulated TPU is not installed; the plugin itself is active."]
    return []


def _generation(environ: Mapping[str, str]) -> list[str]:
    from ..generation import config as generation_config

    return generation_config.check_environment(environ)


def _placement(environ: Mapping[str, str]) -> list[str]:
    from ..placement import budget as placement

    raw = environ.get(placement.HEADROOM_ENV, "").strip()
    return _error_of(lambda: placement.parse_headroom(raw)) if raw else []


def _tensor_parallel(environ: Mapping[str, str]) -> list[str]:
    from ..parallelism import tp_plans

    return _error_of(lambda: tp_plans.rewrite_mode(environ))


def _serving(environ: Mapping[str, str]) -> list[str]:
    from ..serving import settings as serving

    return serving.check_environment(environ)


def _training(environ: Mapping[str, str]) -> list[str]:
    from ..training import buckets as training

    return training.settings_problems(environ)


def _compilation(environ: Mapping[str, str]) -> list[str]:
    from ..compilation import cache, guard

    return guard.check_environment(environ) + cache.check_environment(environ)


def _verbosity(environ: Mapping[str, str]) -> list[str]:
    return log.check_environment(dict(environ))


#: One check per module that reads ``TRANSFORMERS_TPU_EXT_*`` variables, and one for names nothing reads.
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
    unknown_names,
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


def _the_command_reports_them() -> bool:
    """Whether this process is the ``transformers-tpu`` command, which checks every setting itself: a command
    refuses to start in one line naming the variable, ``doctor`` lists them under "Known problems"."""
    import sys

    argv = list(getattr(sys, "orig_argv", ()))
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    return os.path.basename(sys.argv[0] if sys.argv else "") == "transformers-tpu" or module in (
        "transformers_tpu_ext.cli", "transformers_tpu_ext.cli.__main__"
    )


def warn_about_problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """Warn once per process for each invalid setting (not in the ``transformers-tpu`` command, which reports
    them itself); returns the problems. Never raises."""
    try:
        found = problems(environ)
        if environ is None and _the_command_reports_them():
            return found
        with _lock:
            new = [p for p in found if p not in _warned]
            _warned.update(new)
        for problem in new:
            log.warn(f"transformers-tpu-ext: {problem}", stacklevel=2)
        return found
    except Exception:  # noqa: BLE001 - never break activation
        return []
