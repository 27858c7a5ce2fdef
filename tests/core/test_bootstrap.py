"""scripts/bootstrap.sh installs a CPU build of torch, here and on a machine that reaches the public index.

A stub ``python`` in the venv records the pip commands the script runs (nothing is installed): a local
wheel first (no index at all), else PyTorch's CPU index when it answers, else the default index with a
warning, and never a hang on an index that cannot be reached.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUB = """#!/usr/bin/env bash
echo "$*" >> "{log}"
case "$*" in
  *--no-index*--no-deps*) [ -n "{local_wheel}" ] || exit 1 ;;
  *--no-index*) [ "{local_wheel}" = "all" ] || exit 1 ;;
esac
exit 0
"""


def _bootstrap(tmp_path: Path, *, local_wheel: bool | str, index_url: str) -> tuple[list[str], str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    stub = venv / "bin" / "python"
    wheels = {True: "all", False: ""}.get(local_wheel, local_wheel)  # "all": torch and its dependencies
    stub.write_text(STUB.format(log=log, local_wheel=wheels))
    stub.chmod(0o755)
    env = {**os.environ, "TRANSFORMERS_TPU_EXT_VENV": str(venv), "TORCH_INDEX_URL": index_url, "PYTHON": sys.executable}
    env.pop("TORCH_PIN", None)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap.sh")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(venv)
    return log.read_text().splitlines(), proc.stderr


def test_a_local_wheel_is_used_without_any_index(tmp_path):
    calls, err = _bootstrap(tmp_path, local_wheel=True, index_url="http://127.0.0.1:9/unused")
    assert calls[0].endswith("--no-index torch==2.13.0")
    assert len(calls) == 2 and calls[1].endswith(f"-e {ROOT}[test,trl,embeddings]")
    assert "from a local wheel" in err


def test_a_local_wheel_of_torch_alone_gets_its_dependencies_from_the_index_without_a_cuda_warning(tmp_path):
    # issue 29: a wheel directory holding torch alone (PIP_FIND_LINKS=/opt/wheels) failed `--no-index`, then
    # warned about a CUDA build it did not install
    calls, err = _bootstrap(tmp_path, local_wheel="torch", index_url="http://127.0.0.1:9/unused")
    assert calls[0].endswith("--no-index torch==2.13.0")  # everything offline: not here
    assert calls[1].endswith("--no-index --no-deps torch==2.13.0")  # torch itself, from the wheel
    assert calls[2].endswith("--disable-pip-version-check torch==2.13.0")  # installed: only its dependencies
    assert len(calls) == 4 and calls[3].endswith(f"-e {ROOT}[test,trl,embeddings]")
    assert "from a local wheel, its dependencies from the package index" in err
    assert "warning" not in err and "CUDA" not in err and "cannot be reached" not in err


def test_each_step_says_how_long_it_took(tmp_path):
    _, err = _bootstrap(tmp_path, local_wheel=True, index_url="http://127.0.0.1:9/unused")
    assert err.count("done in ") == 2 and "ready in " in err


def test_the_cpu_index_when_it_answers(tmp_path):
    index = tmp_path / "cpu-index"
    index.mkdir()
    calls, err = _bootstrap(tmp_path, local_wheel=False, index_url=index.as_uri())
    assert calls[1].endswith("--no-index --no-deps torch==2.13.0")  # tried, silently
    assert calls[2].endswith(f"--extra-index-url {index.as_uri()} torch==2.13.0+cpu")
    assert "warning" not in err


def test_an_unreachable_index_fails_fast_to_the_default_index_with_a_warning(tmp_path):
    started = time.monotonic()
    calls, err = _bootstrap(tmp_path, local_wheel=False, index_url="http://127.0.0.1:9/whl/cpu")
    assert time.monotonic() - started < 60
    assert calls[2].endswith("--disable-pip-version-check torch==2.13.0")
    assert "cannot be reached" in err and "CUDA build" in err
