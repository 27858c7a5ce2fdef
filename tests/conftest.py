"""The suite's layout: one folder per capability of the package (``tests/generation`` tests
``transformers_tpu_ext/generation``, ...), ``tests/core`` for activation, settings and the rest of
the top level, ``tests/simulator`` for ``transformers_tpu_ext.testing``. Helpers shared by several
folders (``_subprocess``, ``_bench``) live here, importable from every folder; a folder's own helpers
and worker scripts live in it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
