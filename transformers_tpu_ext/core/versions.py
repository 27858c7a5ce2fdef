"""Supported and tested versions, and the gate every patch passes before it is applied.

Both are written once, in the package's ``requirements.txt`` (transformers_tpu_ext/requirements.txt): pip installs from it
(``pyproject.toml`` declares it as the dynamic dependency list) and the gates below read it::

    # tested: 5.23.0 5.24.0
    transformers>=5.23,<6

- The **supported** range is what pip may install: as wide as the patches allow (for Transformers,
  from the oldest release every patch supports up to the next major), so the plugin never blocks an
  upgrade. Outside it, the gate skips every patch of that library, with one warning.
- The **tested** releases (the ``# tested:`` line above a requirement) are the ones CI runs
  (``scripts/test.sh``, ``scripts/matrix.sh``): the oldest and the newest the package index offers.
  A release inside the range but past them is *allowed*: its patches are applied, each one checked
  as it is applied; a patch whose target changed shape is skipped with one warning naming the
  installed and the tested versions.
"""

from __future__ import annotations

import functools
from importlib import metadata, resources

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = [
    "SUPPORTED",
    "TESTED",
    "installed_version",
    "supported_range",
    "tested_versions",
    "untested",
    "version_gate",
]


@functools.cache
def _read() -> tuple[dict[str, SpecifierSet], dict[str, tuple[str, ...]]]:
    text = resources.files("transformers_tpu_ext").joinpath("requirements.txt").read_text()
    ranges: dict[str, SpecifierSet] = {}
    tested: dict[str, tuple[str, ...]] = {}
    pending: tuple[str, ...] = ()
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            if body.lower().startswith("tested:"):
                pending = tuple(body.split(":", 1)[1].replace(",", " ").split())
            continue
        if stripped:
            req = Requirement(stripped)
            name = _canonical(req.name)
            ranges[name] = req.specifier
            if pending:
                tested[name] = tuple(sorted(pending, key=Version))
            pending = ()
    return ranges, tested


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def supported_range(distribution: str) -> SpecifierSet:
    """The range of ``distribution`` this release supports (from ``requirements.txt``)."""
    return _read()[0][_canonical(distribution)]


def tested_versions(distribution: str) -> tuple[str, ...]:
    """The releases of ``distribution`` CI tests, oldest first (``()`` when none are listed)."""
    return _read()[1].get(_canonical(distribution), ())


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or ``None`` when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> Version | None:
    """``2.13.0+cpu`` → 2.13.0, ``5.25.0.dev0`` → 5.25.0 (a nightly of a release counts as that release)."""
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        return None


def _tested_text(distribution: str) -> str:
    tested = tested_versions(distribution)
    return f"tested with {distribution} {', '.join(tested)}" if tested else "no tested release listed"


def version_gate(distribution: str) -> str | None:
    """``None`` when the installed ``distribution`` is in the supported range, else the reason.

    Pre-releases and local builds (``2.13.0+cpu``, ``5.25.0.dev0``) are compared by their release
    number, so a nightly of a supported version passes.
    """
    installed = installed_version(distribution)
    spec = supported_range(distribution)
    if installed is None:
        return f"{distribution} is not installed (supported: {spec})"
    release = _release(installed)
    if release is None or not spec.contains(release, prereleases=True):
        return (
            f"{distribution} {installed} is installed; this release supports {distribution}{_lower_first(spec)} "
            f"({_tested_text(distribution)})"
        )
    return None


def untested(distribution: str) -> str | None:
    """``None`` when the installed ``distribution`` lies within the tested releases, else a note.

    A version between the oldest and the newest tested release counts as tested (5.23.1 between
    5.23.0 and 5.24.0); one past either end is allowed but untested.
    """
    installed = installed_version(distribution)
    tested = [Version(v) for v in tested_versions(distribution)]
    release = _release(installed) if installed else None
    if release is None or not tested or tested[0] <= release <= _last_of_series(tested[-1]):
        return None
    return f"{distribution} {installed} is installed; this release was {_tested_text(distribution)}"


def _last_of_series(version: Version) -> Version:
    """Patch releases of the newest tested minor count as tested (5.24.1 after 5.24.0)."""
    major, minor = (version.release + (0, 0))[:2]
    return Version(f"{major}.{minor}.999999")


def _lower_first(spec: SpecifierSet) -> str:
    # ">=5.23,<6" reads better than SpecifierSet's "<6,>=5.23".
    return ",".join(sorted(str(spec).split(","), key=lambda part: not part.startswith(">")))


def __getattr__(name: str) -> dict:
    if name == "SUPPORTED":
        return {dist: _lower_first(spec) for dist, spec in _read()[0].items()}
    if name == "TESTED":
        return dict(_read()[1])
    raise AttributeError(name)
