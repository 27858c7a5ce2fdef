"""The suite's layout: one folder per capability of the package (``tests/generation`` tests
``transformers_tpu_ext/generation``, ...), ``tests/core`` for activation, settings and the rest of
the top level, ``tests/simulator`` for ``transformers_tpu_ext.testing``. Helpers shared by several
folders (``_subprocess``, ``_bench``) live here, importable from every folder; a folder's own helpers
and worker scripts live in it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config, items):
    """Files with the most ``slow`` tests first (stable otherwise): with ``--dist loadfile
    --no-loadscope-reorder`` (scripts/test.sh), the workers start on the longest files, and the
    short ones fill in at the end instead of one worker finishing a long file alone."""
    weight: dict[str, int] = {}
    for item in items:
        weight.setdefault(item.path, 0)
        if item.get_closest_marker("slow") is not None:
            weight[item.path] += 1
    order = {path: rank for rank, path in enumerate(weight)}
    items.sort(key=lambda item: (-weight[item.path], order[item.path]))
