"""The supported ranges are written once (requirements.txt) and what README and the CI matrix say agrees.

- README's "Compatibility" table shows exactly the ranges of ``transformers_tpu_ext/requirements.txt``
  (and of the ``tpu`` extra in pyproject.toml).
- ``scripts/matrix.sh`` tests the lowest release of every range, and every version it or the README
  names as tested lies inside the supported range: the package never claims an untested lower bound.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from transformers_tpu_ext import versions

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("transformers", "accelerate", "wrapt", "torch")


def _readme_table() -> dict[str, tuple[str, list[str]]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Compatibility", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        package = cells[0].split()[0]
        tested = re.findall(r"\b\d+\.\d+\.\d+\b", cells[2].split("(")[0])
        rows[package] = (cells[1].strip("`"), tested)
    return rows


def _matrix() -> dict[str, dict[str, str]]:
    text = (ROOT / "scripts" / "matrix.sh").read_text()
    combos = {}
    for name, pins in re.findall(r'^\s*"([\w-]+)\|([^|]*)\|\w+"\s*$', text, flags=re.MULTILINE):
        combos[name] = dict(pin.split("==") for pin in pins.split())
    return combos


def _tpu_extra() -> SpecifierSet:
    text = (ROOT / "pyproject.toml").read_text()
    (line,) = re.findall(r'^tpu = \["([^"]+)"\]', text, flags=re.MULTILINE)
    return Requirement(line).specifier


def test_readme_table_shows_the_ranges_the_package_declares():
    table = _readme_table()
    for library in LIBRARIES:
        assert library in table, f"README Compatibility table has no row for {library}"
        assert SpecifierSet(table[library][0]) == versions.supported_range(library), library
    assert SpecifierSet(table["torch-tpu"][0]) == _tpu_extra()


def test_the_matrix_tests_the_lowest_release_of_every_range():
    oldest = _matrix()["oldest"]
    for library in ("transformers", "accelerate", "wrapt"):
        spec = versions.supported_range(library)
        lower = [Version(s.version) for s in spec if s.operator == ">="]
        assert lower, f"{library}: no lower bound in {spec}"
        assert Version(oldest[library]) == lower[0], (
            f"{library}: the range starts at {lower[0]} but the matrix's oldest combination tests "
            f"{oldest[library]}: widen or narrow both together"
        )


@pytest.mark.parametrize("source", ["matrix", "readme"])
def test_every_tested_version_is_inside_the_supported_range(source):
    if source == "matrix":
        pairs = [(lib, ver) for combo in _matrix().values() for lib, ver in combo.items()]
        assert len(_matrix()) >= 2
    else:
        pairs = [(lib, ver) for lib, (_, tested) in _readme_table().items() if lib in LIBRARIES for ver in tested]
    assert pairs
    for library, version in pairs:
        assert versions.supported_range(library).contains(version), f"{library}=={version} ({source})"


def test_the_readme_lists_every_version_the_matrix_tests():
    table = _readme_table()
    for combo in _matrix().values():
        for library, version in combo.items():
            assert version in table[library][1], f"README does not list {library} {version} as tested"


def test_the_running_interpreter_is_a_supported_combination():
    # Whichever venv runs this (main suite, matrix, torch_tpu check), its versions are in range.
    for library in LIBRARIES:
        assert versions.version_gate(library) is None, versions.version_gate(library)
    assert sys.version_info >= (3, 10)
