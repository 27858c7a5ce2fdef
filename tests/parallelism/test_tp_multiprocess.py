"""Tensor parallelism end to end on CPU: torchrun, gloo, tiny models saved to a temporary directory.

Two launches (4 ranks, then 2 ranks) run every case through ``tests/parallelism/tp_worker.py``; each rank compares
the sharded model's logits and greedy ``generate()`` tokens with the unsharded model's. There is no TPU
here, so the workers run with ``TRANSFORMERS_TPU_EXT_TP_REWRITE=always``, the documented opt-in for
CPU/GPU clusters (the default, ``auto``, rewrites on TPU only: ``test_tp_launch_e2e.py``). Without the
``tp_plan_rewrite`` patch (``TRANSFORMERS_TPU_EXT_DISABLE=tp_plan_rewrite``) the KV-head and tied
cases fail with upstream's shape errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import _tp_models

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("tp_worker.py")
TOLERANCE = 1e-4
_QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")


def _save_models(root: Path) -> dict[str, str]:
    return {name: _tp_models.save(name, root / name) for name in _tp_models.configs()}


def _launch(root: Path, nproc: int, cases: list[dict]) -> dict[str, list[dict]]:
    out = root / f"out{nproc}"
    out.mkdir()
    spec = root / f"spec{nproc}.json"
    spec.write_text(json.dumps({"out": str(out), "cases": cases}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["TRANSFORMERS_TPU_EXT_TP_REWRITE"] = "always"  # no TPU here: the opt-in for CPU/GPU clusters
    if os.environ.get("TRANSFORMERS_TPU_EXT_DISABLE"):  # to check that these tests fail without the patch
        env["TRANSFORMERS_TPU_EXT_DISABLE"] = os.environ["TRANSFORMERS_TPU_EXT_DISABLE"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run([*command, str(WORKER), str(spec)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    return {
        case["name"]: [json.loads((out / f"{case['name']}.rank{rank}.json").read_text()) for rank in range(nproc)]
        for case in cases
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    return _save_models(tmp_path_factory.mktemp("tp_models"))


@pytest.fixture(scope="module")
def four_ranks(models, tmp_path_factory) -> dict[str, list[dict]]:
    replicated = {f"model.layers.*.self_attn.{name}": "replicate" for name in _QKVO}
    return _launch(
        tmp_path_factory.mktemp("tp4"),
        4,
        [
            {"name": "kv2_auto", "model": models["glm_kv2"], "grad": True},
            {"name": "kv2_user_plan", "model": models["glm_kv2"], "tp_plan": replicated},
        ],
    )


@pytest.fixture(scope="module")
def two_ranks(models, tmp_path_factory) -> dict[str, list[dict]]:
    return _launch(
        tmp_path_factory.mktemp("tp2"),
        2,
        [
            {"name": "kv3_auto", "model": models["llama_kv3"]},
            {"name": "tied_default", "model": models["qwen3_tied"]},
            {"name": "tied_hidden_sharded", "model": models["qwen3_tied"], "tp_plan": {"model.embed_tokens": "embedding_colwise"}},
            {"name": "divisible", "model": models["llama_divisible"]},
            {"name": "impossible", "model": models["llama_kv3"], "tp_plan": {"model.layers.*.self_attn.k_proj": "colwise"}},
        ],
    )


def _assert_matches_unsharded(results: list[dict]) -> None:
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank}: {result.get('error')}"
        assert result["max_logit_diff"] < TOLERANCE, (rank, result["max_logit_diff"])
        assert result["tokens"] == result["ref_tokens"], rank
        assert "tp_plan_rewrite" in result["active_patches"]


def _rewrite_logged_once(results: list[dict], *needles: str) -> None:
    assert len(results[0]["log"]) == 1, results[0]["log"]
    assert all(needle in results[0]["log"][0] for needle in needles), results[0]["log"]
    assert all(not result["log"] for result in results[1:])  # once per load, on rank 0


def test_two_kv_heads_on_four_ranks_replicates_kv_heads(four_ranks):
    results = four_ranks["kv2_auto"]
    _assert_matches_unsharded(results)
    plan = results[0]["tp_plan"]
    assert plan["model.layers.*.self_attn.k_proj"] == plan["model.layers.*.self_attn.v_proj"] == "kv_replicated_colwise"
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise"
    assert plan["model.layers.*.self_attn.o_proj"] == "rowwise"
    for result in results:
        assert result["k_proj_local_shape"] == [8, 64]  # one KV head (head_dim 8) per rank
        assert result["num_key_value_groups"] == 2  # 2 query heads per rank share it (global: 4)
    _rewrite_logged_once(results, "Glm4ForCausalLM", "kv_heads", "replicated on 2 ranks")


def test_kv_replicated_gradients_match_unsharded(four_ranks):
    for result in four_ranks["kv2_auto"]:
        assert max(result["grad_diff"].values()) < TOLERANCE, result["grad_diff"]


def test_user_tp_plan_wins_over_rewriter(four_ranks):
    results = four_ranks["kv2_user_plan"]
    _assert_matches_unsharded(results)
    plan = results[0]["tp_plan"]
    assert {name: plan[f"model.layers.*.self_attn.{name}"] for name in _QKVO} == dict.fromkeys(_QKVO, "replicate")
    assert "kv_replicated_colwise" not in plan.values()
    assert results[0]["user_tp_plan_after"] == {f"model.layers.*.self_attn.{name}": "replicate" for name in _QKVO}
    assert results[0]["log"] == []  # nothing left to rewrite
    assert results[0]["num_key_value_groups"] == 4  # whole attention on every rank


def test_per_rank_parameter_bytes_of_both_strategies(four_ranks):
    kv, replicated = four_ranks["kv2_auto"][0], four_ranks["kv2_user_plan"][0]
    ideal = kv["full_bytes"] / 4
    print(
        f"\nper-rank parameter bytes (tp=4, full {kv['full_bytes']}, ideal {ideal:.0f}): "
        f"KV-head replication {kv['rank_bytes']} ({kv['rank_bytes'] / ideal:.3f}x ideal), "
        f"replicated attention {replicated['rank_bytes']} ({replicated['rank_bytes'] / ideal:.3f}x ideal)"
    )
    assert ideal <= kv["rank_bytes"] < replicated["rank_bytes"] < kv["full_bytes"]


def test_three_kv_heads_on_two_ranks_replicates_attention(two_ranks):
    results = two_ranks["kv3_auto"]
    _assert_matches_unsharded(results)
    plan = results[0]["tp_plan"]
    assert {plan[f"model.layers.*.self_attn.{name}"] for name in _QKVO} == {"replicate"}
    assert plan["model.layers.*.mlp.gate_proj"] == "colwise"  # the MLP stays sharded
    _rewrite_logged_once(results, "LlamaForCausalLM", "kv_heads", "3 key-value heads")


def test_tied_embeddings_load_and_stay_tied(two_ranks):
    results = two_ranks["tied_default"]
    _assert_matches_unsharded(results)
    assert all(result["tied"] for result in results)
    assert results[0]["tp_plan"] == results[0]["default_tp_plan"]  # consistent already: untouched
    assert results[0]["log"] == []


def test_tied_embeddings_sharded_on_hidden_dim_align_the_head(two_ranks):
    results = two_ranks["tied_hidden_sharded"]
    _assert_matches_unsharded(results)
    assert all(result["tied"] for result in results)
    assert results[0]["tp_plan"]["model.embed_tokens"] == "embedding_colwise"  # the user's entry
    assert results[0]["tp_plan"]["lm_head"] == "rowwise_split_input"
    _rewrite_logged_once(results, "tied_embeddings", "lm_head", "stay tied")


def test_divisible_model_plan_untouched(two_ranks):
    results = two_ranks["divisible"]
    _assert_matches_unsharded(results)
    assert results[0]["tp_plan"] == results[0]["default_tp_plan"]
    assert all(result["log"] == [] for result in results)


def test_impossible_plan_raises_before_loading(two_ranks):
    for result in two_ranks["impossible"]:
        assert result["error_type"] == "TPPlanError"
        message = result["error"]
        for needle in ("LlamaForCausalLM", "num_attention_heads=6", "num_key_value_heads=3", "tp_size=2", "To fix"):
            assert needle in message
        assert "maybe_distribute_model" in result["frames"]
        assert "_load_pretrained_model" not in result["frames"]
