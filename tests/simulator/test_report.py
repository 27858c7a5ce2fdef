"""The simulated TPU's report to other processes (``testing/report.py``, ``TRANSFORMERS_TPU_EXT_SIMULATE_REPORT``).

Transformers 5.25's ``transformers serve`` runs the model in a spawned process: a test that counted
``sim.counters()`` in its own process saw none of what that process compiled (it could not fail).
Here a parent spawns a child (``multiprocessing``'s "spawn", as ``transformers serve`` does) that
compiles a graph and runs eager operations on the simulated TPU; each process's report says what it
compiled itself, and the plugin's patch states there.
"""

from __future__ import annotations

import os
import subprocess
import sys

from transformers_tpu_ext.testing import report

CODE = """
import multiprocessing, sys
import torch

def child(compile_twice):
    step = torch.compile(lambda x: x * 2 + 1, backend="tpu")
    x = torch.ones(4, device="tpu")
    step(x)
    if compile_twice:
        step(torch.ones(8, device="tpu"))
    (x + 1).cpu()

if __name__ == "__main__":
    process = multiprocessing.get_context("spawn").Process(target=child, args=(True,), name="model")
    process.start()
    process.join(120)
    sys.exit(process.exitcode)
"""


def test_each_process_reports_what_it_compiled(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    env.update(TRANSFORMERS_TPU_EXT_SIMULATE="chips=1", TRANSFORMERS_TPU_EXT_SIMULATE_REPORT=str(tmp_path / "reports"))
    script = tmp_path / "spawning.py"
    script.write_text(CODE)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reports = {r["process"]: r for r in report.read(tmp_path / "reports")}
    assert set(reports) == {"MainProcess", "model"}
    parent, child = reports["MainProcess"], reports["model"]
    assert child["parent"] == parent["pid"]
    assert parent["counters"]["programs"] == 0 and parent["written"] == "exit"
    assert child["counters"]["graphs_compiled"] == 2  # two shapes: two programs, counted where they compiled
    assert child["counters"]["eager_programs"] >= 1 and child["counters"]["d2h_bytes"] == 16  # (x + 1).cpu()
    assert child["written"] == "exit"
    assert child["counters"]["programs"] == child["counters"]["graphs_compiled"] + child["counters"]["eager_programs"]
    assert child["patches"] and all(state in {"applied", "armed", "skipped", "disabled"} for state in child["patches"].values())


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(report.REPORT_ENV, raising=False)
    monkeypatch.setattr(report, "_directory", [])
    monkeypatch.setattr(report, "_counters", [])
    assert report.enable(dict) is None
    report.write()
    assert report.written() is None
