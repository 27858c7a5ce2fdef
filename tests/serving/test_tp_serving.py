"""Tensor-parallel continuous batching on simulated TPU chips (``serving.tensor_parallel``).

Two launches under ``transformers-tpu launch`` (the simulated TPU, each rank on its own chip, ``tpu_dist``):
a context-sensitive tiny Qwen3 of GLM-4's shape (8 query, 2 key-value heads) on 4 chips, its key-value
heads replicated by the plan rewrite, with the plain-PyTorch paged attention (head size 8); on 2 chips,
one of head size 128 sharded by Transformers' plan with JAX's ragged paged attention kernel, then one
of 3 key-value heads whose attention the plan rewrite replicates (skipped without JAX). On every rank (``tests/serving/tp_serving_worker.py``): the manager takes the TPU
path, its paged cache holds the rank's own key-value heads, mixed-length prompts (one prefilled in
chunks beside decodes) give the greedy tokens of plain single-process CPU Transformers, and nothing
compiles after the warm-up (cache-only mode). Without this path the manager ran Transformers' own,
which sizes its cache from host RAM on a TPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("tp_serving_worker.py")
ENV = {
    "TRANSFORMERS_TPU_EXT_SIMULATE": "generation=v5p",  # v5p topologies: 1, 2, 4, 8 chips per host
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "16",  # one step shape (16 tokens, 8 requests) to warm up,
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "8",
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN": "128",
    "TRANSFORMERS_TPU_EXT_SERVE_PAGE_SIZE": "8",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore",
    # JAX's CPU backend compiles the kernel's reference per shape: unoptimized, several times faster, same results
    "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
}


def _launch(tmp_path: Path, nproc: int, *configs: dict) -> list[list[dict]]:
    """Serve each tiny Qwen3 of ``configs`` on ``nproc`` chips in one launch: per model, each rank's result."""
    from transformers_tpu_ext.testing.tiny import save_tiny_model

    models = [str(save_tiny_model(tmp_path / f"model{i}", "qwen3", seed=0, **config)) for i, config in enumerate(configs)]
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    env.update(ENV)
    command = [sys.executable, "-m", "transformers_tpu_ext.launch", f"--nproc_per_node={nproc}", str(WORKER)]
    proc = subprocess.run([*command, str(out), *models], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [[json.loads(Path(f"{out}.{i}.rank{rank}.json").read_text()) for rank in range(nproc)] for i in range(len(models))]


def _served_like_cpu(results: list[dict], attention: str, kv_heads: int) -> None:
    for rank, result in enumerate(results):
        assert result["device"] == "tpu:0", rank
        assert result["attention"] == attention, rank
        assert result["kv_heads"] == kv_heads, rank  # the rank's own heads, not the model's
        assert result["tokens"] == result["expected"], rank
        assert result["programs"] == 0, rank  # and cache-only mode raised on none


def test_four_chips_serve_the_tokens_of_plain_cpu_transformers_with_replicated_kv_heads(tmp_path):
    # GLM-4's shape: 2 key-value heads on 4 chips, each replicated on 2 (the tp_plan_rewrite patch's plan;
    # Transformers' own manager refuses it: "Number of key value heads 2 must be divisible by ... 4").
    (results,) = _launch(tmp_path, 4, dict(num_attention_heads=8, num_key_value_heads=2, head_dim=8))
    _served_like_cpu(results, "paged", kv_heads=1)
    assert {result["k_proj"] for result in results} == {"kv_replicated_colwise"}


@pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="the kernel path needs JAX (transformers-tpu-ext[jax])"
)
def test_two_chips_run_the_ragged_kernel_on_their_own_heads_and_replicated_attention_whole(tmp_path):
    sharded, replicated = _launch(
        tmp_path,
        2,
        # Transformers' plan: query and key-value heads sharded (2 query heads and 1 key-value head per chip)
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=128, num_hidden_layers=1),
        # 3 key-value heads do not divide over 2 chips: the plan rewrite replicates the attention
        dict(num_attention_heads=6, num_key_value_heads=3, head_dim=8),
    )
    _served_like_cpu(sharded, "ragged", kv_heads=1)
    assert {result["k_proj"] for result in sharded} == {"colwise"}
    _served_like_cpu(replicated, "paged", kv_heads=3)
    assert {result["k_proj"] for result in replicated} == {"replicate"}
