"""``transformers-tpu selftest``: the battery on the simulated TPU, and how it reports a failing check.

The whole battery runs once, in a fresh interpreter as a user runs it (the command installs the
simulated TPU there, with the serving and generation settings it chooses), and every check must pass
or be skipped with a reason. The reporting is tested in-process with injected checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from transformers_tpu_ext.cli import selftest
from transformers_tpu_ext.cli.selftest import Check, Context, Skip

pytest.importorskip("transformers")


def _boom(ctx):
    raise RuntimeError("the chip caught fire")


def _wrong(ctx):
    assert [1, 2] == [1, 3], "tokens differ from the CPU at position 1: tpu [1, 2] vs cpu [1, 3]"


def _skipped(ctx):
    raise Skip("needs 2 chips")


INJECTED = [
    Check("passes", "a claim that holds", lambda ctx: {"x": 1}),
    Check("fails", "a claim that does not", _wrong),
    Check("errors", "a claim whose code raises", _boom),
    Check("skips", "a claim that cannot run here", _skipped),
]


def test_a_failing_check_is_reported_as_failed_with_the_difference(tmp_path):
    results = selftest.run_battery(INJECTED, Context(simulated=True, sim=None, tmp=str(tmp_path)))
    by = {r.name: r for r in results}
    assert by["passes"].status == "pass" and by["passes"].facts == {"x": 1}
    assert by["fails"].status == "fail" and "position 1" in by["fails"].detail
    assert by["errors"].status == "fail" and by["errors"].detail.startswith("RuntimeError: the chip caught fire (test_selftest.py:")
    assert by["skips"].status == "skip" and by["skips"].detail == "needs 2 chips"
    assert all(r.seconds >= 0 for r in results)


def test_main_exits_1_and_the_json_report_names_the_failure(simulated_tpu, tmp_path, capsys):
    path = tmp_path / "report.json"
    assert selftest.main(["--json", str(path)], checks=INJECTED) == 1
    out = capsys.readouterr().out
    assert "on the SIMULATED TPU" in out
    assert "FAIL  fails" in out and "SKIP  skips" in out and "needs 2 chips" in out
    assert "1 passed, 2 failed, 1 skipped" in out
    assert "timings on the simulated TPU are not meaningful" in out
    report = json.loads(path.read_text())
    assert report["simulated"] is True and report["device"] == "tpu (simulated)"
    assert report["summary"] == {"pass": 1, "fail": 2, "skip": 1}
    assert set(report["versions"]) == {"torch", "torch_tpu", "libtpu", "transformers", "accelerate"}
    assert report["versions"]["torch"]
    assert [c["status"] for c in report["checks"]] == ["pass", "fail", "fail", "skip"]
    assert report["cpu_seconds"] > 0 and "s of CPU) on tpu (simulated)" in out
    assert selftest.main([], checks=INJECTED[:1] + INJECTED[3:]) == 0


def test_list_only_and_usage(capsys):
    assert selftest.main(["--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    from transformers_tpu_ext.cli.selftest_checks import CHECKS

    assert listed == [c.name for c in CHECKS]
    assert selftest.main(["--only", "nope", "--list"]) == 2
    assert "unknown check(s) nope" in capsys.readouterr().err
    assert [c.name for c in selftest.select("trainer,ddp")] == ["trainer", "ddp"]


def test_the_cli_dispatches_selftest(capsys):
    from transformers_tpu_ext.cli import main

    assert main(["--help"]) == 0
    assert "selftest" in capsys.readouterr().out


@pytest.mark.slow
def test_the_battery_passes_on_the_simulated_tpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_TPU_EXT_", "TORCH_TPU_"))}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    path = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "transformers_tpu_ext.cli", "selftest", "--json", str(path)],
        capture_output=True, text=True, env=env, timeout=1800,  # minutes on an idle 2-core machine
    )
    report = json.loads(path.read_text())
    bad = [c for c in report["checks"] if c["status"] == "fail" or (c["status"] == "skip" and not c["detail"])]
    assert not bad, json.dumps(bad, indent=1) + proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0
    assert report["simulated"] is True and "SIMULATED" in proc.stdout
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    # What the simulator can check, it checks; what only a chip (or 2 processes) can, it skips.
    assert statuses == {
        "activation": "pass", "placement": "pass", "generate_qwen3": "pass", "generate_llama": "pass",
        "decode_bytes": "pass", "continuous_batching": "pass", "trainer": "pass", "ddp": "skip",
        "compile_cache": "pass", "int8_weights": "pass" if _torchao() else "skip", "int8_kv_cache": "pass",
        "decode_timing": "skip",
    }
    facts = {c["name"]: c["facts"] for c in report["checks"]}
    assert facts["generate_qwen3"]["steady_state_programs"] == 0 and facts["generate_qwen3"]["greedy_programs"] > 0
    assert facts["compile_cache"]["second"]["compiled"] == 0 and facts["compile_cache"]["second"]["loaded"] > 0
    # a check's CPU time counts the processes it starts (compile_cache's two interpreters)
    cpu = {c["name"]: c["cpu_seconds"] for c in report["checks"]}
    assert cpu["compile_cache"] > 1 and report["cpu_seconds"] >= sum(cpu.values())
    assert report["timings"] == {"note": selftest.NOT_MEANINGFUL}


def _torchao() -> bool:
    try:
        import torchao.quantization  # noqa: F401
    except ImportError:
        return False
    return True
