"""What the benchmark scripts share: clean worker environments, worker processes, the JSON report.

Each benchmark runs every side in its own interpreter (patches are process-global): the driver
starts ``python <script> --worker ...`` with :func:`worker_env`, the worker prints one line
``MARK + json`` (:func:`emit`), and :func:`run_worker` returns that value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

MARK = "@@BENCH@@"


def worker_env(**changes: str | None) -> dict:
    """The driver's environment without any ``TRANSFORMERS_TPU_EXT_*`` setting, offline; then ``changes``
    (``None`` removes a variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def emit(value: object) -> None:
    """The worker's answer: one marked JSON line on stdout."""
    print(MARK + json.dumps(value), flush=True)


def run_worker(script: str, args: list[str], env: dict) -> dict:
    """Run ``python script *args`` and return the value it emitted; ``RuntimeError`` with its output if not."""
    proc = subprocess.run([sys.executable, str(Path(script).resolve()), *args], capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or len(lines) != 1:
        raise RuntimeError(f"worker {args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[0][len(MARK):])


def write_report(report: dict, output: str | None) -> None:
    """Print the report as JSON, and also write it to ``output`` when given."""
    text = json.dumps(report, indent=2)
    print(text)
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text + "\n")
