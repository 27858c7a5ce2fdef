"""The fit report's arithmetic (pure, milliseconds): bytes per chip, which chips hold a model, decode ceilings."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.placement.budget import default_headroom
from transformers_tpu_ext.quantization import capacity
from transformers_tpu_ext.quantization.capacity import CHIPS, ModelCounts, fit, kv_bytes_per_position, weight_bytes
from transformers_tpu_ext.core.topology import TOPOLOGIES

GiB = 1 << 30

# Llama-3.1-8B's shape, counted by hand: 32 layers of 4096 wide, 14336 MLP, 32 query / 8 KV heads of 128, 128256 vocab.
_LAYER = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336
LLAMA_8B = ModelCounts(
    name="LlamaForCausalLM",
    linear=32 * _LAYER,
    linear_rows=32 * (4096 * 2 + 1024 * 2 + 14336 * 2 + 4096),
    linear_blocks=32 * (32 * 32 * 2 + 8 * 32 * 2 + 112 * 32 * 2 + 32 * 112),
    embeddings=128256 * 4096,
    head=128256 * 4096,
    other=32 * 2 * 4096 + 4096,
    layers=32,
    attention_layers=32,
    kv_heads=8,
    head_dim=128,
    attention_heads=32,
)


def test_the_8b_shape_is_8_billion_parameters():
    assert LLAMA_8B.parameters == 8_030_261_248  # Llama-3.1-8B's published count


def test_weight_bytes_per_format():
    bf16, int8, fp8 = (sum(weight_bytes(LLAMA_8B, w).values()) for w in ("bf16", "int8", "fp8"))
    assert bf16 == 2 * LLAMA_8B.parameters
    # Embeddings and the head stay bf16: 8-bit formats are a bit more than half.
    assert 0.55 < int8 / bf16 < 0.58 and 0.55 < fp8 / bf16 < 0.58
    parts = weight_bytes(LLAMA_8B, "int8")
    assert parts["linear"] == LLAMA_8B.linear + 5 * LLAMA_8B.linear_rows  # fp32 scale + int8 zero point per row
    assert weight_bytes(LLAMA_8B, "fp8")["linear"] == LLAMA_8B.linear + 4 * LLAMA_8B.linear_blocks
    assert parts["embeddings"] == parts["head"] == 2 * 128256 * 4096


def test_kv_bytes_per_position():
    assert kv_bytes_per_position(LLAMA_8B, "bf16") == 32 * 2 * 8 * 2 * 128 == 131072
    assert kv_bytes_per_position(LLAMA_8B, "int8") == 32 * 2 * 8 * (128 + 4) == 67584
    assert kv_bytes_per_position(LLAMA_8B, "int8") / kv_bytes_per_position(LLAMA_8B, "bf16") < 0.52


@pytest.mark.parametrize(("chips", "heads"), [(1, 8), (2, 4), (4, 2), (8, 1)])
def test_kv_heads_are_sharded_when_divisible(chips, heads):
    assert capacity.kv_heads_per_chip(LLAMA_8B, chips) == heads


def test_kv_heads_replicated_past_their_count():
    two = ModelCounts("m", 1, 1, 1, 1, 0, 0, 1, 1, kv_heads=2, head_dim=8, attention_heads=8)
    assert capacity.kv_heads_per_chip(two, 4) == 1  # one head per rank (the plugin's KV replication)
    odd = ModelCounts("m", 1, 1, 1, 1, 0, 0, 1, 1, kv_heads=3, head_dim=8, attention_heads=6)
    assert capacity.kv_heads_per_chip(odd, 4) == 3  # the attention is replicated


def _row(report, generation, chips):
    (row,) = [r for r in report.chips if (r.generation, r.chips) == (generation, chips)]
    return row


def test_which_chips_hold_the_8b_model():
    bf16 = fit(LLAMA_8B, weights="bf16")
    int8 = fit(LLAMA_8B, weights="int8")
    # 16 GB of bf16 weights do not fit one v5e (14.4 GiB budget); 8-bit weights do.
    assert not _row(bf16, "v5e", 1).fits and _row(int8, "v5e", 1).fits
    assert _row(bf16, "v5e", 4).fits and _row(bf16, "v6e", 1).fits
    # Every generation and count that has a topology is listed.
    assert {(r.generation, r.chips) for r in bf16.chips} == {(g, n) for g in CHIPS for n in TOPOLOGIES[g]}


def test_budget_is_the_placement_rule():
    row = _row(fit(LLAMA_8B, weights="fp8"), "v6e", 1)
    assert row.budget_per_chip == 32 * GiB - default_headroom(32 * GiB)
    # torchao's quantizer keeps 10 % of max_memory for itself (adjust_max_memory): so does the report.
    assert _row(fit(LLAMA_8B, weights="int8"), "v6e", 1).budget_per_chip == int(row.budget_per_chip * 0.9)
    assert row.kv_positions == (row.budget_per_chip - row.weights_per_chip) // row.kv_bytes_per_position_per_chip


def test_decode_ceilings():
    report = fit(LLAMA_8B, weights="bf16", kv="bf16", context=4096, batch=8)
    row = _row(report, "v6e", 1)
    assert row.steps_per_s == round(1638e9 / row.weights_per_chip, 1)
    read = row.weights_per_chip + 4096 * 8 * 131072
    assert row.steps_per_s_at_context == round(1638e9 / read, 1)
    assert row.tokens_per_s_at_context == round(8 * 1638e9 / read, 1)
    assert 95 < row.steps_per_s < 105  # the "capped near 100 steps/s"
    # The int8 cache reads about half the cache bytes: more steps per second at the same context.
    int8_cache = _row(fit(LLAMA_8B, weights="bf16", kv="int8", context=4096, batch=8), "v6e", 1)
    assert int8_cache.steps_per_s_at_context > row.steps_per_s_at_context


def test_tensor_parallel_shards_weights_and_replicates_norms():
    one, four = _row(fit(LLAMA_8B), "v6e", 1), _row(fit(LLAMA_8B), "v6e", 4)
    norms = 2 * LLAMA_8B.other
    assert four.weights_per_chip == -(-(one.weights_per_chip - norms) // 4) + norms
    assert four.kv_bytes_per_position_per_chip == one.kv_bytes_per_position_per_chip // 4


def test_filters_and_errors():
    report = fit(LLAMA_8B, chips=(4,), generations=("v5e", "v5p"))
    assert [(r.generation, r.chips) for r in report.chips] == [("v5e", 4), ("v5p", 4)]
    with pytest.raises(ValueError, match="choose one of bf16, int8, fp8"):
        fit(LLAMA_8B, weights="int4")
    with pytest.raises(ValueError, match="bf16, int8"):
        fit(LLAMA_8B, kv="fp8")
    with pytest.raises(ValueError, match="unknown TPU generation"):
        fit(LLAMA_8B, generations=("v9",))
    with pytest.raises(ValueError, match="batch"):
        fit(LLAMA_8B, batch=0)


def test_text_report_lists_every_row():
    text = capacity.format_report([fit(LLAMA_8B, weights="int8", chips=(1,))])
    assert "LlamaForCausalLM: weights int8" in text
    assert sum(1 for line in text.splitlines() if line.strip().startswith(tuple(CHIPS))) == 4  # v7 has no 1
    assert "unmeasured on a chip" in text


def test_a_mixture_of_experts_model_counts_its_experts_and_a_decode_step_reads_the_selected_ones():
    # Qwen3-30B-A3B's experts, by hand: 48 layers of 128 experts of 3 x 2048 x 768, 8 per token
    experts = 48 * 128 * 3 * 2048 * 768
    moe = ModelCounts(**{**LLAMA_8B.__dict__, "name": "MoE", "linear": LLAMA_8B.linear + experts, "expert_linear": experts,
                         "experts": 128, "experts_per_token": 8})
    assert capacity.selected_fraction(moe, 1) == 8 / 128
    assert capacity.selected_fraction(moe, 8) == pytest.approx(1 - (120 / 128) ** 8)
    assert capacity.selected_fraction(LLAMA_8B, 8) == 1.0  # dense: every weight, every step
    for chips in (1, 4):
        row = _row(fit(moe, context=0, batch=1), "v6e", chips)
        expert_bytes = 2 * experts / chips  # sharded over the chips (expert parallelism)
        assert row.expert_bytes_read_per_chip == pytest.approx(expert_bytes / 16, rel=1e-6)
        read = row.weights_per_chip - expert_bytes + row.expert_bytes_read_per_chip
        assert row.steps_per_s == pytest.approx(1638e9 / read, rel=1e-3)
    report = fit(moe, batch=8)
    assert report.experts == (128, 8, capacity.selected_fraction(moe, 8))
    assert "8 of 128 routed experts per token" in capacity.format_report([report])
