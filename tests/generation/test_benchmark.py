"""The generation benchmark: a smoke run of ``benchmarks/bench_generate.py --quick``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import _bench

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_generate.py"


def _load():
    return _bench.load(BENCH)


def test_workload_is_fixed_and_spans_the_issue_ranges():
    bench = _load()
    calls = bench.mixed_workload(24, 200, 48)
    assert calls == bench.mixed_workload(24, 200, 48)
    assert len(calls) == 24 and {b for b, _, _ in calls} <= {1, 2, 3}
    assert max(p for _, p, _ in calls) > 150 and min(p for _, p, _ in calls) < 50
    assert all(1 <= n <= 48 for _, _, n in calls)


def test_our_policy_beats_powers_of_two_on_the_workload():
    policies = _load().prior_art(quick=False)
    ours, pow2 = policies["ours"], policies["pow2_min16 (vLLM TPU)"]
    assert ours["padding_overhead"] < pow2["padding_overhead"]


@pytest.mark.slow
def test_quick_run_prints_the_json_report(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--sides", "plugin", "--no-overhead", "--output", str(out)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report == json.loads(out.read_text())
    plugin = report["plugin"]
    assert plugin["tpu_inputs"]["tokens_match_cpu"] and plugin["tpu_inputs"]["output_on_input_device"]
    assert plugin["tpu_inputs"]["new_programs_per_token_after_first_call"] == 0
    assert plugin["mixed"]["tokens_match_cpu"]
    assert plugin["mixed"]["padding_overhead"] >= 1.0 and plugin["mixed"]["attention_overhead"] >= 1.0
    modes = ("greedy", "sample", "host_loop")
    assert set(plugin["decode_bytes"]) == {f"batch1/inputs_{w}/{m}" for w in ("cpu", "tpu") for m in modes}
    for name, steady in plugin["decode_bytes"].items():
        assert steady["new_programs"] == 0
        if name.endswith("host_loop"):  # the logits come to the host; only the token ids go back (issue 18, item 7)
            assert steady["d2h_bytes_per_row_step"] >= 320 * 4 and steady["h2d_bytes_per_row_step"] <= 64
        else:  # only token ids cross per step (issue 11's goals)
            assert steady["d2h_bytes_per_row_step"] <= 16 and steady["h2d_bytes_per_row_step"] <= 64
    # One prefill of 4 rows, one 16-token chunk, a 64-long cache: the 2D mask (4 x 64) crosses, never the
    # 4D one (4 x 16 x 64 bytes) (issue 18, item 7).
    prefill = plugin["prefill_bytes"]["batch4_prompt12"]
    assert prefill["new_programs"] == 0 and prefill["h2d_bytes"] < 4 * 16 * 64


def test_the_recurrent_families_workload_is_fixed_and_spans_the_issue_ranges():
    import torch

    from transformers_tpu_ext.testing.tiny import RECURRENT_ARCHITECTURES

    families = _bench.load(BENCH.with_name("_recurrent_families.py"))
    _bench.load(BENCH.with_name("_families.py"))  # the other families' module, which --family also reads
    calls = families.workload(320, 12)
    again = families.workload(320, 12)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2] for a, b in zip(calls, again))
    assert {ids.shape[0] for ids, _, _ in calls} <= {1, 2, 3} and max(ids.shape[1] for ids, _, _ in calls) <= 100
    assert any(not bool(mask.all()) for _, mask, _ in calls)  # ragged batches among them
    assert all(1 <= new <= families.NEW for _, _, new in calls)
    assert set(families.FAMILIES) == set(RECURRENT_ARCHITECTURES)
    with pytest.raises(SystemExit, match="unknown family"):
        _load()._family_module("zamba2")
