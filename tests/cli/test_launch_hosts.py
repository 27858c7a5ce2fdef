"""``transformers-tpu launch`` on a slice of several hosts: each host's node rank and the rendezvous.

torchrun reads ``--node_rank`` and defaults it to 0; a TPU VM says which host of the slice it is in
``NODE_RANK`` (torch_tpu's ``set_tpu_launch_env`` sets it from the chip coordinates). Without the
launcher passing one to the other, every host was node 0: the second host's agent failed to bind
the master port (``EADDRINUSE``). These checks stop before torchrun; the two-host run itself is in
``tests/training/test_training_multiprocess.py``.
"""

from __future__ import annotations

import os

import pytest

from transformers_tpu_ext.cli import launch
from transformers_tpu_ext.cli.launch import LaunchError, check_rendezvous, multi_host

HOSTS = {"TPU_WORKER_HOSTNAMES": "w-0,w-1"}


def test_one_host_keeps_torchruns_defaults():
    assert multi_host(1, node_rank=None, master_addr=None, master_port=None, environ={"NODE_RANK": "3"}) == (
        0, "127.0.0.1", launch._TORCHRUN_DEFAULTS["master_port"],
    )
    assert multi_host(1, node_rank=0, master_addr="h", master_port=1234, environ={}) == (0, "h", 1234)


@pytest.mark.parametrize("variable", ["NODE_RANK", "JOB_COMPLETION_INDEX"])
def test_the_node_rank_is_the_host_index_of_the_tpu_environment(variable):
    node, address, port = multi_host(2, node_rank=None, master_addr=None, master_port=None, environ={**HOSTS, variable: "1"})
    assert (node, address) == (1, "w-0")  # the first host of the slice serves the rendezvous
    assert port == launch._TORCHRUN_DEFAULTS["master_port"]


def test_master_address_and_port_from_the_environment_or_the_command_line():
    environ = {**HOSTS, "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "8476"}
    assert multi_host(2, node_rank=None, master_addr=None, master_port=None, environ=environ) == (0, "10.0.0.2", 8476)
    assert multi_host(2, node_rank=0, master_addr="127.0.0.1", master_port=1234, environ=environ) == (0, "127.0.0.1", 1234)


def test_a_node_rank_disagreeing_with_the_host_index_is_refused():
    with pytest.raises(LaunchError, match=r"--node_rank=0 disagrees with NODE_RANK=1"):
        multi_host(2, node_rank=0, master_addr=None, master_port=None, environ={**HOSTS, "NODE_RANK": "1"})


def test_no_host_index_is_refused_with_what_to_set():
    with pytest.raises(LaunchError, match="set NODE_RANK"):
        multi_host(2, node_rank=None, master_addr=None, master_port=None, environ=HOSTS)
    # given by hand where the environment says nothing: taken, if it names a host of the slice
    assert multi_host(2, node_rank=1, master_addr=None, master_port=None, environ=HOSTS)[0] == 1
    with pytest.raises(LaunchError, match="--node_rank=2 is not a host of --nnodes=2"):
        multi_host(2, node_rank=2, master_addr=None, master_port=None, environ=HOSTS)
    with pytest.raises(LaunchError, match="NODE_RANK='one' is not a host index"):
        multi_host(2, node_rank=None, master_addr=None, master_port=None, environ={**HOSTS, "NODE_RANK": "one"})


def test_a_rendezvous_that_numbers_hosts_by_arrival_is_refused_on_several_hosts():
    check_rendezvous(1, rdzv_backend="c10d", standalone=True)  # one host: nothing to order
    check_rendezvous(2, rdzv_backend="static", standalone=False)
    with pytest.raises(LaunchError, match="in the order they arrive"):
        check_rendezvous(2, rdzv_backend="c10d", standalone=False)
    with pytest.raises(LaunchError, match="drop --standalone"):
        check_rendezvous(2, rdzv_backend="static", standalone=True)


@pytest.fixture
def v5p_host(simulated_tpu, monkeypatch):
    for var in ("TPU_WORKER_HOSTNAMES", "NODE_RANK", "JOB_COMPLETION_INDEX", "NNODES", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    for var in [v for v in os.environ if v.startswith(("PET_", "TORCH_TPU_"))]:
        monkeypatch.delenv(var)
    simulated_tpu.configure(chips=4, generation="v5p")
    return monkeypatch


def test_prepare_hands_torchrun_the_node_rank_and_the_first_host(v5p_host, tmp_path):
    (tmp_path / "train.py").write_text("")
    v5p_host.setenv("TPU_WORKER_HOSTNAMES", "127.0.0.1,localhost")
    v5p_host.setenv("NODE_RANK", "1")
    args = launch._parser().parse_args(["--nnodes=2", "--nproc_per_node=2", str(tmp_path / "train.py")])
    assert launch.prepare(args) == (2, 2)
    assert (args.node_rank, args.master_addr) == (1, "127.0.0.1")


def test_a_host_without_its_index_stops_before_torchrun(v5p_host, tmp_path, capsys):
    (tmp_path / "train.py").write_text("")
    v5p_host.setenv("TPU_WORKER_HOSTNAMES", "127.0.0.1,localhost")
    rc = launch.main(["--nnodes=2", "--nproc_per_node=2", str(tmp_path / "train.py")])
    err = capsys.readouterr().err
    assert rc != 0 and "NODE_RANK" in err and "Traceback" not in err
