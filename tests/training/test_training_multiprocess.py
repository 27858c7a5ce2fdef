"""Training on 2 and 4 simulated chips under ``transformers-tpu launch``: plain Trainer code.

One launch per process count runs every scenario in ``tests/training/training_worker.py``; each rank writes
what it saw. The one-process reference with the same global batch (4) runs in this process, on the
simulated TPU. The generation is v5p (process counts 1, 2, 4, 8).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import _training  # noqa: E402

pytestmark = [pytest.mark.slow, _training.requires_trainer]

WORKER = Path(__file__).with_name("training_worker.py")
TOLERANCE = 1e-3
GLOBAL_BATCH = 4
SAVE = dict(max_steps=8, save_strategy="steps", save_steps=4)
FSDP2 = hasattr(pytest.importorskip("accelerate.accelerator"), "fsdp2_prepare_model")


def _fsdp(version: int) -> dict:
    return {"fsdp": "full_shard", "fsdp_config": {"version": version, "transformer_layer_cls_to_wrap": ["Qwen3DecoderLayer"]}}


def _launch(root: Path, nproc: int, scenarios: list[dict]) -> list[dict]:
    spec = root / "spec.json"
    spec.write_text(json.dumps({"out": str(root), "scenarios": scenarios}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    env.update(
        TRANSFORMERS_TPU_EXT_SIMULATE="generation=v5p", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore",
    )
    command = [sys.executable, "-m", "transformers_tpu_ext.launch", f"--nproc_per_node={nproc}", str(WORKER), str(spec)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads((root / f"rank{rank}.json").read_text()) for rank in range(nproc)]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[str, list[float]]:
    """The same runs in one process with the whole global batch, on one simulated chip."""
    from transformers_tpu_ext import testing

    testing.install()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        references = {}
        for name, steps in (("ddp", _training.STEPS), ("fsdp2", 6)):
            run = _training.trainer(str(tmp_path_factory.mktemp(name)), use_cpu=False, max_steps=steps)
            run.train()
            references[name] = _training.losses(run)
        return references
    finally:
        torch.set_num_threads(threads)
        _training.reset_accelerate()


def _check_ddp(ranks: list[dict], reference: list[float]) -> None:
    for rank in ranks:
        assert rank["device"] == rank["accelerator_device"] == "tpu:0" and rank["params_on_tpu"]
        assert (rank["distributed_type"], rank["backend"], rank["wrapper"]) == (
            "MULTI_GPU", "tpu_dist", "DistributedDataParallel",
        )
        assert rank["world"] == len(ranks)
    assert len({rank["digest"] for rank in ranks}) == 1  # identical parameters on every rank
    assert ranks[0]["losses"] == ranks[-1]["losses"]
    assert _training.max_diff(ranks[0]["losses"], reference) < TOLERANCE


def _check_fsdp2(fsdp: list[dict], reference: list[float]) -> None:
    assert all(r["distributed_type"] == "FSDP" and r["wrapper"].startswith("FSDP") for r in fsdp)
    assert len({r["digest"] for r in fsdp}) == 1
    assert _training.max_diff(fsdp[0]["losses"], reference) < TOLERANCE


def test_two_chips_ddp_fsdp2_and_symmetric_saving(tmp_path, one_process):
    per_device = GLOBAL_BATCH // 2
    ranks = _launch(
        tmp_path,
        2,
        [
            {"name": "ddp", "settings": {"per_device_train_batch_size": per_device}},
            *([{"name": "fsdp2", "settings": {"per_device_train_batch_size": per_device, "max_steps": 6, **_fsdp(2)}}]
              if FSDP2 else []),
            {"name": "fsdp1", "settings": {"per_device_train_batch_size": per_device, **_fsdp(1)}, "expect_error": True},
            {"name": "save", "settings": {"per_device_train_batch_size": per_device, **SAVE}},
            {"name": "warmup", "settings": {"per_device_train_batch_size": per_device}, "warmup": 120},
        ],
    )
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
        assert {p.name for p in (tmp_path / "save" / f"checkpoint-{step}").glob("tpu_state_*.pth")} == {
            "tpu_state_0.pth", "tpu_state_1.pth",
        }


def test_four_chips_ddp(tmp_path, one_process):
    ranks = _launch(tmp_path, 4, [{"name": "ddp", "settings": {"per_device_train_batch_size": GLOBAL_BATCH // 4}}])
    _check_ddp([r["ddp"] for r in ranks], one_process["ddp"])
