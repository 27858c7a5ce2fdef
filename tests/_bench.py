"""Import a script of ``benchmarks/`` as a module (its directory on the path only while it imports)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType


def load(script: Path) -> ModuleType:
    sys.path.insert(0, str(script.parent))
    try:
        return importlib.import_module(script.stem)
    finally:
        sys.path.pop(0)
