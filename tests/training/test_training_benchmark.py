"""The training benchmark: a smoke run of ``benchmarks/bench_train.py --quick`` (plugin side only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import _bench
import _training

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_train.py"


def _load():
    return _bench.load(BENCH)


def test_bucket_policies_are_compared_on_the_same_batches():
    batches = [[4, 117, 300], [4, 120, 250], [4, 100, 260], [4, 90, 250], [2, 20, 30]]
    policies = _load().bucket_policies(batches)
    shapes = {name: policy["shapes"] for name, policy in policies.items()}
    assert shapes == {
        "longest_in_batch (upstream collators)": 5,
        "fixed_128 (pad to max_length)": 1,
        "pow2 ladder": 2,
        "2 rungs/octave, no reuse": 3,  # 128, 96, 32
        "ours (2 rungs/octave, reuse 1.5)": 2,  # 90 reuses 128; 20 gets 32
    }
    assert policies["fixed_128 (pad to max_length)"]["padding_overhead"] == round(5 * 4 * 128 / 1090, 3)


@pytest.mark.slow
@_training.requires_trainer
def test_quick_run_prints_the_json_report(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    out = tmp_path / "train.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--sides", "plugin", "--output", str(out)],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report == json.loads(out.read_text())
    trainer = report["plugin"]["trainer"]
    assert trainer["params_device"] == ["tpu:0"] and trainer["max_loss_diff_vs_cpu"] < 1e-3
    # Accelerate 1.16 names torch.accelerator's device without its index (`tpu`), as it names `cuda`
    expected = "tpu" if _training.accelerate_finds_the_tpu() else "tpu:0"
    assert report["plugin"]["accelerate_loop"]["accelerator_device"] == expected
    assert report["plugin"]["torch_compile"]["backend"] == "tpu" and report["plugin"]["torch_compile"]["graphs_total"] > 0
    assert set(report["bucket_policies"]) >= {"ours (2 rungs/octave, reuse 1.5)", "longest_in_batch (upstream collators)"}
