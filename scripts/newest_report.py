"""What scripts/newest.sh says: the releases it resolved, and on a failure the package and the patch to look at.

    python scripts/newest_report.py --resolved R --constraints C resolved
    python scripts/newest_report.py --resolved R --constraints C failed --junit J --doctor D
    python scripts/newest_report.py --resolved R --constraints C passed --doctor D

``R`` is ``pip freeze`` of the newest venv, ``C`` the tested set (constraints.txt), ``J`` pytest's junit XML,
``D`` ``transformers-tpu doctor --json``. The functions are pure (tests/core/test_newest_report.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

#: The libraries the plugin patches or whose extras it has, first in every list.
KEY = (
    "torch", "transformers", "accelerate", "wrapt", "peft", "trl", "sentence-transformers", "lm-eval", "jax",
    "kernels", "torchao", "huggingface-hub", "tokenizers", "safetensors", "datasets",
)


#: What a CUDA build of torch brings along (the newest stage installs the index's torch, run on the CPU).
TORCH_BUILD = ("nvidia-", "cuda-", "triton")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str) -> dict[str, str]:
    """``name==version`` lines (pip freeze, a constraints file) as ``{canonical name: version}``; the local part
    of a version (``2.13.0+cpu``) is dropped, as pip compares it."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            name, _, version = line.partition("==")
            pins[canonical(name.split("[")[0])] = version.strip().split("+")[0]
    return pins


def differences(
    resolved: dict[str, str], tested: dict[str, str], listed: dict[str, tuple[str, ...]] | None = None
) -> list[tuple[str, str, str | None]]:
    """``(package, resolved, tested)`` for every package whose resolved release is not the tested one (``None``:
    not in the tested set), the key libraries first. ``listed``: the tested releases requirements.txt names
    (torch is not in the constraints file: bootstrap pins it), which count as tested too."""
    listed = listed or {}
    rows = [
        (name, version, tested.get(name) or ", ".join(listed.get(name, ())) or None)
        for name, version in resolved.items()
        if tested.get(name) != version and version not in listed.get(name, ()) and not name.startswith(TORCH_BUILD)
    ]
    return sorted(rows, key=lambda row: (KEY.index(row[0]) if row[0] in KEY else len(KEY), row[0]))


def failing_tests(junit: str) -> list[str]:
    """The ids (``tests/x/test_y.py::name``) of the failed or errored test cases of a junit XML report."""
    ids = []
    for case in ElementTree.fromstring(junit).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            parts = case.get("classname", "").split(".")
            module = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
            ids.append("::".join(["/".join(parts[: module + 1]) + ".py", *parts[module + 1 :], case.get("name", "")]))
    return ids


def by_capability(test_ids: list[str], patches: dict[str, str]) -> dict[str, tuple[list[str], list[str]]]:
    """Failing tests grouped by the capability folder they test (``tests/<capability>/``), with its patches
    (``patches``: the registry's patch name -> capability)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for test in test_ids:
        parts = test.split("/")
        groups[parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"].append(test)
    return {
        capability: (tests, sorted(name for name, owner in patches.items() if owner == capability))
        for capability, tests in sorted(groups.items())
    }


def stood_aside(doctor: dict) -> dict[str, str]:
    """The patches ``doctor --json`` reports as not applied for a reason other than being disabled."""
    skipped = (doctor.get("patches") or {}).get("skipped") or {}
    return {name: reason for name, reason in skipped.items() if not reason.startswith("disabled")}


def _release_lines(rows: list[tuple[str, str, str | None]]) -> list[str]:
    key = [row for row in rows if row[0] in KEY]
    other = len(rows) - len(key)
    lines = [f"{name} {version} (tested: {tested or 'not in the tested set'})" for name, version, tested in key]
    if other:
        lines.append(f"and {other} other package{'s' if other != 1 else ''} (see the venv's resolved.txt)")
    return lines


def resolved_text(resolved: dict[str, str], tested: dict[str, str], listed: dict[str, tuple[str, ...]] | None = None) -> str:
    shown = " ".join(f"{name}=={resolved[name]}" for name in KEY if name in resolved)
    rows = differences(resolved, tested, listed)
    newer = "; ".join(_release_lines(rows)) if rows else "none: the newest releases are the tested set"
    return f"newest: resolved {shown}\nnewest: newer than constraints.txt: {newer}"


def failed_text(
    resolved: dict[str, str],
    tested: dict[str, str],
    tests: list[str],
    doctor: dict,
    patches: dict[str, str],
    listed: dict[str, tuple[str, ...]] | None = None,
) -> str:
    lines = ["newest: FAILED on the newest releases"]
    rows = differences(resolved, tested, listed)
    lines.append("  releases newer than the tested set: " + ("; ".join(_release_lines(rows)) if rows else "none"))
    aside = stood_aside(doctor)
    lines.append("  patches that stood aside: " + ("; ".join(f"{n} ({r})" for n, r in aside.items()) if aside else "none"))
    groups = by_capability(tests, patches)
    if groups:
        lines.append("  failing tests by capability (the patches to look at):")
    for capability, (ids, names) in groups.items():
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        lines.append(f"    {capability}: {len(ids)} ({shown}); patches: {', '.join(names) or 'none'}")
    if not groups and not aside:
        lines.append("  no test failed: the demo did (its output is above)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolved", type=Path, required=True)
    parser.add_argument("--constraints", type=Path, required=True)
    parser.add_argument("what", choices=("resolved", "failed", "passed"))
    parser.add_argument("--junit", type=Path)
    parser.add_argument("--doctor", type=Path)
    args = parser.parse_args(argv)
    resolved = parse_pins(args.resolved.read_text())
    tested = parse_pins(args.constraints.read_text())
    doctor: dict = {}
    if args.doctor and args.doctor.exists() and args.doctor.stat().st_size:
        try:
            doctor = json.loads(args.doctor.read_text())
        except ValueError:
            doctor = {}
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from transformers_tpu_ext.core.versions import TESTED
    from transformers_tpu_ext.registry import PATCHES

    listed = {canonical(name): tuple(versions) for name, versions in TESTED.items()}
    if args.what == "resolved":
        print(resolved_text(resolved, tested, listed))
        return 0
    if args.what == "passed":
        aside = stood_aside(doctor)
        note = f"; patches that stood aside: {', '.join(aside)}" if aside else ""
        print(f"newest: passed (the fast suite and the demo){note}")
        return 0
    tests = failing_tests(args.junit.read_text()) if args.junit and args.junit.exists() else []
    print(failed_text(resolved, tested, tests, doctor, dict(PATCHES), listed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
