"""Run a snippet or a worker script in a fresh interpreter (activation is process-global) and read its JSON answer.

A snippet of a few lines stays next to its test, as a string; anything longer is a worker module of the test's
folder (``*_worker.py``: importable and linted), which reports with :func:`_worker.report`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from _worker import PREFIX

HERE = Path(__file__).resolve().parent
COMMON = "import json, sys\nfrom _worker import patched_targets, report\n"


def run_python(code: str | Path, env: dict[str, str | None] | None = None, timeout: float = 240) -> tuple[object, str]:
    """Run ``code``, a snippet or the path of a worker script, which calls ``report(value)`` once; returns
    (value, stderr)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    environ.setdefault("HF_HUB_OFFLINE", "1")
    environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for key, value in (env or {}).items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), environ.get("PYTHONPATH")]))
    command = [str(code)] if isinstance(code, Path) else ["-c", COMMON + textwrap.dedent(code)]
    proc = subprocess.run(
        [sys.executable, *command],
        capture_output=True,
        text=True,
        env=environ,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(PREFIX)]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return json.loads(lines[0][len(PREFIX):]), proc.stderr
