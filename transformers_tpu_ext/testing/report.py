"""The simulated TPU's report to other processes: what a process compiled and which patches it applied.

A program that runs the model in a process of its own (Transformers 5.25's ``transformers serve``
spawns one per model; a ``DataLoader`` worker, a torchrun rank) keeps its counters there:
``sim.counters()`` in the parent sees none of them. With ``TRANSFORMERS_TPU_EXT_SIMULATE_REPORT``
set to a directory, every process that installs the simulated TPU writes ``<directory>/<pid>.json``:

- ``pid``, ``parent``, ``process`` (``multiprocessing``'s name: ``"MainProcess"``, ``"model"``...),
  ``argv``;
- ``counters``: :class:`~transformers_tpu_ext.testing.counters.Counters` as a dict, plus ``programs``;
- ``patches``: the plugin's ``status()`` (``"applied"``, ``"armed"``...) in that process;
- ``written``: why this version was written (``install``, ``compiled``, ``asked``, ``exit``).

It is written at install, each time the process compiles a program (a graph or an eager per-shape
program: a reader that saw a response computed there sees what it compiled), on
``sim.write_report()`` and at exit (a process killed by a signal, e.g. a daemonic child its parent
terminates, writes no exit version); atomically (a reader never sees half a file). Host↔device byte
counts are those of the last write. :func:`read` returns every process's report.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["REPORT_ENV", "enable", "read", "written", "write"]

REPORT_ENV = "TRANSFORMERS_TPU_EXT_SIMULATE_REPORT"

_directory: list[Path] = []  # set by enable(): where this process writes
_counters: list[Callable[[], dict[str, Any]]] = []  # set by enable(): the installed simulator's counters


def enable(
    counters: Callable[[], dict[str, Any]], directory: str | os.PathLike[str] | None = None
) -> Path | None:
    """Start writing this process's report in ``directory`` (default: ``$TRANSFORMERS_TPU_EXT_SIMULATE_REPORT``;
    neither: nothing is written), with what ``counters()`` returns. Called by ``install()``; returns the file, or
    ``None``."""
    _counters[:] = [counters]
    directory = directory or os.environ.get(REPORT_ENV, "").strip() or None
    if directory is None:
        return None
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    first = not _directory
    _directory[:] = [path]
    if first:  # at exit: multiprocessing's finalizers run in its children too (they leave by os._exit)
        from multiprocessing import util

        util.Finalize(None, write, args=("exit",), exitpriority=0)
    write("install")
    return path / f"{os.getpid()}.json"


def compiled() -> None:
    """A program was compiled in this process (``compile_backend``, the eager dispatch): report it."""
    if _directory:
        write("compiled")


def write(why: str = "asked") -> None:
    """Write this process's report now (nothing when no directory was given). Never raises."""
    if not _directory:
        return
    try:
        path = _directory[0] / f"{os.getpid()}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(_snapshot(why)))
        os.replace(temporary, path)
    except Exception:  # noqa: BLE001 - a report must not fail the program it reports on
        pass


def _snapshot(why: str) -> dict[str, Any]:
    import multiprocessing

    counters = _counters[0]() if _counters else {}
    activation = sys.modules.get("transformers_tpu_ext.activation")
    return {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "process": multiprocessing.current_process().name,
        "argv": list(sys.argv),
        "counters": counters,
        "patches": activation.status() if activation is not None else {},
        "written": why,
    }


def written() -> Path | None:
    """The file this process writes, or ``None``."""
    return _directory[0] / f"{os.getpid()}.json" if _directory else None


def read(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every process's latest report in ``directory`` (oldest process first)."""
    reports = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # a process writing its first version right now
            continue
    return sorted(reports, key=lambda report: report["pid"])
