"""Supported version ranges and the gate every patch passes before it is applied.

The ranges are written once, in ``requirements.txt`` next to this file: pip installs from it
(``pyproject.toml`` declares it as the dynamic dependency list) and the gates below read it.
"""

from __future__ import annotations

import functools
from importlib import metadata, resources

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

__all__ = ["SUPPORTED", "installed_version", "supported_range", "version_gate"]


@functools.cache
def _read_ranges() -> dict[str, SpecifierSet]:
    text = resources.files(__package__).joinpath("requirements.txt").read_text()
    ranges: dict[str, SpecifierSet] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            ranges[_canonical(req.name)] = req.specifier
    return ranges


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def supported_range(distribution: str) -> SpecifierSet:
    """The range of ``distribution`` this release supports (from ``requirements.txt``)."""
    return _read_ranges()[_canonical(distribution)]


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or ``None`` when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def version_gate(distribution: str) -> str | None:
    """``None`` when the installed ``distribution`` is in the supported range, else the reason.

    Pre-releases and local builds (``2.13.0+cpu``, ``5.25.0.dev0``) are compared by their release
    number, so a nightly of a supported version passes.
    """
    installed = installed_version(distribution)
    spec = supported_range(distribution)
    if installed is None:
        return f"{distribution} is not installed (supported: {spec})"
    release = Version(Version(installed).base_version)
    if not spec.contains(release, prereleases=True):
        return f"{distribution} {installed} is installed; this release supports {distribution}{spec}"
    return None


def __getattr__(name: str) -> dict[str, str]:
    if name == "SUPPORTED":
        return {dist: str(spec) for dist, spec in _read_ranges().items()}
    raise AttributeError(name)
