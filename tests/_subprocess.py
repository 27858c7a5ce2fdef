"""Run a snippet in a fresh interpreter (activation is process-global) and read its JSON answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PREFIX = "@@RESULT@@"

COMMON = """
import json, sys
def report(value):
    print("@@RESULT@@" + json.dumps(value), flush=True)
def patched_targets():
    from transformers_tpu_ext import activation
    return [n for n in activation.registry.REGISTRY if activation._patch_module(n).TARGET in sys.modules]
"""


def run_python(code: str, env: dict[str, str | None] | None = None, timeout: float = 240) -> tuple[object, str]:
    """Run ``code`` (which calls ``report(value)`` once); returns (value, stderr)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    environ.setdefault("HF_HUB_OFFLINE", "1")
    environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for key, value in (env or {}).items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    proc = subprocess.run(
        [sys.executable, "-c", COMMON + textwrap.dedent(code)],
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
