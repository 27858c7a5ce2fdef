"""The persistent compile cache across processes, on the simulated TPU (which models torch_tpu's).

Each run is a fresh interpreter (``cache_worker.py``): a tiny model's ``generate()``, its counters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("cache_worker.py")
ROOT_ENV = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"


def _env(**changes: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_TPU_EXT_", "TORCH_TPU_"))}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _start(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{out}\n{err}"
    lines = [line for line in out.splitlines() if line.startswith("@@RESULT@@")]
    assert len(lines) == 1, out + err
    return {**json.loads(lines[0][len("@@RESULT@@"):]), "stderr": err}


def run(env: dict[str, str], *args: str) -> dict:
    return _result(_start(env, *args))


def compiled(result: dict) -> int:
    return result["counters"]["graphs_compiled"] + result["counters"]["eager_programs"]


def test_a_second_process_with_the_same_root_compiles_nothing(tmp_path):
    root = str(tmp_path / "cache")
    env = _env(TRANSFORMERS_TPU_EXT_COMPILE_CACHE=root)
    first = run(env)
    assert first["root"] == root and first["report"]["set_by"] == "transformers-tpu-ext"
    assert compiled(first) > 0 and first["counters"]["programs_loaded"] == 0
    second = run(env)
    assert compiled(second) == 0
    assert second["counters"]["programs_loaded"] == compiled(first)
    assert second["tokens"] == first["tokens"]
    assert second["report"]["entries"] == compiled(first)
    # Entries are keyed by the torch_tpu release: another one reads none of them.
    other = run(env, "--version", "0.3.0")
    assert compiled(other) == compiled(first) and other["counters"]["programs_loaded"] == 0


def test_the_default_on_the_simulated_tpu_keeps_nothing(tmp_path):
    result = run(_env(HF_HOME=str(tmp_path)))
    assert result["root"] is None and result["report"]["root"] is None
    assert "no TPU chip on this host" in result["report"]["reason"]
    assert not any(tmp_path.rglob("*.bin"))


def test_a_root_the_user_set_is_left_alone_and_used(tmp_path):
    mine, ours = tmp_path / "mine", tmp_path / "ours"
    result = run(_env(**{ROOT_ENV: str(mine), "TRANSFORMERS_TPU_EXT_COMPILE_CACHE": str(ours)}))
    assert result["root"] == str(mine) and result["report"]["set_by"] == "environment"
    assert len(list(mine.rglob("*.bin"))) == compiled(result) > 0
    assert not ours.exists()


def test_a_root_that_cannot_be_created_is_not_set_where_torch_tpu_would_abort(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    bad = str(tmp_path / "file" / "cache")
    result = run(_env(TRANSFORMERS_TPU_EXT_COMPILE_CACHE=bad))
    assert result["root"] is None and compiled(result) > 0  # it ran, without the persistent cache
    assert "the persistent compile cache is off" in result["stderr"] and "cannot be created or written" in result["stderr"]
    # The same root given to torch_tpu directly: the process aborts at its first compilation.
    proc = _start(_env(**{ROOT_ENV: bad}))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode != 0 and "Failed to create tier-3 cache directory" in err


def test_processes_sharing_a_root_at_the_same_time_write_whole_entries(tmp_path):
    root = tmp_path / "shared"
    env = _env(TRANSFORMERS_TPU_EXT_COMPILE_CACHE=str(root))
    procs = [_start(env), _start(env)]
    results = [_result(p) for p in procs]
    assert results[0]["tokens"] == results[1]["tokens"]
    entries = list(root.rglob("*.bin"))
    assert entries and not list(root.rglob("*.tmp"))
    for entry in entries:
        assert entry.read_text().startswith(("graph of ", "eager ")), entry
    after = run(env)
    assert compiled(after) == 0 and after["counters"]["programs_loaded"] == len(entries)
