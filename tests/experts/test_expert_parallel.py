"""Expert parallelism on simulated chips (issue 39): Transformers' expert-parallel plans
(``DistributedConfig(tp_size=N, ep_size=N)``: each chip holds ``experts / N`` whole experts, its own tokens' routes
to other chips' experts masked, the chips' outputs summed) under ``transformers-tpu launch``, each rank on its own
simulated chip over ``tpu_dist``: the logits of the unsharded model on one chip, and its greedy tokens, for
Mixtral, Qwen3-MoE, gpt-oss and DeepSeek-V3 on 2 and 4 chips, the experts through the grouped-matmul kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("jax.experimental.pallas.ops.tpu.megablox")

WORKER = Path(__file__).with_name("ep_worker.py")
ENV = {
    "TRANSFORMERS_TPU_EXT_SIMULATE": "generation=v5p",  # v5p topologies: 1, 2, 4, 8 chips per host
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore",
    "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
}
EXPERTS = {"mixtral": 4, "qwen3_moe": 8, "gpt_oss": 4, "deepseek_v3": 8}  # the tiny models' routed experts


def _launch(tmp_path: Path, nproc: int, archs: list[str]) -> dict[str, list[dict]]:
    from transformers_tpu_ext.testing.tiny import save_tiny_model

    models = [str(save_tiny_model(tmp_path / arch, arch)) for arch in archs]
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    env.update(ENV)
    command = [sys.executable, "-m", "transformers_tpu_ext.launch", f"--nproc_per_node={nproc}", str(WORKER)]
    proc = subprocess.run([*command, str(out), *models], env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return {arch: [json.loads(Path(f"{out}.{i}.rank{rank}.json").read_text()) for rank in range(nproc)]
            for i, arch in enumerate(archs)}


@pytest.mark.parametrize("nproc, archs", [(2, ["mixtral", "gpt_oss"]), (4, list(EXPERTS))])
def test_experts_across_chips_give_the_logits_and_tokens_of_one_chip(tmp_path, nproc, archs):
    for arch, ranks in _launch(tmp_path, nproc, archs).items():
        for rank, result in enumerate(ranks):
            where = f"{arch} rank {rank} of {nproc}"
            assert result["device"] == "tpu:0", where
            assert result["expert_parallel"] and result["local_experts"] == EXPERTS[arch] // nproc, where
            assert result["kernel_calls"] > 0, where  # the experts through JAX's grouped matmul
            assert result["logits_max_diff"] < 1e-4, where
            assert result["tokens"] == result["expected"], where
