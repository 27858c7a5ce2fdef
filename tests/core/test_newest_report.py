"""scripts/newest_report.py: what the "newest" CI stage says it resolved, and whom it blames when it fails."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("newest_report", ROOT / "scripts" / "newest_report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

FREEZE = """torch==2.15.0
nvidia-cublas==13.4.1.3
triton==3.9.0
transformers==5.26.0
accelerate==1.16.0
Jinja2==3.1.6
some_new_dep==1.0
"""
CONSTRAINTS = """# the tested set
transformers==5.25.0
accelerate==1.16.0
jinja2==3.1.6
"""
JUNIT = """<testsuites><testsuite>
<testcase classname="tests.generation.test_generation" name="test_a"><failure message="x"/></testcase>
<testcase classname="tests.generation.test_buckets.TestLadder" name="test_b"><error message="y"/></testcase>
<testcase classname="tests.kernels.test_kernels" name="test_ok"/>
<testcase classname="tests.kernels.test_kernels" name="test_c"><failure message="z"/></testcase>
</testsuite></testsuites>"""


def test_pins_are_read_by_canonical_name_without_the_local_version():
    pins = report.parse_pins(FREEZE + "torchao==0.18.0+cpu\n-e git+x#egg=y\n")
    assert pins["jinja2"] == "3.1.6" and pins["some-new-dep"] == "1.0" and pins["torchao"] == "0.18.0"


def test_newer_releases_are_named_key_libraries_first():
    rows = report.differences(report.parse_pins(FREEZE), report.parse_pins(CONSTRAINTS))
    assert rows == [("torch", "2.15.0", None), ("transformers", "5.26.0", "5.25.0"), ("some-new-dep", "1.0", None)]
    text = report.resolved_text(report.parse_pins(FREEZE), report.parse_pins(CONSTRAINTS))
    assert "transformers 5.26.0 (tested: 5.25.0)" in text and "and 1 other package" in text
    # requirements.txt's tested releases count too (torch is pinned by bootstrap, not by the constraints file)
    listed = {"torch": ("2.11.0", "2.13.0", "2.15.0")}
    assert [row[0] for row in report.differences(report.parse_pins(FREEZE), report.parse_pins(CONSTRAINTS), listed)] == [
        "transformers", "some-new-dep"
    ]


def test_a_failure_names_the_releases_the_patches_that_stood_aside_and_the_capabilities():
    tests = report.failing_tests(JUNIT)
    assert tests == [
        "tests/generation/test_generation.py::test_a",
        "tests/generation/test_buckets.py::TestLadder::test_b",
        "tests/kernels/test_kernels.py::test_c",
    ]
    doctor = {"patches": {"skipped": {"use_kernels": "stands aside: transformers 5.26.0 changed ...", "generation": "disabled by X"}}}
    patches = {"generation": "generation", "recompile_guard_generate": "generation", "use_kernels": "kernels", "hub_kernels": "kernels"}
    text = report.failed_text(report.parse_pins(FREEZE), report.parse_pins(CONSTRAINTS), tests, doctor, patches)
    assert "transformers 5.26.0 (tested: 5.25.0)" in text
    assert "use_kernels (stands aside: transformers 5.26.0" in text and "generation (disabled" not in text
    assert "generation: 2 (" in text and "patches: generation, recompile_guard_generate" in text
    assert "kernels: 1 (" in text and "patches: hub_kernels, use_kernels" in text
