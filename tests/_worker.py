"""What a worker script (``tests/<folder>/*_worker.py``, run by ``_subprocess.run_python``) reports with."""

from __future__ import annotations

import json
import sys

PREFIX = "@@RESULT@@"


def report(value: object) -> None:
    """Hand ``value`` (JSON) back to the test: call it once."""
    print(PREFIX + json.dumps(value), flush=True)


def patched_targets() -> list[str]:
    """The registry's patches whose upstream module this process has imported."""
    from transformers_tpu_ext import activation

    return [n for n in activation.registry.REGISTRY if activation._patch_module(n).TARGET in sys.modules]
