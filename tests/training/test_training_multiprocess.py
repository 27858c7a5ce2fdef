"""Training on several simulated chips under ``transformers-tpu launch``: plain Trainer and Accelerate code.

One launch per process count (2 and 4 chips) runs every scenario in ``tests/training/training_worker.py``;
each rank writes what it saw. Two launchers started as two hosts of one slice make a third world of
4 ranks. The one-process references with the same global batch run in this process, on the
simulated TPU. The generation is v5p (process counts 1, 2, 4, 8).

The simulated ``tpu_dist`` group refuses the collectives torch_tpu's process group lacks (``reduce``,
``allreduce_coalesced``, ``allgather_coalesced``), so DDP, FSDP2, evaluation and the gathers here run
on what a chip offers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import _training  # noqa: E402

pytestmark = [pytest.mark.slow, _training.requires_trainer]

WORKER = Path(__file__).with_name("training_worker.py")
TOLERANCE = 1e-3
GLOBAL_BATCH = 4
EVAL_BATCH = 2  # per device: the one-process reference evaluates batches of the same rows
SAVE = dict(max_steps=8, save_strategy="steps", save_steps=4)
FSDP2 = hasattr(pytest.importorskip("accelerate.accelerator"), "fsdp2_prepare_model")


def _fsdp(version: int) -> dict:
    return {"fsdp": "full_shard", "fsdp_config": {"version": version, "transformer_layer_cls_to_wrap": ["Qwen3DecoderLayer"]}}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_TPU_EXT_", "PET_", "TORCH_TPU_"))}
    for name in ("NODE_RANK", "JOB_COMPLETION_INDEX", "TPU_WORKER_HOSTNAMES", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(
        TRANSFORMERS_TPU_EXT_SIMULATE="generation=v5p", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore",
    )
    env.update(extra)
    return env


def _launch(root: Path, nproc: int, scenarios: list[dict]) -> list[dict]:
    spec = root / "spec.json"
    spec.write_text(json.dumps({"out": str(root), "scenarios": scenarios}))
    command = [sys.executable, "-m", "transformers_tpu_ext.launch", f"--nproc_per_node={nproc}", str(WORKER), str(spec)]
    proc = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=900, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads((root / f"rank{rank}.json").read_text()) for rank in range(nproc)]


def _ok(result: dict) -> dict:
    assert result.get("error") is None, result.get("trace", result.get("error"))
    return result


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    """The same runs in one process with the whole global batch, on one simulated chip; and
    ``evaluate()`` / ``predict()`` with the per-device evaluation batch (one process:
    ``average_tokens_across_devices`` changes nothing)."""
    from transformers_tpu_ext import testing
    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset

    testing.install()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        references = {}
        for name, steps in (("ddp", _training.STEPS), ("fsdp2", 6), ("ddp8", 8)):
            run = _training.trainer(str(tmp_path_factory.mktemp(name)), use_cpu=False, max_steps=steps)
            run.train()
            references[name] = _training.losses(run)
        run = _training.trainer(
            str(tmp_path_factory.mktemp("eval")), use_cpu=False, eval_data=tiny_lm_dataset(10, seed=5),
            per_device_eval_batch_size=EVAL_BATCH,
        )
        references["eval_loss"] = run.evaluate()["eval_loss"]
        references["predict_loss"] = run.predict(tiny_lm_dataset(10, seed=5)).metrics["test_loss"]
        return references
    finally:
        torch.set_num_threads(threads)
        _training.reset_accelerate()


def _check_ddp(ranks: list[dict], reference: list[float]) -> None:
    for rank in map(_ok, ranks):
        assert rank["device"] == rank["accelerator_device"] == "tpu:0" and rank["params_on_tpu"]
        assert (rank["distributed_type"], rank["backend"], rank["wrapper"]) == (
            "MULTI_GPU", "tpu_dist", "DistributedDataParallel",
        )
        assert rank["world"] == len(ranks)
    assert len({rank["digest"] for rank in ranks}) == 1  # identical parameters on every rank
    assert ranks[0]["losses"] == ranks[-1]["losses"]
    assert _training.max_diff(ranks[0]["losses"], reference) < TOLERANCE


def _check_fsdp2(fsdp: list[dict], reference: list[float]) -> None:
    assert all(_ok(r)["distributed_type"] == "FSDP" and r["wrapper"].startswith("FSDP") for r in fsdp)
    assert len({r["digest"] for r in fsdp}) == 1
    assert _training.max_diff(fsdp[0]["losses"], reference) < TOLERANCE


# -- evaluation and gathers (item 9), on 2 and 4 chips -------------------------------------------

EVALUATION = [
    {"name": "gather", "kind": "gather", "rows": 9, "batch_size": 2},
    # Transformers' default: each rank's loss is scaled by the token count of the whole global batch,
    # duplicated rows of the partial last batch included (upstream's own weighting, the same on any
    # device): checked for running and agreeing across ranks only.
    {"name": "evaluate", "kind": "evaluate", "settings": {"per_device_eval_batch_size": EVAL_BATCH}},
    # Per-batch mean losses: exactly what one process evaluating the same batches reports.
    {"name": "evaluate_local", "kind": "evaluate",
     "settings": {"per_device_eval_batch_size": EVAL_BATCH, "average_tokens_across_devices": False}},
]


def _check_gather(ranks: list[dict]) -> None:
    for rank in ranks:
        result = _ok(rank["gather"])
        assert (result["distributed_type"], result["backend"]) == ("MULTI_GPU", "tpu_dist")
        # every rank sees every row once, in the loader's order; the duplicated rows of the partial
        # last global batch are dropped (9 rows)
        assert result["ids"] == result["expected_ids"]
        assert result["index"] == [float(row[0]) for row in result["ids"]]
        assert result["logits"] == [[[float(x), -float(x)] for x in row] for row in result["ids"]]


def _check_evaluate(ranks: list[dict], reference: dict) -> None:
    for name in ("evaluate", "evaluate_local"):
        for rank in ranks:
            result = _ok(rank[name])
            assert result["world"] == len(ranks)
            assert result["prediction_rows"] == result["label_rows"] == 10
        assert len({(r[name]["eval_loss"], r[name]["predict_loss"]) for r in ranks}) == 1
    local = ranks[0]["evaluate_local"]
    assert abs(local["eval_loss"] - reference["eval_loss"]) < 1e-4
    assert abs(local["predict_loss"] - reference["predict_loss"]) < 1e-4


# -- replicas nothing synchronises (item 10) -------------------------------------------------------

REPLICAS = [
    {"name": "manual_model", "kind": "replicas"},
    {"name": "manual_model_raw_optimizer", "kind": "replicas", "prepare_optimizer": False},
    {"name": "prepared_model", "kind": "replicas", "prepare_model": True},
]


@pytest.fixture(scope="module")
def two_chips(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("two")
    per_device = GLOBAL_BATCH // 2
    return root, _launch(
        root,
        2,
        [
            {"name": "ddp", "settings": {"per_device_train_batch_size": per_device}},
            *([{"name": "fsdp2", "settings": {"per_device_train_batch_size": per_device, "max_steps": 6, **FSDP2_SAVE, **_fsdp(2)}}]
              if FSDP2 else []),
            {"name": "fsdp1", "settings": {"per_device_train_batch_size": per_device, **_fsdp(1)}, "expect_error": True},
            {"name": "save", "settings": {"per_device_train_batch_size": per_device, **SAVE}},
            {"name": "warmup", "settings": {"per_device_train_batch_size": per_device}, "warmup": 120},
            *EVALUATION,
            *REPLICAS,
            UNUSED,
        ],
    )


#: A model with a parameter one rank uses in each step and one no rank uses (``_training.gated_model``):
#: DDP trains it only with ``find_unused_parameters=True`` (tests/training/test_training.py shows the
#: reducer's error without it).
UNUSED = {"name": "unused", "model": "gated",
          "settings": {"per_device_train_batch_size": GLOBAL_BATCH // 2, "max_steps": 6, "ddp_find_unused_parameters": True}}


@pytest.fixture(scope="module")
def cpu_two_processes(tmp_path_factory) -> list[dict]:
    """``UNUSED`` in two CPU processes under torchrun (gloo), without the simulator: the reference."""
    root = tmp_path_factory.mktemp("cpu_two")
    spec = root / "spec.json"
    spec.write_text(json.dumps({"out": str(root), "scenarios": [{**UNUSED, "use_cpu": True}]}))
    env = _env()
    env.pop("TRANSFORMERS_TPU_EXT_SIMULATE")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(WORKER), str(spec)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads((root / f"rank{rank}.json").read_text()) for rank in range(2)]


#: The two-chip FSDP2 run saves at step 3 and 6; the four-chip run resumes it from step 3.
FSDP2_SAVE = dict(save_strategy="steps", save_steps=3)


@pytest.fixture(scope="module")
def four_chips(tmp_path_factory, two_chips) -> list[dict]:
    root = tmp_path_factory.mktemp("four")
    resume = [
        {"name": "fsdp2_resume", "resume": str(two_chips[0] / "fsdp2" / "checkpoint-3"),
         "settings": {"per_device_train_batch_size": GLOBAL_BATCH // 4, "max_steps": 6, "save_strategy": "no", **_fsdp(2)}}
    ] if FSDP2 else []
    return _launch(root, 4, [{"name": "ddp", "settings": {"per_device_train_batch_size": GLOBAL_BATCH // 4}}, *EVALUATION, *resume])


def test_two_chips_ddp_fsdp2_and_symmetric_saving(two_chips, one_process):
    root, ranks = two_chips
    _check_ddp([r["ddp"] for r in ranks], one_process["ddp"])
    # warmup() on every rank: the DDP run compiles nothing during training and its losses are unchanged
    _check_ddp([r["warmup"] for r in ranks], one_process["ddp"])
    assert all(r["warmup"]["programs_per_step"] == [0] * _training.STEPS for r in ranks)

    if FSDP2:  # Accelerate offers FSDP2 from 1.6
        _check_fsdp2([r["fsdp2"] for r in ranks], one_process["fsdp2"])
    assert all("FSDP1" in r["fsdp1"]["error"] and "FSDP2" in r["fsdp1"]["error"] for r in ranks)

    # Host reads: every rank logs the same gathered loss, and before each checkpoint every rank
    # synchronises its chip at the same point (what only the main process reads comes after).
    saving = [r["save"] for r in ranks]
    assert saving[0]["losses"] == saving[1]["losses"] and len(saving[0]["losses"]) == SAVE["max_steps"]
    assert saving[0]["synchronizations"] == saving[1]["synchronizations"] >= 2 * 2  # 2 checkpoints
    for step in (4, 8):
        checkpoint = root / "save" / f"checkpoint-{step}"
        assert {p.name for p in checkpoint.glob("tpu_state_*.pth")} == {"tpu_state_0.pth", "tpu_state_1.pth"}
        assert {p.name for p in checkpoint.glob("tpu_buckets_*.json")} == {"tpu_buckets_0.json", "tpu_buckets_1.json"}


def test_ddp_find_unused_parameters_on_two_chips_matches_two_cpu_processes(two_chips, cpu_two_processes):
    """``ddp_find_unused_parameters=True``: a model some steps and ranks leave a parameter unused in
    trains on two simulated chips, as torch_tpu's DDP does, with the losses and parameters of the same
    run in two CPU processes over gloo."""
    tpu = [_ok(rank["unused"]) for rank in two_chips[1]]
    cpu = [_ok(rank["unused"]) for rank in cpu_two_processes]
    assert all(r["wrapper"] == "DistributedDataParallel" and r["backend"] == "tpu_dist" and r["params_on_tpu"] for r in tpu)
    assert all(r["wrapper"] == "DistributedDataParallel" and r["backend"] == "gloo" for r in cpu)
    assert len({r["digest"] for r in tpu}) == 1 and len(tpu[0]["losses"]) == UNUSED["settings"]["max_steps"]
    assert _training.max_diff(tpu[0]["losses"], cpu[0]["losses"]) < TOLERANCE
    assert tpu[0]["unused_grads"] == cpu[0]["unused_grads"] == {"gate": True, "never": False}


def test_four_chips_ddp(four_chips, one_process):
    _check_ddp([r["ddp"] for r in four_chips], one_process["ddp"])


@pytest.mark.skipif(not FSDP2, reason="FSDP2 needs Accelerate >= 1.6")
def test_fsdp2_checkpoints_are_plain_safetensors_and_resume_on_four_chips(two_chips, four_chips):
    """An FSDP2 checkpoint of two chips holds the full model as plain Hugging Face safetensors
    (loadable on the CPU by Transformers alone, equal to the trained parameters), and a run on
    four chips resumes it, continuing the two-chip run's losses."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    root, ranks = two_chips
    trained = _ok(ranks[0]["fsdp2"])
    checkpoint = root / "fsdp2" / "checkpoint-6"
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as weights:  # full tensors, no DTensor shards
        shapes = {k: tuple(weights.get_slice(k).get_shape()) for k in weights.keys()}
    model = AutoModelForCausalLM.from_pretrained(checkpoint, device_map="cpu")
    assert {k: tuple(v.shape) for k, v in model.state_dict().items() if k in shapes} == shapes
    assert model.device.type == "cpu" and _worker().parameter_digest(model) == trained["digest"]

    resumed = [_ok(r["fsdp2_resume"]) for r in four_chips]
    assert all(r["world"] == 4 and r["wrapper"].startswith("FSDP") for r in resumed)
    assert len({r["digest"] for r in resumed}) == 1
    # steps 4..6 (the log history holds steps 1..3 from the checkpoint)
    assert _training.max_diff(resumed[0]["losses"][3:], trained["losses"][3:]) < TOLERANCE


def _worker():
    import importlib

    return importlib.import_module("training_worker")


def test_gather_for_metrics_of_2d_and_3d_tensors_on_two_chips(two_chips):
    _check_gather(two_chips[1])


def test_gather_for_metrics_of_2d_and_3d_tensors_on_four_chips(four_chips):
    _check_gather(four_chips)


def test_trainer_evaluate_and_predict_on_two_chips_match_one_process(two_chips, one_process):
    _check_evaluate(two_chips[1], one_process)


def test_trainer_evaluate_and_predict_on_four_chips_match_one_process(four_chips, one_process):
    _check_evaluate(four_chips, one_process)


@pytest.mark.parametrize("scenario", ["manual_model", "manual_model_raw_optimizer"])
def test_a_model_moved_by_hand_never_trains_diverging_replicas(two_chips, scenario):
    """Only the optimizer and the loader (or only the loader) prepared: refused before the first
    update, on every rank, with what to do; the replicas never differ."""
    results = [rank[scenario] for rank in two_chips[1]]
    assert all(r["error"] and "unsynchronised replicas" in r["error"] and "prepare" in r["error"] for r in results), [
        r.get("trace", r["error"]) for r in results
    ]
    assert all(r["steps"] == 0 for r in results)
    assert len({r["digest"] for r in results}) == 1


def test_a_prepared_model_trains_identical_replicas(two_chips):
    """The control: ``prepare(model, optimizer, loader)`` trains without a refusal."""
    results = [rank["prepared_model"] for rank in two_chips[1]]
    assert all(r["error"] is None and r["steps"] == 3 for r in results), [r.get("trace", r["error"]) for r in results]
    assert len({r["digest"] for r in results}) == 1


# -- two hosts ---------------------------------------------------------------------------------------

HOSTS, PER_HOST = 2, 2
WORLD = HOSTS * PER_HOST
DDP_STEPS, FSDP_STEPS = 8, 6
TWO_HOSTS = [
    {"name": "ddp", "output_dir": "ddp",
     "settings": {"per_device_train_batch_size": GLOBAL_BATCH // WORLD, "max_steps": DDP_STEPS,
                  "save_strategy": "steps", "save_steps": DDP_STEPS // 2}},
    *([{"name": "fsdp2", "output_dir": "fsdp2",
        "settings": {"per_device_train_batch_size": GLOBAL_BATCH // WORLD, "max_steps": FSDP_STEPS, **_fsdp(2)}}]
      if FSDP2 else []),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_two_hosts(root: Path, timeout: float = 1500) -> list[dict]:
    """The same command on both hosts but for ``NODE_RANK``, each in its own directory (its local
    disk), with its own simulated chips, ``TPU_WORKER_HOSTNAMES`` listing both; the rendezvous on
    127.0.0.1. A launcher that fails makes this stop the other (it would wait for its peer until
    the rendezvous times out)."""
    spec = root / "spec.json"
    spec.write_text(json.dumps({"out": str(root), "scenarios": TWO_HOSTS}))
    port = _free_port()
    procs = []
    for node in range(HOSTS):
        host_dir = root / f"host{node}"
        host_dir.mkdir()
        env = _env(
            TRANSFORMERS_TPU_EXT_SIMULATE="chips=4,generation=v5p", TPU_WORKER_HOSTNAMES="127.0.0.1,localhost",
            NODE_RANK=str(node),
        )
        command = [
            sys.executable, "-m", "transformers_tpu_ext.launch", f"--nnodes={HOSTS}", f"--nproc_per_node={PER_HOST}",
            "--master_addr=127.0.0.1", f"--master_port={port}", str(WORKER), str(spec),
        ]
        procs.append(subprocess.Popen(command, cwd=host_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        outputs = [p.communicate(timeout=60)[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [0] * HOSTS, "\n".join(f"host{i} exit {c}:\n{o[-4000:]}" for i, (c, o) in enumerate(zip(codes, outputs)))
    return [json.loads((root / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory) -> tuple[Path, list[dict] | AssertionError]:
    """The two-host launch, once for the module; a failed launch fails each test (not an error)."""
    root = tmp_path_factory.mktemp("two_hosts")
    try:
        return root, _launch_two_hosts(root)
    except AssertionError as failure:
        return root, failure


def _hosts(two_hosts) -> tuple[Path, list[dict]]:
    root, ranks = two_hosts
    assert not isinstance(ranks, AssertionError), f"the two-host launch failed: {ranks}"
    return root, ranks


def test_two_hosts_make_one_world_of_four_ranks(two_hosts):
    _, ranks = _hosts(two_hosts)
    assert [r["world_size"] for r in ranks] == [WORLD] * WORLD
    ddp = [_ok(r["ddp"]) for r in ranks]
    assert [r["process_index"] for r in ddp] == list(range(WORLD))
    # the host a rank runs on is the one its NODE_RANK names (ranks 0-1 on host 0, 2-3 on host 1)
    assert [r["node_rank"] for r in ddp] == [str(rank // PER_HOST) for rank in range(WORLD)]


def test_two_hosts_ddp_matches_one_process_with_identical_replicas(two_hosts, one_process):
    _, ranks = _hosts(two_hosts)
    _check_ddp([r["ddp"] for r in ranks], one_process["ddp8"])


@pytest.mark.skipif(not FSDP2, reason="FSDP2 needs Accelerate >= 1.6")
def test_two_hosts_fsdp2_matches_one_process_with_identical_parameters(two_hosts, one_process):
    _, ranks = _hosts(two_hosts)
    _check_fsdp2([r["fsdp2"] for r in ranks], one_process["fsdp2"])


def test_a_two_host_checkpoint_resumes_on_one_host(two_hosts, tmp_path):
    """Host 0's disk holds the checkpoint the main process wrote (host 1's only its ranks' random
    states); a one-process run with the global batch resumes it and continues the two-host run's
    losses."""
    root, ranks = _hosts(two_hosts)
    step = DDP_STEPS // 2
    checkpoint = root / "host0" / "ddp" / f"checkpoint-{step}"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "optimizer.pt").is_file()
    assert {p.name for p in (root / "host1" / "ddp" / f"checkpoint-{step}").glob("tpu_*")} == {
        "tpu_state_2.pth", "tpu_state_3.pth", "tpu_buckets_2.json", "tpu_buckets_3.json",
    }
    from transformers_tpu_ext import testing
    from transformers_tpu_ext.testing.tiny import tiny_model

    testing.install()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        resumed = _training.trainer(str(tmp_path / "resumed"), use_cpu=False, model=tiny_model("qwen3", seed=1),
                                    max_steps=DDP_STEPS, per_device_train_batch_size=GLOBAL_BATCH)
        resumed.train(resume_from_checkpoint=str(checkpoint))
        assert len(_training.losses(resumed)) == DDP_STEPS  # the checkpoint's log history, then its own
        assert _training.max_diff(_training.losses(resumed)[step:], ranks[0]["ddp"]["losses"][step:]) < TOLERANCE
    finally:
        torch.set_num_threads(threads)
        _training.reset_accelerate()
