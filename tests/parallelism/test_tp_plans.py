"""TP-plan rewriting as plain functions over configs and plans (no torch.distributed, milliseconds)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from transformers_tpu_ext.parallelism import tp_plans
from transformers_tpu_ext.parallelism.tp_plans import (
    KV_REPLICATED_STYLE,
    Rewrite,
    TPPlanError,
    kv_replication,
    register_rewriter,
    registered_rewriters,
    rewrite_plan,
    unregister_rewriter,
)

ATTN = "model.layers.*.self_attn"
DEFAULT = {
    "lm_head": "colwise_gather_output",
    "model.embed_tokens": "embedding_rowwise",
    f"{ATTN}.q_proj": "colwise",
    f"{ATTN}.k_proj": "colwise",
    f"{ATTN}.v_proj": "colwise",
    f"{ATTN}.o_proj": "rowwise",
    "model.layers.*.mlp.gate_proj": "colwise",
    "model.layers.*.mlp.up_proj": "colwise",
    "model.layers.*.mlp.down_proj": "rowwise",
}


def config(heads: int, kv_heads: int, tied: bool = False) -> SimpleNamespace:
    return SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=tied)


def test_divisible_plan_is_untouched():
    result = rewrite_plan(config(8, 4), DEFAULT, 4)
    assert result.plan == DEFAULT
    assert not result.changed and result.reasons == ()


def test_kv_heads_replicated_when_tp_is_a_multiple_of_them():
    result = rewrite_plan(config(8, 2), DEFAULT, 4, model_name="Glm4ForCausalLM")
    assert result.plan[f"{ATTN}.k_proj"] == result.plan[f"{ATTN}.v_proj"] == KV_REPLICATED_STYLE
    assert result.plan[f"{ATTN}.q_proj"] == "colwise" and result.plan[f"{ATTN}.o_proj"] == "rowwise"
    assert result.plan["model.layers.*.mlp.down_proj"] == "rowwise"
    (reason,) = result.reasons
    assert reason.startswith("kv_heads: 2 key-value heads (8 query heads)") and "replicated on 2 ranks" in reason


def test_attention_replicated_when_tp_is_not_a_multiple_of_kv_heads():
    plan = {**DEFAULT, f"{ATTN}.q_norm": "replicated_with_grad_allreduce"}
    result = rewrite_plan(config(6, 3), plan, 2)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm"):
        assert result.plan[f"{ATTN}.{name}"] == "replicate"
    assert result.plan["model.layers.*.mlp.gate_proj"] == "colwise"
    assert "attention projections are replicated" in result.reasons[0]


def test_query_heads_not_divisible_replicates_attention():
    result = rewrite_plan(config(6, 6), DEFAULT, 4)
    assert result.plan[f"{ATTN}.q_proj"] == "replicate"


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tp", "groups"),
    [(8, 2, 4, 2), (32, 2, 8, 4), (16, 1, 4, 4), (32, 4, 8, 4)],
)
def test_kv_replication_layout(heads, kv_heads, tp, groups):
    layout = kv_replication(heads, kv_heads, tp)
    assert layout.key_value_groups_per_rank == groups
    for rank in range(tp):
        first_query = rank * layout.query_heads_per_rank
        last_query = first_query + layout.query_heads_per_rank - 1
        # every query head of the rank uses the rank's KV head
        assert first_query // (heads // kv_heads) == last_query // (heads // kv_heads) == layout.kv_head_of_rank(rank)


def test_kv_replication_does_not_apply():
    assert kv_replication(8, 4, 4) is None  # divisible: plain sharding
    assert kv_replication(6, 3, 2) is None  # 2 is not a multiple of 3
    assert kv_replication(6, 2, 4) is None  # 6 query heads do not split over 4


def test_user_entries_win_over_rewriters():
    user = {f"{ATTN}.k_proj": "replicate", f"{ATTN}.v_proj": "replicate", f"{ATTN}.q_proj": "replicate", f"{ATTN}.o_proj": "replicate"}
    result = rewrite_plan(config(8, 2), {**DEFAULT, **user}, 4, user)
    assert {key: result.plan[key] for key in user} == user
    assert result.reasons == ()


def test_user_forcing_an_impossible_split_is_a_clear_error():
    user = {f"{ATTN}.k_proj": "colwise"}
    with pytest.raises(TPPlanError) as info:
        rewrite_plan(config(6, 3), DEFAULT, 2, user, model_name="LlamaForCausalLM")
    message = str(info.value)
    for needle in ("LlamaForCausalLM", "num_attention_heads=6", "num_key_value_heads=3", "tp_size=2", "no weight"):
        assert needle in message
    assert "drop your tp_plan entries ['model.layers.*.self_attn.k_proj']" in message
    assert "tp_size in [3, 6]" in message


def test_user_forcing_query_sharding_with_indivisible_heads_is_an_error():
    with pytest.raises(TPPlanError, match="5 attention heads do not divide by tp_size=2"):
        rewrite_plan(config(5, 5), DEFAULT, 2, {f"{ATTN}.q_proj": "colwise"})


def test_mixed_sharding_of_query_and_output_is_an_error():
    with pytest.raises(TPPlanError, match="disagree"):
        tp_plans.validate_plan(config(8, 8), {**DEFAULT, f"{ATTN}.o_proj": "replicate"}, 2)


def test_tied_embeddings_consistent_by_default():
    result = rewrite_plan(config(4, 2, tied=True), DEFAULT, 2)
    assert result.plan == DEFAULT


def test_tied_embeddings_head_follows_a_user_embedding():
    user = {"model.embed_tokens": "embedding_colwise"}
    result = rewrite_plan(config(4, 2, tied=True), {**DEFAULT, **user}, 2, user)
    assert result.plan["lm_head"] == "rowwise_split_input"
    assert result.reasons[0].startswith("tied_embeddings:")


def test_tied_embeddings_embedding_follows_a_user_head():
    user = {"lm_head": "rowwise_split_input"}
    result = rewrite_plan(config(4, 2, tied=True), {**DEFAULT, **user}, 2, user)
    assert result.plan["model.embed_tokens"] == "embedding_colwise"


def test_tied_embeddings_head_without_rule_gets_one():
    plan = {key: value for key, value in DEFAULT.items() if key != "lm_head"}
    result = rewrite_plan(config(4, 2, tied=True), plan, 2)
    assert result.plan["lm_head"] == "colwise_gather_output"


def test_tied_embeddings_conflicting_user_entries_are_an_error():
    user = {"model.embed_tokens": "embedding_colwise", "lm_head": "colwise_gather_output"}
    with pytest.raises(TPPlanError, match="tied"):
        rewrite_plan(config(4, 2, tied=True), {**DEFAULT, **user}, 2, user)


def test_untied_model_embeddings_left_alone():
    plan = {**DEFAULT, "model.embed_tokens": "embedding_colwise"}
    assert rewrite_plan(config(4, 2), plan, 2).plan == plan


def test_text_config_of_a_composite_config_is_used():
    text = config(8, 2)
    composite = SimpleNamespace(get_text_config=lambda decoder=None: text)
    assert tp_plans.head_counts(composite) == (8, 2)


def test_tp_size_one_changes_nothing():
    assert rewrite_plan(config(8, 3), DEFAULT, 1).plan == DEFAULT


def test_registry_of_rewriters():
    assert registered_rewriters()[:2] == ("kv_heads", "tied_embeddings")

    @register_rewriter("test_replicate_lm_head")
    def _rewriter(ctx):
        if ctx.plan.get("lm_head") == "colwise_gather_output":
            return Rewrite({**ctx.plan, "lm_head": "replicate"}, "keep the head whole")
        return None

    try:
        assert registered_rewriters()[-1] == "test_replicate_lm_head"
        with pytest.raises(ValueError, match="already registered"):
            register_rewriter("test_replicate_lm_head", _rewriter)
        result = rewrite_plan(config(8, 4), DEFAULT, 4)
        assert result.plan["lm_head"] == "replicate"
        assert result.reasons == ("test_replicate_lm_head: keep the head whole",)
        # ... but never over the user's entry
        user = {"lm_head": "colwise_gather_output"}
        assert rewrite_plan(config(8, 4), DEFAULT, 4, user).plan["lm_head"] == "colwise_gather_output"
    finally:
        assert unregister_rewriter("test_replicate_lm_head") is _rewriter
    assert "test_replicate_lm_head" not in registered_rewriters()


def test_replicated_kv_heads_per_rank_is_one_head_under_kv_replication():
    plan = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": tp_plans.KV_REPLICATED_STYLE}
    assert tp_plans.replicated_kv_heads_per_rank(plan, 2) == 1
    assert tp_plans.replicated_kv_heads_per_rank(plan, [2, 2, 2]) == [1, 1, 1]
    assert tp_plans.replicated_kv_heads_per_rank({"layers.*.self_attn.k_proj": "colwise"}, 4) is None


@pytest.mark.parametrize(
    "environ, tpu, enabled",
    [
        ({}, False, False),  # the default: TPU only, so without one the plugin changes nothing
        ({}, True, True),
        ({tp_plans.TP_REWRITE_ENV: ""}, True, True),
        ({tp_plans.TP_REWRITE_ENV: "auto"}, False, False),
        ({tp_plans.TP_REWRITE_ENV: "Always"}, False, True),  # the opt-in for CPU/GPU clusters
        ({tp_plans.TP_REWRITE_ENV: "never"}, True, False),
    ],
)
def test_where_the_patches_rewrite(environ, tpu, enabled):
    asked = []

    def tpu_available():
        asked.append(True)
        return tpu

    assert tp_plans.rewrite_enabled(tpu_available, environ) is enabled
    # Only "auto" asks the backend.
    assert bool(asked) == (tp_plans.rewrite_mode(environ) == "auto")


def test_invalid_rewrite_setting_names_the_variable_and_the_values():
    with pytest.raises(ValueError, match=r"TRANSFORMERS_TPU_EXT_TP_REWRITE='yes'.*auto, always, never"):
        tp_plans.rewrite_enabled(lambda: True, {tp_plans.TP_REWRITE_ENV: "yes"})
    with pytest.raises(ValueError, match=r"'alway'.*did you mean always"):  # a near miss names the word meant
        tp_plans.rewrite_mode({tp_plans.TP_REWRITE_ENV: "alway"})
