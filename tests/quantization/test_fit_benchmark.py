"""The fit benchmark: its 8B-shaped counts (in process, meta device) and a run of ``benchmarks/bench_fit.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import _bench

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fit.py"


@pytest.fixture(scope="module")
def model_part():
    return _bench.load(BENCH).model_part()


def test_the_8b_shape_in_bf16_int8_and_fp8(model_part):
    assert model_part["parameters"] == 8_030_261_248  # Llama-3.1-8B
    rows = {(row["weights"], row["kv"]): row for row in model_part["formats"]}
    assert set(rows) == {(w, kv) for w in ("bf16", "int8", "fp8") for kv in ("bf16", "int8")}
    bf16 = rows["bf16", "bf16"]
    assert bf16["weight_bytes"] == 2 * model_part["parameters"]
    for weights in ("int8", "fp8"):
        # Embeddings and head stay bf16 (2 GiB of the 8B model): 8-bit linears give 0.57x, not 0.5x.
        assert 0.5 < rows[weights, "bf16"]["weight_bytes"] / bf16["weight_bytes"] < 0.6
        assert rows[weights, "bf16"]["chips"]["v5e"]["fits"]
    assert not bf16["chips"]["v5e"]["fits"] and bf16["chips"]["v6e"]["fits"]
    # 32 layers x 2 (K, V) x 8 heads x 128 dims: 2 bytes each, or 1 byte + a 4-byte scale per head and position.
    assert bf16["kv_bytes_per_position"] == 32 * 2 * 8 * 128 * 2
    assert rows["int8", "int8"]["kv_bytes_per_position"] == 32 * 2 * 8 * (128 + 4)
    assert rows["int8", "int8"]["kv_cache"].startswith("int8")


def test_ceilings_are_bandwidth_over_the_bytes_a_step_reads(model_part):
    bandwidth = model_part["bandwidth_bytes_per_s"]
    assert bandwidth == {"v5e": 819e9, "v6e": 1638e9, "v5p": 2765e9}
    assert all("cloud.google.com/tpu/docs/" in source for source in model_part["bandwidth_sources"].values())
    for row in model_part["formats"]:
        context = model_part["context"]
        assert row["step_bytes"]["batch_1"] == row["weight_bytes"] + context * row["kv_bytes_per_position"]
        for gen, chip in row["chips"].items():
            assert chip["steps_per_s_batch_1"] == pytest.approx(bandwidth[gen] / row["step_bytes"]["batch_1"], abs=0.05)
            assert chip["tokens_per_s_batch_8"] == pytest.approx(8 * bandwidth[gen] / row["step_bytes"]["batch_8"], abs=0.05)


@pytest.mark.slow
def test_the_run_checks_the_counts_against_what_the_simulated_tpu_holds(tmp_path):
    pytest.importorskip("torchao")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    out = tmp_path / "fit.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--output", str(out)], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report == json.loads(out.read_text())
    plugin, plain = report["measured"]["plugin"], report["measured"]["plain"]
    for name in ("bf16", "int8", "fp8"):
        assert plugin[name]["linear_bytes_on_tpu"] == plugin[name]["predicted_linear_bytes"]
    assert plugin["int8"]["ratio_to_bf16"] <= 0.6 and plugin["fp8"]["ratio_to_bf16"] <= 0.6
    assert plugin["fp8"]["layer"] == "FP8Linear" and plugin["fp8"]["weight_dtypes"] == ["torch.float8_e4m3fn"]
    # Without the plugin the FP8 checkpoint is dequantized: the full bf16 bytes.
    assert plain["fp8"]["weight_dtypes"] == ["torch.bfloat16"] and plain["fp8"]["ratio_to_bf16"] == 1.0
    # The KV cache per position: upstream's bf16 static cache, the plugin's int8 one, each as counted.
    for side, kv in ((plain, "bf16"), (plugin, "int8")):
        assert side["kv_cache"]["format"] == kv
        assert side["kv_cache"]["bytes_per_position"] == side["kv_cache"]["predicted_bytes_per_position"]
    assert plugin["kv_cache"]["dtypes"] == ["torch.int8"]
    assert plugin["kv_cache"]["bytes_per_position"] <= 0.55 * plain["kv_cache"]["bytes_per_position"]
