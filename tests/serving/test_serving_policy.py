"""The serving policy (``transformers_tpu_ext.serving``): plain functions, millisecond tests."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.serving import policy as serving
from transformers_tpu_ext.serving import tensor_parallel


def test_ladders_double_from_the_vllm_tpu_anchors_up_to_the_limit():
    assert serving.token_ladder(256) == (16, 32, 64, 128, 256)
    assert serving.token_ladder(300) == (16, 32, 64, 128, 256, 300)
    assert serving.request_ladder(32) == (8, 16, 32)
    assert serving.request_ladder(100) == (8, 16, 32, 64, 100)
    assert serving.token_ladder(10) == (10,)
    assert serving.request_ladder(4) == (4,)
    with pytest.raises(ValueError, match="max_batch_tokens"):
        serving.token_ladder(0)


def test_step_shape_pads_tokens_and_requests_and_never_more_requests_than_tokens():
    tokens, requests = serving.token_ladder(256), serving.request_ladder(32)
    assert serving.step_shape(1, 1, tokens, requests) == (16, 8)
    assert serving.step_shape(17, 3, tokens, requests) == (32, 8)
    assert serving.step_shape(20, 20, tokens, requests) == (32, 32)
    assert serving.step_shape(256, 32, tokens, requests) == (256, 32)
    # A custom request ladder above the token rung is clamped to it.
    assert serving.step_shape(9, 9, (16, 32), (8, 100)) == (16, 16)
    with pytest.raises(ValueError, match="past the largest bucket"):
        serving.step_shape(257, 3, tokens, requests)
    with pytest.raises(ValueError, match="at least one token per request"):
        serving.step_shape(2, 3, tokens, requests)


@pytest.mark.parametrize("max_tokens,max_requests", [(256, 32), (300, 100), (32, 8), (64, 64), (40, 24)])
def test_step_shapes_is_exactly_the_set_of_shapes_a_step_can_have(max_tokens, max_requests):
    tokens, requests = serving.token_ladder(max_tokens), serving.request_ladder(max_requests)
    reachable = {
        serving.step_shape(q, s, tokens, requests)
        for q in range(1, max_tokens + 1)
        for s in range(1, min(q, max_requests) + 1)
    }
    assert set(serving.step_shapes(tokens, requests)) == reachable


def test_default_ladders_give_14_programs_whatever_the_prompt_lengths():
    assert len(serving.step_shapes(serving.token_ladder(256), serving.request_ladder(32))) == 14


def test_page_size_follows_the_max_length_like_vllm_tpu():
    assert serving.page_size_for(100) == 16
    assert serving.page_size_for(364) == 32  # 512 // 16
    assert serving.page_size_for(2048) == 128
    assert serving.page_size_for(8192) == 256
    assert serving.page_size_for(8193) == 16
    assert serving.blocks_per_request(364, 32) == 12


def test_kv_budget_is_hbm_minus_weights_minus_headroom():
    assert serving.kv_budget(1000, 300, 100) == 600
    assert serving.kv_budget(1000, 950, 100) == 0


def test_cache_plan_keeps_a_step_aside_and_counts_the_trash_sectors():
    plan = serving.cache_plan(10_000, 100, 1_500)
    assert plan.num_sectors == 83  # (10000 - 1500) // 100 - 2 trash sectors
    assert plan.cache_bytes == 8_500 <= plan.budget
    assert plan.usable_fraction == 0.85
    assert serving.cache_plan(10_000, 100, 1_500, requested_sectors=10).cache_bytes == 1_200


def test_cache_plan_errors_say_what_to_change():
    with pytest.raises(MemoryError, match="lower max_batch_tokens"):
        serving.cache_plan(1_000, 100, 900)
    with pytest.raises(MemoryError, match="lower num_blocks"):
        serving.cache_plan(10_000, 100, 1_500, requested_sectors=84)


def _plan(**overrides):
    args = dict(
        hint_len=None, model_max_len=4096, page_size=None, max_batch_tokens=None, max_requests=None,
        hbm_bytes=1 << 30, resident_bytes=1 << 20, headroom_bytes=1 << 28,
    )
    args.update(overrides)
    return serving.plan_for(serving.ServeSettings(**args.pop("settings", {})), **args)


def test_plan_max_length_from_the_hint_rounded_up_then_settings_then_the_model():
    assert _plan(hint_len=364).max_len == 512
    assert _plan(hint_len=364, model_max_len=400).max_len == 400
    assert _plan().max_len == serving.DEFAULT_MAX_LEN
    assert _plan(model_max_len=512).max_len == 512
    assert _plan(hint_len=364, settings={"max_len": 1000}).max_len == 1000


def test_plan_limits_come_from_the_continuous_batching_config_then_the_settings():
    plan = _plan(hint_len=364)
    assert (plan.max_batch_tokens, plan.max_requests, plan.page_size, plan.blocks_per_request) == (256, 32, 32, 16)
    plan = _plan(max_batch_tokens=64, max_requests=100, page_size=64)
    assert plan.token_buckets == (16, 32, 64) and plan.request_buckets == (8, 16, 32, 64) and plan.page_size == 64
    plan = _plan(settings={"token_buckets": (48, 200), "request_buckets": (4,)})
    assert plan.token_buckets == (48, 200, 256) and plan.request_buckets == (4, 32) and plan.notes == ()
    assert plan.budget == (1 << 30) - (1 << 20) - (1 << 28)


def test_settings_from_environment_and_configure(monkeypatch):
    env = {serving.ENV["max_batch_tokens"]: "64", serving.ENV["request_buckets"]: "4, 16", serving.ENV["warmup"]: "0"}
    settings = serving.current(env)
    assert (settings.max_batch_tokens, settings.request_buckets, settings.warmup) == (64, (4, 16), False)
    with pytest.raises(ValueError, match="TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN='long'"):
        serving.current({serving.ENV["max_len"]: "long"})
    with pytest.raises(ValueError, match="max_requests must be a positive integer"):
        serving.current({serving.ENV["max_requests"]: "0"})
    try:
        serving.configure(max_len=777)
        assert serving.current({serving.ENV["max_len"]: "5"}).max_len == 777
        with pytest.raises(TypeError, match="unknown serving setting"):
            serving.configure(bogus=1)
    finally:
        serving.reset()
    assert serving.current({}).max_len is None


def test_step_stats_measure_padding():
    stats = serving.StepStats()
    stats.record(10, 2, (16, 8))
    stats.record(30, 3, (32, 8))
    assert stats.token_overhead == 48 / 40
    assert stats.asdict()["shapes"] == [(16, 8), (32, 8)]


@pytest.mark.parametrize(
    "prompt, new, positions, message",
    [
        (0, 8, None, "empty prompt"),
        (5, 0, None, "max_new_tokens \\(max_tokens\\) must be at least 1, got 0"),
        (5, -3, None, "got -3"),
        (300, 8, 300, "the model has 300 positions"),
    ],
)
def test_fit_request_refuses_a_request_that_can_only_fail(prompt, new, positions, message):
    with pytest.raises(ValueError, match=message):
        serving.fit_request(prompt, new, 512, positions)
    if prompt and new > 0:
        assert serving.fit_request(positions - 1, new, 512, positions) == 8


def test_fit_request_lowers_max_new_tokens_and_refuses_a_prompt_with_no_room():
    assert serving.fit_request(100, 20, 512) == 20
    assert serving.fit_request(500, 1024, 512) == 12
    assert serving.fit_request(500, None, 512) == 12
    with pytest.raises(ValueError, match="TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN"):
        serving.fit_request(512, 1, 512)


def test_step_bytes_counts_each_tokens_pages_scores_logits_and_activations():
    plan = _plan(hint_len=364, max_batch_tokens=64, max_requests=8)  # 512 keys per token
    size = serving.step_bytes(plan, heads=4, kv_heads=2, head_dim=8, itemsize=4, vocab_size=320,
                              activation_bytes_per_token=1000)
    assert size == 64 * 1000 + 2 * 64 * 512 * 2 * 8 * 4 + 64 * 4 * 512 * 4 + 8 * 320 * 4


def test_step_bytes_on_the_kernel_path_count_no_max_len_gather():
    # issue 37: the kernel reads the pages in place; the cache sizing kept a max_len gather per token on the
    # kernel path too (128 tokens x 1,024 keys: 543 MB of a 2 GiB chip), and a 1 GiB chip had no room for a cache
    from transformers_tpu_ext.serving import kernel_path

    plan = _plan(hint_len=364, max_batch_tokens=64, max_requests=8)
    plan.attention, plan.kernel_variant = "ragged", kernel_path.KernelVariant(lanes=2)
    size = serving.step_bytes(plan, heads=4, kv_heads=2, head_dim=64, itemsize=2, vocab_size=320,
                              activation_bytes_per_token=1000)
    assert size == 64 * 1000 + 2 * 64 * 4 * 2 * 64 * 2 + 8 * 320 * 4  # queries and outputs, 128 lanes each
    plan.attention = "paged"
    assert serving.step_bytes(plan, heads=4, kv_heads=2, head_dim=64, itemsize=2, vocab_size=320,
                              activation_bytes_per_token=1000) > 5 * size


def test_explicit_rungs_past_the_largest_step_are_refused_not_dropped():
    # docs/serving.md's request_buckets=(8, 32, 64) used to become (8, 32) without a word.
    with pytest.raises(ValueError, match=r"request_buckets=\(8, 32, 64\) goes past max_requests=32.*"
                                         r"TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS.*leave 64 out"):
        serving.configure(request_buckets=(8, 32, 64))
    assert serving.current().request_buckets is None  # nothing stored
    settings = serving.ServeSettings(request_buckets=(8, 32, 64), max_requests=64)
    assert settings.ladders(256, 64)[1] == (8, 32, 64)
    # the same from the environment: one problem at activation (each variable alone is valid)
    env = {serving.ENV["token_buckets"]: "64,256,512"}
    (problem,) = serving.check_environment(env)
    # issue 29: the message names the ladder's own variable first (it used to name only the limit's)
    assert problem.startswith("TRANSFORMERS_TPU_EXT_SERVE_TOKEN_BUCKETS='64,256,512' goes past max_batch_tokens=256")
    assert "TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS" in problem and "leave 512 out" in problem
    assert serving.check_environment({**env, serving.ENV["max_batch_tokens"]: "512"}) == []


def test_a_smaller_continuous_batching_config_cuts_explicit_rungs_with_a_note():
    plan = _plan(max_requests=16, settings={"request_buckets": (8, 32, 64), "max_requests": 64})
    assert plan.request_buckets == (8, 16)
    (note,) = plan.notes
    assert "request_buckets 32, 64" in note and "max_requests_per_batch=16" in note


def test_the_paged_path_is_taken_only_for_what_the_paged_attention_computes_as_upstream():
    # Issue 18, item 3 ("safe when"): the TPU path gives the model a dispatching attention; models
    # whose attention it would not compute as upstream keep upstream's manager, unpatched.
    taken = [serving.ServeFacts(), serving.ServeFacts(attention="eager"), serving.ServeFacts(attention="paged|eager"),
             serving.ServeFacts(layer_types=("sliding_attention", "full_attention")),
             serving.ServeFacts(attention="eager", attention_sinks=True),  # gpt-oss: the paged attention has sinks
             serving.ServeFacts(latent_cache="deepseek_v3"), serving.ServeFacts(latent_cache="deepseek_v2")]
    for facts in taken:
        assert serving.paged_path(facts)[0]
    refused = {
        "tensor parallelism": serving.ServeFacts(tp=serving.TPFacts(tp_size=2, heads=4, kv_heads=2)),
        "encoder-decoder": serving.ServeFacts(encoder_decoder=True),
        "through generate()": serving.ServeFacts(media="images"),
        "flash_attention_2": serving.ServeFacts(attention="flash_attention_2"),
        "flex_attention": serving.ServeFacts(attention="flex_attention"),
        "linear_attention": serving.ServeFacts(layer_types=("full_attention", "linear_attention")),
        "chunked_attention": serving.ServeFacts(layer_types=("chunked_attention",)),
        "multi-head latent attention": serving.ServeFacts(latent_cache="kimi_linear"),
        "eager_attention_forward": serving.ServeFacts(attention="eager", eager_function=False),
    }
    for reason, facts in refused.items():
        taken, why = serving.paged_path(facts)
        assert not taken and reason in why
    assert serving.paged_path(serving.ServeFacts(eager_function=False))[0]  # SDPA falls back to the registry's
    assert set(serving.PAGED_FALLBACKS.values()) == {"sdpa", "eager"}


# -- tensor parallelism (serving.tensor_parallel) ------------------------------------------------------

_HEAD_SHARDED = {f"model.layers.*.self_attn.{name}": style for name, style in tensor_parallel.HEAD_SHARDED.items()}


def _tp(tp_size: int, heads: int, kv_heads: int, plan: dict) -> serving.TPFacts:
    return serving.TPFacts(tp_size, heads, kv_heads, tensor_parallel.attention_styles(plan))


def test_a_head_sharded_model_serves_on_tpu_with_its_own_heads_per_chip():
    plan = {**_HEAD_SHARDED, "model.layers.*.mlp.gate_proj": "colwise", "lm_head": "colwise_gather_output",
            "model.layers.*.self_attn.q_norm": "replicated_with_grad_allreduce"}  # Qwen3's per-head norms
    for tp, local in ((2, (16, 4)), (4, (8, 2)), (8, (4, 1))):
        facts = _tp(tp, 32, 8, plan)
        assert serving.paged_path(serving.ServeFacts(tp=facts))[0]
        assert tensor_parallel.local_heads(facts) == local
        assert f"{local[0]} query and {local[1]} key-value heads per chip" in tensor_parallel.tp_path(facts)[1]
    assert tensor_parallel.tp_path(serving.TPFacts()) == (True, "no tensor parallelism")
    assert tensor_parallel.local_heads(serving.TPFacts(heads=4, kv_heads=2)) == (4, 2)


def test_the_plan_rewrites_serve_on_tpu_with_the_heads_each_rank_holds():
    replicated_kv = {**_HEAD_SHARDED, "model.layers.*.self_attn.k_proj": "kv_replicated_colwise",
                     "model.layers.*.self_attn.v_proj": "kv_replicated_colwise"}
    glm = _tp(4, 8, 2, replicated_kv)  # 2 KV heads on 4 chips: each replicated on 2
    assert tensor_parallel.tp_path(glm)[0] and tensor_parallel.layout(glm) == "kv_replicated"
    assert tensor_parallel.local_heads(glm) == (2, 1) and tensor_parallel.kv_split(glm) == 2
    mqa = _tp(2, 4, 1, replicated_kv)
    assert tensor_parallel.local_heads(mqa) == (2, 1) and tensor_parallel.kv_split(mqa) == 1
    whole = _tp(2, 6, 3, dict.fromkeys(_HEAD_SHARDED, "replicate"))  # 3 KV heads on 2 chips
    assert tensor_parallel.tp_path(whole)[0] and tensor_parallel.layout(whole) == "replicated"
    assert tensor_parallel.local_heads(whole) == (6, 3) and tensor_parallel.kv_split(whole) == 1
    sharded = _tp(4, 32, 8, _HEAD_SHARDED)
    assert tensor_parallel.kv_split(sharded) == 4  # what Transformers' own cache divides by


def test_a_sharded_model_the_tpu_step_would_not_compute_exactly_stays_unpatched_with_its_reason():
    replicated_kv = {**_HEAD_SHARDED, "model.layers.*.self_attn.k_proj": "kv_replicated_colwise",
                     "model.layers.*.self_attn.v_proj": "kv_replicated_colwise"}
    cases = {
        "k_proj replicate": _tp(2, 8, 4, {**_HEAD_SHARDED, "model.layers.*.self_attn.k_proj": "replicate",
                                          "model.layers.*.self_attn.v_proj": "replicate"}),
        "q_proj not sharded": _tp(2, 8, 4, {"model.layers.*.mlp.up_proj": "colwise"}),
        "6 query heads do not divide over tp_size=4": _tp(4, 6, 6, _HEAD_SHARDED),
        "2 key-value heads do not divide over tp_size=4": _tp(4, 8, 2, _HEAD_SHARDED),
        "3 key-value heads cannot be replicated over tp_size=4": _tp(4, 12, 3, replicated_kv),
        "more of the attention than its heads (sinks local_rowwise)": _tp(
            2, 8, 4, {**_HEAD_SHARDED, "model.layers.*.self_attn.sinks": "local_rowwise"}),
        "different styles": _tp(2, 8, 4, {**_HEAD_SHARDED, "model.vision.layers.*.self_attn.q_proj": "replicate"}),
    }
    for reason, facts in cases.items():
        taken, why = serving.paged_path(serving.ServeFacts(tp=facts))
        assert not taken and why.startswith("tensor parallelism: ") and reason in why, (reason, why)


def test_the_tensor_parallel_docs_table_is_the_predicate_s():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    begin = page.index(tensor_parallel.BEGIN) + len(tensor_parallel.BEGIN)
    assert page[begin : page.index(tensor_parallel.END, begin)].strip() == tensor_parallel.path_table()


# -- the int8 paged cache ---------------------------------------------------------------------------


def test_int8_pages_only_on_the_tpu_path_with_a_float_model():
    for dtype in ("float32", "bfloat16", "float16"):
        assert serving.kv_cache_path("int8", paged=True, dtype=dtype)[0] == "int8"
    assert serving.kv_cache_path("int8", paged=False, dtype="bfloat16") == (
        None, "the manager runs unpatched (upstream's paged cache keeps the model's dtype)")
    assert serving.kv_cache_path("int8", paged=True, dtype="float8_e4m3fn")[0] is None
    off = serving.kv_cache_path(None, paged=True, dtype="bfloat16")
    assert off[0] is None and "TRANSFORMERS_TPU_EXT_SERVE_KV_CACHE=int8" in off[1]


def test_an_int8_sector_counts_its_scales():
    # A sector of int8 pages: head_dim bytes per (position, head), plus a 4-byte scale each.
    assert serving.kv_bytes_per_sector(64 * 1000, 64, "int8") == 64 * 1000 + 4 * 1000
    assert serving.kv_bytes_per_sector(64 * 1000, 64, None) == 64 * 1000


def test_the_serve_kv_cache_setting_reads_its_variable_and_refuses_other_formats():
    assert serving.current({}).kv_cache is None
    assert serving.current({"TRANSFORMERS_TPU_EXT_SERVE_KV_CACHE": "int8"}).kv_cache == "int8"
    (problem,) = serving.check_environment({"TRANSFORMERS_TPU_EXT_SERVE_KV_CACHE": "fp8"})
    assert "TRANSFORMERS_TPU_EXT_SERVE_KV_CACHE='fp8'" in problem
    assert serving.configure(kv_cache="int8").kv_cache == "int8"
    serving.reset()


def test_a_model_that_reads_images_is_served_through_generate():
    # Issue 38: Transformers' continuous batching takes text only; a vision-language model's manager runs
    # unpatched, and the one WARNING names what serves image requests on TPU: generate().
    pytest.importorskip("transformers")
    from transformers import AutoConfig, LlamaConfig

    from transformers_tpu_ext.serving.patch_continuous_batching import _media

    assert _media(AutoConfig.for_model("llava")) == "images"
    assert _media(AutoConfig.for_model("qwen2_vl")) == "images"
    assert _media(LlamaConfig()) is None
    taken, why = serving.paged_path(serving.ServeFacts(media="images"))
    assert not taken and "generate()" in why and "docs/generation.md" in why
