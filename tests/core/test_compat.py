"""Supported and tested versions are written once (requirements.txt) and README and CI agree with them.

- README's "Compatibility" table shows exactly the ranges and the tested releases of
  ``transformers_tpu_ext/requirements.txt`` (and the ``tpu`` extra of pyproject.toml).
- CI tests every release listed as tested: ``scripts/matrix.sh`` (the oldest combination, and Transformers
  5.24), the main suite (``scripts/test.sh``: ``TORCH_PIN`` of ``scripts/bootstrap.sh`` and the tested set of
  ``constraints.txt``), and last the newest release the package index offered when the tested set was
  updated (``scripts/newest.sh`` runs the newest of each day).
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


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, _, version = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


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


def _run_by_ci() -> dict[str, set[str]]:
    """The releases of each library the matrix and the main suite pin."""
    combos = _matrix()
    run = {library: {combo[library] for combo in combos.values()} for library in LIBRARIES}
    run["torch"].add(_main_suite_torch())
    for library in ("transformers", "accelerate", "wrapt"):  # the main suite installs the tested set
        run[library].add(_constraints()[library])
    return run


def test_ci_tests_exactly_the_releases_listed_as_tested():
    assert set(_matrix()) == {"oldest", "middle"}
    for library, run in _run_by_ci().items():
        tested = list(versions.tested_versions(library))
        # Every release CI pins is listed; the last listed may be the newest stage's (newer than any pin).
        assert set(tested) - run <= {tested[-1]}, (library, tested, sorted(run, key=Version))
        assert sorted(run, key=Version) == [v for v in tested if v in run], library
        assert Version(tested[-1]) >= max(map(Version, run)), library


def test_the_tested_set_is_what_bootstrap_and_ci_install():
    """constraints.txt pins the tested set: every library in it at a tested release, no torch (bootstrap pins
    it: TORCH_PIN), and bootstrap, check_jax and check_lm_eval install from it."""
    pins = _constraints()
    assert "torch" not in pins and "transformers-tpu-ext" not in pins
    for library in ("transformers", "accelerate", "wrapt"):
        assert pins[library] == versions.tested_versions(library)[-1] or pins[library] in versions.tested_versions(library)
    for extra in ("peft", "trl", "sentence-transformers", "torchao", "jax", "lm-eval", "kernels"):
        assert extra in pins, f"constraints.txt lacks {extra}"
    for script in ("bootstrap.sh", "check_jax.sh", "check_lm_eval.sh", "check_torch_tpu.sh"):
        assert "constraints.txt" in (ROOT / "scripts" / script).read_text(), script


def test_the_running_venv_holds_the_releases_ci_claims_to_test():
    # What the test above assumes, checked where it runs: a matrix combination's venv (scripts/matrix.sh names
    # it) holds its pins, the main suite's venv (torch = bootstrap's pin) the tested set; every other venv of CI
    # tested releases, except the newest stage, whose releases may be newer than every tested one (its job).
    import os
    from importlib import metadata

    installed = {library: Version(metadata.version(library)).base_version for library in LIBRARIES}
    combination = os.environ.get("MATRIX_COMBINATION")
    if combination:
        assert installed == _matrix()[combination], combination
        return
    newest = {library: Version(installed[library]) > Version(versions.tested_versions(library)[-1]) for library in LIBRARIES}
    for library in LIBRARIES:
        assert installed[library] in versions.tested_versions(library) or newest[library], (library, installed[library])
    if installed["torch"] == _main_suite_torch() and not any(newest.values()):
        for library in ("transformers", "accelerate", "wrapt"):
            assert installed[library] == _constraints()[library], library


def test_the_oldest_combination_pins_the_lowest_release_of_every_range():
    oldest = _matrix()["oldest"]
    for library in LIBRARIES:
        spec = versions.supported_range(library)
        lower = [Version(s.version) for s in spec if s.operator == ">="]
        assert lower, f"{library}: no lower bound in {spec}"
        assert Version(oldest[library]).release[:2] == lower[0].release[:2], (
            f"{library}: the range starts at {lower[0]} but the oldest combination tests {oldest[library]}: "
            "widen or narrow both together"
        )
        assert oldest[library] == versions.tested_versions(library)[0]


def test_the_running_interpreter_is_a_supported_combination():
    # Whichever venv runs this (main suite, matrix, torch_tpu check), its versions are in range.
    for library in LIBRARIES:
        assert versions.version_gate(library) is None, versions.version_gate(library)
    assert sys.version_info >= (3, 11)
