"""Which path a generate() call takes on TPU (pure policy: ``transformers_tpu_ext.generation_policy``)."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.generation import policy

PLAIN = policy.CallFacts(mode="greedy_search")


def plan(facts=PLAIN, *, static_cache=True, bucketing=True):
    return policy.plan_call(facts, static_cache=static_cache, bucketing=bucketing)


def replace(**changes):
    import dataclasses

    return dataclasses.replace(PLAIN, **changes)


def test_a_plain_greedy_call_gets_the_static_cache_and_buckets():
    result = plan()
    assert not result.upstream
    assert result.static_cache and result.bucket and result.pad_batch


@pytest.mark.parametrize(
    "facts, reason",
    [
        (replace(encoder_decoder=True), "encoder-decoder"),
        (replace(mode="assisted_generation"), "assisted_generation"),
        (replace(mode="custom"), "custom"),
        (replace(mode="contrastive_search"), "contrastive_search"),
        (replace(inputs="other"), "non-text"),
    ],
)
def test_calls_left_entirely_to_upstream(facts, reason):
    result = plan(facts)
    assert result.upstream and reason in result.reason
    assert not result.static_cache and not result.bucket


@pytest.mark.parametrize(
    "facts, reason",
    [
        (replace(user_cache=True), "no static cache"),  # no default static cache with a cache passed in
        (replace(cache_implementation="static", user_cache=True), "cache was passed in"),
        (replace(cache_implementation="dynamic"), "no static cache"),
        (replace(inputs="inputs_embeds", ids_bucketable=False), "not a 2D tensor"),
        (replace(other_batched_inputs=True), "other per-row inputs"),
        (replace(accepts_attention_mask=False), "no attention mask"),
        (replace(outputs_attentions_or_states=True, cache_implementation="static"), "attentions"),
        (replace(guidance=True), "guidance"),
    ],
)
def test_handled_but_not_bucketed(facts, reason):
    result = plan(facts)
    assert not result.upstream and not result.bucket
    assert reason in result.reason


def test_returned_attentions_keep_upstreams_dynamic_cache():
    # Attentions (and the cache returned with them) are as wide as the cache: a static one changes them.
    result = plan(replace(returns_cache=True, outputs_attentions_or_states=True))
    assert not result.static_cache and not result.bucket


def test_inputs_embeds_still_get_the_static_cache():
    result = plan(replace(inputs="inputs_embeds", ids_bucketable=False))
    assert result.static_cache and not result.bucket


def test_settings_and_options_that_turn_the_static_cache_off():
    assert not plan(static_cache=False).static_cache
    assert not plan(replace(disable_compile=True)).static_cache
    assert not plan(replace(use_cache=False)).static_cache
    assert not plan(replace(supports_default_cache=False)).static_cache
    assert not plan(bucketing=False).bucket
    explicit = plan(replace(cache_implementation="static"), static_cache=False)
    assert explicit.bucket and not explicit.static_cache  # bucketed, and the caller's choice kept


def test_sampling_pads_the_batch_only_where_the_device_draws_for_the_real_rows():
    assert plan(replace(mode="sample", do_sample=True, device_decode_possible=True)).pad_batch
    assert not plan(replace(mode="sample", do_sample=True, device_decode_possible=False)).pad_batch
    assert not plan(replace(mode="beam_sample", do_sample=True, device_decode_possible=True)).pad_batch
    assert plan(replace(mode="beam_search")).pad_batch


def test_processors_needed_lists_the_options_that_need_the_host():
    assert policy.processors_needed({}) == []
    assert policy.processors_needed({"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "typical_p": 1.0}) == []
    assert policy.processors_needed({"repetition_penalty": 1.3, "bad_words_ids": [[3]]}) == [
        "repetition_penalty",
        "bad_words_ids",
    ]
    assert policy.processors_needed({"temperature": 0.3, "top_k": 4, "top_p": 0.5, "min_p": 0.1}) == []


LOOP = policy.LoopFacts(
    mode="sample",
    device_decode=True,
    processors=("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinNewTokensLengthLogitsProcessor"),
    model_kwargs=("cache", "attention_mask", "position_ids", "use_cache", "logits_to_keep"),
)


def test_the_device_loop_takes_the_scores_only_processors():
    assert policy.decode_path(LOOP) == policy.DecodePath(True, "device")


@pytest.mark.parametrize(
    "changes, reason",
    [
        (dict(device_decode=False), "disabled"),
        (dict(mode="beam_search"), "beam_search"),
        (dict(outputs_scores_or_logits=True), "output_scores"),
        (dict(outputs_attentions_or_states=True), "attentions"),
        (dict(synced_gpus=True), "synced_gpus"),
        (dict(custom_mask_function=True), "masks"),
        (dict(processors=("RepetitionPenaltyLogitsProcessor", "TopKLogitsWarper")), "RepetitionPenaltyLogitsProcessor"),
        (dict(processors=("PrefixConstrainedLogitsProcessor",)), "PrefixConstrained"),
        (dict(model_kwargs=("cache", "token_type_ids")), "token_type_ids"),
    ],
)
def test_the_host_loop_and_why(changes, reason):
    import dataclasses

    path = policy.decode_path(dataclasses.replace(LOOP, **changes))
    assert not path.device and reason in path.reason


@pytest.mark.parametrize(
    "given, expected, changed",
    [
        (("tpu", "default", None, False), ("tpu", "default", None, False), []),
        (("inductor", "reduce-overhead", None, None), ("tpu", "default", None, False),
         ["backend='inductor' -> 'tpu'", "mode='reduce-overhead' dropped", "dynamic=False"]),
        (("inductor", None, {"x": 1}, True), ("tpu", None, None, True), ["backend='inductor' -> 'tpu'", "inductor options dropped"]),
        (("aot_eager", "max-autotune", None, None), ("aot_eager", "default", None, False), ["mode='max-autotune' dropped", "dynamic=False"]),
        ((len, None, {"x": 1}, None), (len, None, {"x": 1}, None), []),  # a callable backend is the caller's
    ],
)
def test_compile_settings_the_tpu_backend_accepts(given, expected, changed):
    settings, changes = policy.tpu_compile_settings(*given)
    assert tuple(settings[name] for name in ("backend", "mode", "options", "dynamic")) == expected
    assert changes == changed
