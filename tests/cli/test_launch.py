"""``transformers-tpu launch``: torchrun with the TPU launch environment, checked up front.

The end-to-end tests run the launcher in a subprocess with the simulated TPU installed through
``TRANSFORMERS_TPU_EXT_SIMULATE`` (so the workers torchrun starts have it too); the checks that
stop before torchrun run in-process on the ``simulated_tpu`` fixture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from transformers_tpu_ext.cli import launch

pytestmark = pytest.mark.slow

LAUNCH_VARS = ("TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_TOPOLOGY", "TORCH_TPU_XPROF_SESSION_ID")

WORKER = textwrap.dedent(
    """
    import json, os, sys
    import torch

    out = sys.argv[1]
    rank = os.environ["RANK"]
    record = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", *%r)}
    record["accelerator"] = torch.accelerator.current_accelerator().type
    # Transformers' distributed init binds the process' chip: tpu:0 on every rank, never local_rank.
    from transformers.distributed.utils import _bind_local_device
    record["bound"] = str(_bind_local_device("tpu", int(os.environ["LOCAL_RANK"])))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    """
    % (LAUNCH_VARS,)
)

# The parent: counts set_tpu_launch_env calls (and where they happen), then runs launch.main().
DRIVER = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from transformers_tpu_ext import launch

    calls = []
    original = torch.tpu.distributed.set_tpu_launch_env

    def counting(**kwargs):
        calls.append({"pid": os.getpid(), **kwargs})
        return original(**kwargs)

    torch.tpu.distributed.set_tpu_launch_env = counting
    rc = launch.main(sys.argv[1:])
    print("DRIVER " + json.dumps({"rc": rc, "calls": calls, "pid": os.getpid()}))
    """
)


def _env(spec: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCH_TPU_", "TPU_"))}
    env.pop("TRANSFORMERS_TPU_EXT_SIMULATE", None)
    env.pop("TRANSFORMERS_TPU_EXT_DISABLE", None)
    env["OMP_NUM_THREADS"] = "1"
    if spec:
        env["TRANSFORMERS_TPU_EXT_SIMULATE"] = spec
    return env


def _run(args: list[str], spec: str | None, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=_env(spec), cwd=cwd, capture_output=True, text=True, timeout=300)


def test_four_workers_get_ranks_and_the_tpu_launch_env_prepared_once_in_the_parent(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "driver.py").write_text(DRIVER)
    out = tmp_path / "out"
    out.mkdir()
    # No --nproc_per_node: it defaults to the 4 chips of the (simulated) host.
    proc = _run(
        [sys.executable, "driver.py", "--monitor-interval=0.1", "worker.py", str(out)],
        "chips=4,generation=v6e",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    driver = json.loads(proc.stdout.split("DRIVER ", 1)[1])
    assert driver["rc"] == 0
    assert driver["calls"] == [{"pid": driver["pid"], "nnodes": 1, "nproc_per_node": 4}]

    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["RANK"] for r in records] == ["0", "1", "2", "3"]
    assert {r["WORLD_SIZE"] for r in records} == {"4"}
    assert {r["accelerator"] for r in records} == {"tpu"}
    assert {r["bound"] for r in records} == {"tpu:0"}
    for var in LAUNCH_VARS:
        values = {r[var] for r in records}
        assert len(values) == 1 and None not in values and "" not in values, (var, values)


def test_two_workers_on_v6e_stop_before_torchrun_listing_the_supported_counts(tmp_path):
    (tmp_path / "worker.py").write_text("raise SystemExit('a worker must not start')\n")
    proc = _run(
        [sys.executable, "-m", "transformers_tpu_ext.cli", "launch", "--nproc_per_node=2", "worker.py"],
        "chips=4,generation=v6e",
        tmp_path,
    )
    assert proc.returncode != 0
    assert "1, 4, 8" in proc.stderr and "v6e" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "a worker must not start" not in proc.stderr


def test_no_tpu_backend_is_one_clear_message(tmp_path):
    (tmp_path / "x.py").write_text("")  # the arguments are right: the missing TPU is what is wrong
    proc = _run([sys.executable, "-m", "transformers_tpu_ext.launch", "--nproc_per_node=4", "x.py"], None, tmp_path)
    assert proc.returncode == 1
    assert "No TPU backend found" in proc.stderr and "torch_tpu" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- in-process checks (they stop before torchrun) ----------------------------------------


def _launch(capsys, *argv: str) -> tuple[int, str]:
    rc = launch.main(list(argv))
    return rc, capsys.readouterr().err


@pytest.fixture
def in_script_dir(tmp_path, monkeypatch):
    """A working directory holding ``train.py`` (the script is checked before the chip)."""
    (tmp_path / "train.py").write_text("raise SystemExit('a worker must not start')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def v7_host(simulated_tpu, monkeypatch, in_script_dir):
    for var in ("TPU_WORKER_HOSTNAMES", "PET_NPROC_PER_NODE", "PET_NNODES", *LAUNCH_VARS):
        monkeypatch.delenv(var, raising=False)
    simulated_tpu.configure(chips=8, generation="v7")
    return simulated_tpu


def test_v7_rejects_one_process_and_lists_2_4_8(v7_host, capsys):
    rc, err = _launch(capsys, "--nproc_per_node=1", "train.py")
    assert rc == 2
    assert "v7" in err and "2, 4, 8" in err


def test_more_processes_than_chips_is_refused(v7_host, capsys):
    rc, err = _launch(capsys, "--nproc_per_node=16", "train.py")
    assert rc == 2 and "8 TPU chips" in err and "at most 8" in err


def test_nnodes_disagreeing_with_tpu_worker_hostnames(v7_host, capsys, monkeypatch):
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "w-0,w-1,w-2,w-3")
    rc, err = _launch(capsys, "--nnodes=2", "--nproc_per_node=4", "train.py")
    assert rc == 2
    assert "--nnodes=2" in err and "TPU_WORKER_HOSTNAMES" in err and "--nnodes=4" in err
    assert "TORCH_TPU_TOPOLOGY" not in os.environ  # nothing prepared


def test_multi_host_needs_tpu_worker_hostnames(v7_host, capsys):
    rc, err = _launch(capsys, "--nnodes=2", "train.py")
    assert rc == 2 and "needs TPU_WORKER_HOSTNAMES" in err


def test_elastic_node_range_is_refused(v7_host, capsys):
    rc, err = _launch(capsys, "--nnodes=1:2", "train.py")
    assert rc == 2 and "fixed number of hosts" in err


def test_hidden_tpu_is_reported_as_no_backend(v7_host, capsys):
    with v7_host.hidden():
        rc, err = _launch(capsys, "train.py")
    assert rc == 1 and "No TPU backend found" in err


def test_a_chip_the_backend_cannot_name_is_one_line_not_a_traceback(simulated_tpu, capsys, in_script_dir):
    # TRANSFORMERS_TPU_EXT_SIMULATE=generation=v99 (docs/simulated-tpu.md allows it): torch.tpu.get_device_name()
    # raises, as torch_tpu does for a chip it does not know.
    simulated_tpu.configure(chips=4, generation="v99")
    rc, err = _launch(capsys, "--nproc_per_node=4", "train.py")
    assert rc == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("transformers-tpu launch: error:"), err
    assert "v99" in err and "torch_tpu" in err
