"""Build hook for one thing only: the package index's long description.

It is README.md with every relative link made absolute (to the ``Source`` URL of pyproject.toml's
``[project.urls]``, branch ``main``), so the docs it points to can be reached from the package page.
Everything else is declared in pyproject.toml.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
_LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s]+)\)")


def long_description() -> str:
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    base = urls["Source"].rstrip("/") + "/blob/main/"
    return _LINK.sub(lambda match: f"]({base}{match.group(1)})", (ROOT / "README.md").read_text())


setup(long_description=long_description(), long_description_content_type="text/markdown")
