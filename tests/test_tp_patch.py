"""The ``tp_plan_rewrite`` patch: the glue into ``DistributedMixin._resolve_parallel_plans``, in process.

``_resolve_parallel_plans`` needs no process group, so these run in milliseconds on a tiny model built
from a config; the multi-process behaviour is in ``test_tp_multiprocess.py``.
"""

from __future__ import annotations

import logging

import pytest

import transformers_tpu_ext
from transformers_tpu_ext import tp_plans
from transformers_tpu_ext.patches import REGISTRY, tp_plan_rewrite

ATTN = "model.layers.*.self_attn"


@pytest.fixture(scope="module")
def transformers_mixin():
    import transformers.modeling_utils  # noqa: F401 - fires the post-import hook
    from transformers.distributed import mixin

    if "tp_plan_rewrite" not in transformers_tpu_ext.active_patches():
        pytest.skip("tp_plan_rewrite is not active in this process")
    return mixin


def _tiny_llama(heads: int, kv_heads: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=heads * 8,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=8,
    )
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def _resolve(model, **config):
    from transformers.distributed import DistributedConfig

    tp_plan, _, _ = model._resolve_parallel_plans(DistributedConfig(**config))
    return tp_plan


def test_patch_contract():
    assert "tp_plan_rewrite" in REGISTRY
    assert tp_plan_rewrite.NAME == "tp_plan_rewrite"
    assert tp_plan_rewrite.TARGET == "transformers.distributed.mixin"
    assert tp_plan_rewrite.DISTRIBUTION == "transformers"


def test_revert_restores_the_exact_originals_and_apply_again(transformers_mixin):
    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES, ParallelInterface

    cls = transformers_mixin.DistributedMixin
    wrapped = cls.__dict__["_resolve_parallel_plans"]
    original = wrapped.__wrapped__
    assert tp_plans.KV_REPLICATED_STYLE in ALL_PARALLEL_STYLES
    tp_plan_rewrite.revert()
    try:
        assert cls.__dict__["_resolve_parallel_plans"] is original
        assert tp_plans.KV_REPLICATED_STYLE not in ParallelInterface._global_mapping
    finally:
        tp_plan_rewrite.apply(transformers_mixin)
    assert cls.__dict__["_resolve_parallel_plans"].__wrapped__ is original
    assert tp_plans.KV_REPLICATED_STYLE in ALL_PARALLEL_STYLES
    tp_plan_rewrite.apply(transformers_mixin)  # idempotent: no double wrapping
    assert cls.__dict__["_resolve_parallel_plans"].__wrapped__ is original


def test_resolved_plan_replicates_attention_and_logs_once(transformers_mixin, caplog):
    model = _tiny_llama(heads=6, kv_heads=3)
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        plan = _resolve(model, tp_size=2)
    assert plan["model.layers.0.self_attn.k_proj"] == "replicate"
    assert plan["model.layers.0.mlp.gate_proj"] == "colwise"
    assert model.tp_plan[f"{ATTN}.q_proj"] == "replicate"
    lines = [r.getMessage() for r in caplog.records if "TP plan rewritten" in r.getMessage()]
    assert len(lines) == 1 and "LlamaForCausalLM" in lines[0] and "kv_heads" in lines[0]


def test_user_config_is_not_mutated_and_user_entries_win(transformers_mixin):
    from transformers.distributed import DistributedConfig

    model = _tiny_llama(heads=6, kv_heads=3)
    user = {f"{ATTN}.q_proj": "replicate", f"{ATTN}.k_proj": "replicate", f"{ATTN}.v_proj": "replicate", f"{ATTN}.o_proj": "replicate"}
    distributed_config = DistributedConfig(tp_size=2, tp_plan=dict(user))
    plan, _, _ = model._resolve_parallel_plans(distributed_config)
    assert distributed_config.tp_plan == user
    assert all(plan[f"model.layers.0.self_attn.{n}"] == "replicate" for n in ("q_proj", "k_proj", "v_proj", "o_proj"))


def test_unknown_user_key_still_rejected_by_transformers(transformers_mixin):
    model = _tiny_llama(heads=6, kv_heads=3)
    with pytest.raises(ValueError, match="match nothing"):
        _resolve(model, tp_size=2, tp_plan={"model.layers.*.self_attn.nope": "colwise"})


def test_impossible_plan_raises(transformers_mixin):
    model = _tiny_llama(heads=6, kv_heads=3)
    with pytest.raises(tp_plans.TPPlanError, match="num_key_value_heads=3"):
        _resolve(model, tp_size=2, tp_plan={f"{ATTN}.k_proj": "colwise"})


def test_divisible_plan_passes_through(transformers_mixin):
    model = _tiny_llama(heads=4, kv_heads=2)
    assert _resolve(model, tp_size=2)["model.layers.0.self_attn.k_proj"] == "colwise"


def test_a_failing_rewriter_falls_back_to_the_upstream_plan(transformers_mixin, caplog):
    def broken(ctx):
        raise RuntimeError("boom")

    tp_plans.register_rewriter("test_broken", broken)
    try:
        model = _tiny_llama(heads=4, kv_heads=2)
        with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
            plan = _resolve(model, tp_size=2)
    finally:
        tp_plans.unregister_rewriter("test_broken")
    assert plan["model.layers.0.self_attn.k_proj"] == "colwise"
    assert any("boom" in record.getMessage() for record in caplog.records)
