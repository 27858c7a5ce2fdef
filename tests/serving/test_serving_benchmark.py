"""The serving benchmark: its workload, and a smoke run of ``benchmarks/bench_serve.py --quick``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import _bench

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_serve.py"


def _load():
    return _bench.load(BENCH)


def test_workload_is_fixed_and_spans_the_issue_ranges():
    bench = _load()
    work = bench.workload(100, 300, 64)
    assert work == bench.workload(100, 300, 64) and len(work) == 100
    assert min(p for p, _ in work) < 10 and max(p for p, _ in work) > 290
    assert min(n for _, n in work) <= 2 and max(n for _, n in work) >= 60
    assert [p for p, _ in work] != sorted(p for p, _ in work)  # mixed order


@pytest.mark.slow
def test_quick_run_prints_the_json_report(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    out = tmp_path / "serve.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--sides", "plugin", "--output", str(out)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report == json.loads(out.read_text())
    plugin = report["plugin"]
    assert plugin["tokens_match_cpu"] and plugin["compile_backend"] == "tpu"
    assert plugin["programs_after_warmup"] == 0
    assert plugin["warmup"]["graphs_compiled"] == plugin["plan"]["step_shapes"]
    assert plugin["kv_cache_within_budget"] and plugin["kv_cache_fraction_of_budget"] >= 0.8
    assert plugin["padding_overhead"] >= 1.0


def test_the_decode_floor_reads_about_what_the_requests_hold():
    floor = _load().decode_floor()
    assert 16 <= floor["tokens_held"][0] and floor["tokens_held"][1] <= 1000
    assert floor["read_over_held"]["kernel"] <= 1.25 < 3 < floor["read_over_held"]["gather"]
    for chip in ("v5e", "v6e", "v5p", "TPU7x"):
        speeds = floor["tokens_per_second"][chip]
        assert speeds["held"] >= speeds["kernel"] > speeds["gather"]


def test_vllms_published_figure_sits_under_the_roofline_of_its_workload():
    bench = _load()
    comparison = bench.published_comparison()
    roof = comparison["roofline_tokens_per_second"]
    assert roof["held"] >= roof["kernel"] > roof["gather"]
    # a measured figure above a roofline would mean the roofline undercounts the bytes of a step
    assert comparison["published"]["output_tokens_per_second"] < comparison["at_decode_bandwidth_share"]["kernel"]
    assert 0.3 < comparison["published_over_kernel_roofline"] < 1
    # per chip: an eighth of the weights and one key-value head of eight
    assert comparison["per_chip"]["weight_bytes"] == bench.LLAMA_3_70B["weight_bytes"] // 8
    one_chip = bench.published_comparison(dict(bench.VLLM_TPU_PUBLISHED, chips=1))
    assert one_chip["per_chip"]["kv_bytes_per_decode_step"]["held"] == 8 * comparison["per_chip"]["kv_bytes_per_decode_step"]["held"]


def test_the_readme_quotes_the_published_comparison():
    comparison = _load().published_comparison()
    readme = (BENCH.parent / "README.md").read_text()
    rows = {"held (the floor)": "held", "JAX ragged paged attention kernel": "kernel", "plain-PyTorch `max_len` gather": "gather"}
    table = readme[readme.index("| Llama-3.3-70B, v6e-8"):]
    for label, key in rows.items():
        cells = [c.strip() for c in next(line for line in table.splitlines() if line.startswith(f"| {label}")).strip("|").split("|")]
        gb = comparison["per_chip"]["kv_bytes_per_decode_step"][key] / 1e9
        assert cells[1] == f"{gb:.2f} GB", (label, cells)
        assert cells[2] == f"{comparison['roofline_tokens_per_second'][key]:,.0f}", (label, cells)
        assert cells[3] == f"{comparison['at_decode_bandwidth_share'][key]:,.0f}", (label, cells)
    share = round(100 * comparison["published_over_kernel_roofline"])
    assert f"**2,495** ({share}% of the kernel's roofline)" in table
