"""Supported and tested versions are written once (requirements.txt) and README and CI agree with them.

- README's "Compatibility" table shows exactly the ranges and the tested releases of
  ``transformers_tpu_ext/requirements.txt`` (and the ``tpu`` extra of pyproject.toml).
- CI tests every release listed as tested, and only those: ``scripts/matrix.sh`` (oldest and newest
  combinations) plus the main suite (``scripts/test.sh``: ``TORCH_PIN`` of ``scripts/bootstrap.sh``
  and the newest tested release of everything else).
- The oldest combination pins the lowest release of every range: no untested lower bound is claimed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from transformers_tpu_ext.core import versions

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = ("torch", "transformers", "accelerate", "wrapt")


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
    for name, pins in re.findall(r'^\s*"([\w-]+)\|([^|"]*)"\s*$', text, flags=re.MULTILINE):
        combos[name] = dict(pin.split("==") for pin in pins.split())
    return combos


def _main_suite_torch() -> str:
    text = (ROOT / "scripts" / "bootstrap.sh").read_text()
    (pin,) = re.findall(r'TORCH_PIN:-torch==([\d.]+)', text)
    return pin


def _tpu_extra() -> SpecifierSet:
    text = (ROOT / "pyproject.toml").read_text()
    (line,) = re.findall(r'^tpu = \["([^"]+)"\]', text, flags=re.MULTILINE)
    return Requirement(line).specifier


def test_readme_table_shows_the_ranges_and_tested_releases_the_package_declares():
    table = _readme_table()
    for library in LIBRARIES:
        assert library in table, f"README Compatibility table has no row for {library}"
        assert SpecifierSet(table[library][0]) == versions.supported_range(library), library
        assert table[library][1] == list(versions.tested_versions(library)), library
    assert SpecifierSet(table["torch-tpu"][0]) == _tpu_extra()


def test_ci_tests_exactly_the_releases_listed_as_tested():
    combos = _matrix()
    assert set(combos) == {"oldest", "newest"}
    run = {library: {combo[library] for combo in combos.values()} for library in LIBRARIES}
    run["torch"].add(_main_suite_torch())
    for library in ("transformers", "accelerate", "wrapt"):  # the main suite gets the newest of these
        run[library].add(versions.tested_versions(library)[-1])
    for library in LIBRARIES:
        assert sorted(run[library], key=Version) == list(versions.tested_versions(library)), library


def test_the_running_venv_holds_the_releases_ci_claims_to_test():
    # What the test above assumes of the main suite, checked where it runs: every venv of CI holds
    # tested releases only, and the main suite's (torch = bootstrap's pin) the newest of the rest.
    from importlib import metadata

    installed = {library: Version(metadata.version(library)).base_version for library in LIBRARIES}
    for library in LIBRARIES:
        assert installed[library] in versions.tested_versions(library), (library, installed[library])
    if installed["torch"] == _main_suite_torch():
        for library in ("transformers", "accelerate", "wrapt"):
            assert installed[library] == versions.tested_versions(library)[-1], library


def test_the_oldest_combination_pins_the_lowest_release_of_every_range():
    oldest, newest = _matrix()["oldest"], _matrix()["newest"]
    for library in LIBRARIES:
        spec = versions.supported_range(library)
        lower = [Version(s.version) for s in spec if s.operator == ">="]
        assert lower, f"{library}: no lower bound in {spec}"
        assert Version(oldest[library]).release[:2] == lower[0].release[:2], (
            f"{library}: the range starts at {lower[0]} but the oldest combination tests {oldest[library]}: "
            "widen or narrow both together"
        )
        assert oldest[library] == versions.tested_versions(library)[0]
        assert newest[library] == versions.tested_versions(library)[-1]


def test_the_running_interpreter_is_a_supported_combination():
    # Whichever venv runs this (main suite, matrix, torch_tpu check), its versions are in range.
    for library in LIBRARIES:
        assert versions.version_gate(library) is None, versions.version_gate(library)
    assert sys.version_info >= (3, 11)
