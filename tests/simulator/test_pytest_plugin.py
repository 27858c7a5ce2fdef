"""The ``simulated_tpu`` fixture in a user's own test suite: results do not depend on test order.

Runs pytest on a small suite in a subprocess, as a user's CI does: a test that does not ask for the
fixture sees the same machine (no TPU) whether it runs before or after one that does; when the user
installed the simulator for the whole run (``TRANSFORMERS_TPU_EXT_SIMULATE=1``), every test sees it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

PLAIN = """
import torch
import transformers_tpu_ext  # noqa: F401

def test_{name}():
    seen = torch.accelerator.is_available(), torch.accelerator.device_count()
    print("SEEN {name}", seen)
    assert seen == {expected}
"""

WITH_FIXTURE = """
import torch

def test_with_the_fixture(simulated_tpu):
    assert torch.accelerator.is_available() and torch.accelerator.device_count() == 4
    simulated_tpu.configure(chips=8)
    assert torch.ones(2, device="tpu").device.type == "tpu"

def test_with_the_fixture_again(simulated_tpu):
    assert torch.accelerator.device_count() == 4  # configuration reset between tests
"""


def _suite(tmp_path, expected: str) -> None:
    (tmp_path / "test_0_before.py").write_text(textwrap.dedent(PLAIN.format(name="before", expected=expected)))
    (tmp_path / "test_1_fixture.py").write_text(textwrap.dedent(WITH_FIXTURE))
    (tmp_path / "test_2_after.py").write_text(textwrap.dedent(PLAIN.format(name="after", expected=expected)))


def _pytest(tmp_path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300,
    )


def test_a_test_without_the_fixture_sees_no_tpu_before_or_after_one_with_it(tmp_path):
    _suite(tmp_path, expected="(False, 0)")
    proc = _pytest(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout
    assert "SEEN before (False, 0)" in proc.stdout and "SEEN after (False, 0)" in proc.stdout


def test_a_simulator_installed_for_the_whole_run_stays_visible(tmp_path):
    _suite(tmp_path, expected="(True, 4)")
    proc = _pytest(tmp_path, TRANSFORMERS_TPU_EXT_SIMULATE="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SEEN before (True, 4)" in proc.stdout and "SEEN after (True, 4)" in proc.stdout


NO_NEW_PROGRAMS = """
import torch

def test_a_shape_seen_before_compiles_nothing(simulated_tpu, no_new_programs):
    x = torch.ones(4, device="tpu")
    x + 1
    with no_new_programs("the same shape again"):
        x + 1

def test_a_new_shape_fails_the_test(simulated_tpu, no_new_programs):
    (torch.ones(4, device="tpu") * 2)
    with no_new_programs("a new shape"):
        torch.ones(5, device="tpu") * 2
"""


def test_the_no_new_programs_fixture_fails_a_test_that_compiles_in_steady_state(tmp_path):
    (tmp_path / "test_programs.py").write_text(textwrap.dedent(NO_NEW_PROGRAMS))
    proc = _pytest(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "1 failed, 1 passed" in out, out
    assert "NewProgramsError: a new shape needed 2 new TPU programs in steady state" in out, out
    assert "eager (compiled): eager (<OpOverload(op='aten.mul', overload='Tensor')>, torch.Size([5])" in out, out
