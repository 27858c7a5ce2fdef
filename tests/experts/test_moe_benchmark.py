"""benchmarks/bench_moe.py --quick: the plugin side reads the floor per decode step, the plain side more, both
with the CPU's tokens and nothing compiled by a second call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("jax.experimental.pallas.ops.tpu.megablox")

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "bench_moe.py"


def test_the_quick_benchmark_reads_the_selected_experts_once(tmp_path):
    out = tmp_path / "moe.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--output", str(out)], capture_output=True, text=True,
                          timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    sides = json.loads(out.read_text())["sides"]
    for side in ("plain", "plugin"):
        for arch, result in sides[side].items():
            assert result["tokens_match_cpu"] and result["programs_second_call"] == 0, (side, arch)
    for arch, result in sides["plugin"].items():
        assert result["decode_read_over_floor"] <= 1.25, arch
        assert result["decode_read_over_floor"] < sides["plain"][arch]["decode_read_over_floor"], arch
