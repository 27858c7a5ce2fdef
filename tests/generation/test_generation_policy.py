"""Which path a generate() call takes on TPU (pure policy: ``transformers_tpu_ext.generation.policy``).

One test per "safe when" predicate and per reason it gives: the static-cache substitution
(``cache_choice``), the bucket padding (``plan_call``), the device loop (``decode_path``) and the
device masks (``mask_path``), plus ``call_facts`` (options, model, arguments -> facts) and an
exhaustive check that the device loop is never reachable without generate()'s static cache.
"""

from __future__ import annotations

import dataclasses

import pytest

from transformers_tpu_ext.generation import policy

PLAIN = policy.CallFacts(mode="greedy_search")


def plan(facts=PLAIN, *, static_cache=True, bucketing=True):
    return policy.plan_call(facts, static_cache=static_cache, bucketing=bucketing)


def replace(base=PLAIN, **changes):
    return dataclasses.replace(base, **changes)


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


WHISPER = replace(encoder_decoder=True, family="whisper", inputs="other")


def test_whisper_gets_its_static_cache_bucketed():
    result = plan(WHISPER)
    assert not result.upstream and result.static_cache and result.bucket and not result.pad_prompt


@pytest.mark.parametrize(
    "facts, reason",
    [
        # Its segments' tokens start the next prompt beside tensors on the device, and the path hands them back on
        # the host (Transformers' test_generate_longform_with_prompt_ids failed with the plugin only).
        (replace(WHISPER, feeds_back=True), "condition_on_prev_tokens"),
        # The caller continues from the cache it gets back (test_generate_continue_from_past_key_values).
        (replace(WHISPER, returns_cache=True), "return_dict_in_generate"),
        (replace(WHISPER, family="t5"), "t5: not read"),
    ],
)
def test_encoder_decoder_calls_the_path_cannot_prove_are_upstreams(facts, reason):
    result = plan(facts)
    assert result.upstream and reason in result.reason and "encoder-decoder" in result.reason


def test_a_static_cache_the_caller_asked_for_is_handed_back_as_asked():
    result = plan(replace(WHISPER, returns_cache=True, cache_implementation="static"))
    assert not result.upstream and not result.static_cache  # the caller's own static cache, bucketed


def test_whispers_condition_on_prev_tokens_is_read_off_its_generation_config():
    options = {"condition_on_prev_tokens": True}
    facts = policy.call_facts(options, policy.ModelKind(encoder_decoder=True, family="whisper"), policy.CallShape(mode="greedy_search"), device_decode=True)
    assert facts.feeds_back
    assert "condition_on_prev_tokens" in policy.OPTION_DEFAULTS  # the glue reads every name listed there


@pytest.mark.parametrize(
    "facts, reason",
    [
        (replace(inputs="inputs_embeds", ids_bucketable=False), "not a 2D tensor"),
        (replace(other_batched_inputs=True), "other per-row inputs"),
        (replace(accepts_attention_mask=False), "no attention mask"),
        (replace(outputs_attentions_or_states=True, cache_implementation="static"), "attentions"),
    ],
)
def test_handled_but_not_bucketed(facts, reason):
    result = plan(facts)
    assert not result.upstream and not result.bucket
    assert reason in result.reason


@pytest.mark.parametrize(
    "facts, settings, reason",
    [
        # Issue 18, item 1: every KV cache other than generate()'s static one is upstream's.
        (replace(user_cache=True), {}, "cache object was passed in"),
        (replace(cache_implementation="static", user_cache=True), {}, "cache object was passed in"),
        (replace(cache_implementation="dynamic"), {}, "cache_implementation='dynamic'"),
        (replace(cache_implementation="offloaded_static"), {}, "cache_implementation='offloaded_static'"),
        (replace(cache_implementation="quantized"), {}, "cache_implementation='quantized'"),
        (replace(disable_compile=True), {}, "disable_compile=True"),
        (replace(eager_stance=True), {}, 'set_stance("force_eager")'),
        (PLAIN, {"static_cache": False}, "TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE=0"),
        (replace(returns_cache=True, outputs_attentions_or_states=True), {}, "attentions"),
        # Item 2: no cache at all.
        (replace(use_cache=False), {}, "use_cache=False"),
        (replace(use_cache=False, cache_implementation="static"), {}, "use_cache=False"),
        # Models whose layers a static cache does not hold as full-length key/value layers.
        (replace(layer_types_static=False), {}, "layers a static cache does not hold"),
        (replace(layer_types_static=False, cache_implementation="static"), {}, "layers a static cache"),
        (replace(accepts_position_ids=False), {}, "takes no position ids"),
        (replace(accepts_position_ids=False, cache_implementation="static"), {}, "takes no position ids"),
        (replace(supports_default_cache=False), {}, "makes its own cache"),
        (replace(supports_default_cache=False, cache_implementation="static"), {}, "makes its own cache"),
        # Item 4: upstream re-tokenizes the prompt the plugin would have padded.
        (replace(token_healing=True), {}, "token_healing"),
        # Its processor runs the model on the sequences (kept on the CPU by a handled call).
        (replace(guidance=True), {}, "classifier-free guidance"),
    ],
)
def test_calls_whose_cache_or_options_are_not_recognised_are_upstreams(facts, settings, reason):
    result = plan(facts, **settings)
    assert result.upstream and reason in result.reason
    assert not result.static_cache and not result.bucket
    assert policy.cache_choice(facts, static_cache=settings.get("static_cache", True))[0] is None or (
        facts.token_healing or facts.guidance
    )


def test_the_cache_choice_recognises_generates_static_cache_only():
    assert policy.cache_choice(PLAIN, static_cache=True) == ("default", "no cache asked for: the static cache")
    assert policy.cache_choice(replace(cache_implementation="static"), static_cache=False)[0] == "static"
    assert policy.cache_choice(replace(cache_implementation="static", eager_stance=True), static_cache=True)[0] == "static"
    # The caller's static cache keeps upstream's attentions (as wide as the cache): not refused.
    assert policy.cache_choice(replace(cache_implementation="static", outputs_attentions_or_states=True), static_cache=True)[0] == "static"


def test_returned_attentions_keep_upstreams_dynamic_cache():
    # Attentions (and the cache returned with them) are as wide as the cache: a static one changes them.
    result = plan(replace(returns_cache=True, outputs_attentions_or_states=True))
    assert not result.static_cache and not result.bucket


def test_inputs_embeds_still_get_the_static_cache():
    result = plan(replace(inputs="inputs_embeds", ids_bucketable=False))
    assert result.static_cache and not result.bucket


def test_inputs_embeds_beside_other_per_row_inputs_are_upstreams():
    # Transformers expands a vision-language model's encoded images beside the embeddings, on their device
    # (5.25's _expand_multimodal_outputs, beam search): Qwen2-VL's test_generate_from_inputs_embeds on TPU.
    result = plan(replace(inputs="inputs_embeds", ids_bucketable=False, other_batched_inputs=True))
    assert result.upstream and "inputs_embeds" in result.reason


def test_settings_and_options_that_turn_the_static_cache_off():
    for result in (plan(static_cache=False), plan(replace(disable_compile=True)), plan(replace(use_cache=False))):
        assert result.upstream and not result.static_cache
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
        (dict(model_kwargs=("cache", "visual_pos_masks")), "visual_pos_masks"),
        # Issue 38: pixel inputs the device loop would carry only if upstream drops them after the prefill.
        (dict(model_kwargs=("cache", "pixel_values")), "pixel_values"),
        # Issue 18, items 1-2: the loop feeds one token a step against a mask as long as the static cache.
        (dict(cache="DynamicCache"), "static cache (here: DynamicCache)"),
        (dict(cache="none", use_cache=False), "static cache (here: none)"),
        (dict(use_cache=False), "static cache"),
        (dict(cache="QuantizedCache"), "QuantizedCache"),
        (dict(causal=False), "not causal"),
    ],
)
def test_the_host_loop_and_why(changes, reason):
    import dataclasses

    path = policy.decode_path(dataclasses.replace(LOOP, **changes))
    assert not path.device and reason in path.reason


def test_the_device_loop_carries_type_ids_and_what_upstream_drops_after_the_prefill():
    import dataclasses

    kwargs = ("cache", "attention_mask", "token_type_ids", "mm_token_type_ids", "mm_encoder_outputs", "pixel_values")
    loop = dataclasses.replace(LOOP, model_kwargs=kwargs, prefill_only=frozenset({"mm_encoder_outputs", "pixel_values"}))
    assert policy.decode_path(loop).device
    assert not policy.decode_path(dataclasses.replace(loop, prefill_only=frozenset({"pixel_values"}))).device


def test_the_device_loop_is_never_taken_without_generates_static_cache_and_device_mask():
    # Every combination of the boolean facts and cache kinds: the device loop implies the call's
    # device mask, and that mask implies generate()'s static cache, in use.
    import dataclasses
    import itertools

    flags = ("device_decode", "outputs_scores_or_logits", "outputs_attentions_or_states", "synced_gpus",
             "custom_mask_function", "use_cache", "causal")
    for values in itertools.product((False, True), repeat=len(flags)):
        for cache in ("static", "none", "DynamicCache", "StaticCache"):
            for mode in ("greedy_search", "sample", "beam_search"):
                facts = dataclasses.replace(LOOP, mode=mode, cache=cache, **dict(zip(flags, values)))
                masks = policy.mask_path(facts)
                if policy.decode_path(facts).device:
                    assert masks.device
                if masks.device:
                    assert facts.cache == "static" and facts.use_cache and facts.causal and not facts.custom_mask_function


@pytest.mark.parametrize(
    "changes, reason",
    [
        (dict(cache="DynamicCache"), "DynamicCache"),
        (dict(use_cache=False), "static cache"),
        (dict(custom_mask_function=True), "its own generation masks"),
        (dict(causal=False), "not causal"),
    ],
)
def test_masks_are_built_on_the_host_where_the_call_mask_is_not_proven(changes, reason):
    import dataclasses

    assert policy.mask_path(LOOP).device
    assert policy.mask_path(dataclasses.replace(LOOP, mode="beam_search")).device  # beams share their prompt's mask
    path = policy.mask_path(dataclasses.replace(LOOP, **changes))
    assert not path.device and reason in path.reason


def test_call_facts_reads_options_model_and_arguments():
    model, shape = policy.ModelKind(), policy.CallShape()
    assert policy.call_facts({}, model, shape, device_decode=True) == policy.CallFacts(
        mode="greedy_search", device_decode_possible=True
    )
    facts = policy.call_facts(
        {"cache_implementation": "dynamic", "use_cache": False, "token_healing": True, "guidance_scale": 1.5,
         "return_dict_in_generate": True, "output_hidden_states": True, "do_sample": True},
        policy.ModelKind(layer_types=("full_attention", "linear_attention"), accepts_position_ids=False),
        policy.CallShape(mode="sample", cache_object=True),
        device_decode=True,
    )
    assert (facts.cache_implementation, facts.use_cache, facts.token_healing, facts.guidance) == ("dynamic", False, True, True)
    assert facts.outputs_attentions_or_states and facts.returns_cache and facts.do_sample and facts.user_cache
    assert not facts.layer_types_static and not facts.accepts_position_ids
    assert not facts.device_decode_possible  # guidance needs the host
    # What keeps the device loop away, before upstream built the processors:
    for options, model, shape, settings in (
        ({"repetition_penalty": 1.3}, policy.ModelKind(), shape, True),
        ({"return_dict_in_generate": True, "output_scores": True}, policy.ModelKind(), shape, True),
        ({}, policy.ModelKind(custom_mask_function=True), shape, True),
        ({}, policy.ModelKind(), policy.CallShape(logits_callbacks=True), True),
        ({}, policy.ModelKind(), shape, False),
    ):
        assert not policy.call_facts(options, model, shape, device_decode=settings).device_decode_possible
    # Only full-attention and sliding-window layers are held by the static cache as full-length layers.
    for layers, static in ((("full_attention", "sliding_attention"), True), (("chunked_attention",), False),
                           (("full_attention", "dummy"), False), (("conv", "full_attention"), False)):
        assert policy.call_facts({}, policy.ModelKind(layer_types=layers), shape, device_decode=True).layer_types_static is static


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


# -- the int8 KV cache (kv_cache_choice) ------------------------------------------------------------

_STATIC = ("StaticLayer", "StaticLayer")
#: What a user writes, and the facts the glue reads for it (the table in docs/generation.md).
KV_CASES = [
    ("`generate(...)` (no cache asked for: the plugin's static cache)", policy.KVFacts("default", layers=_STATIC)),
    ('`cache_implementation="static"`', policy.KVFacts("static", "static", layers=_STATIC)),
    ("a sliding-window model (the plugin holds its windows at full length)", policy.KVFacts("default", layers=_STATIC)),
    ("`cache=StaticCache(...)` passed in", policy.KVFacts(None)),
    ('`cache_implementation="dynamic"`, `"offloaded_static"`, ...', policy.KVFacts(None, "dynamic")),
    ('`cache_implementation="quantized"`', policy.KVFacts(None, "quantized")),
    ("a cache with other layers (linear attention...)", policy.KVFacts("default", layers=("StaticLayer", "LinearAttentionLayer"))),
    ("an offloaded static cache", policy.KVFacts("static", "static", layers=_STATIC, offloaded=True)),
    ("a float8 model", policy.KVFacts("default", layers=_STATIC, dtype="float8_e4m3fn")),
]


UPSTREAMS = "upstream's"


def kv_rows() -> list[str]:
    rows = []
    for label, facts in KV_CASES:
        choice, why = policy.kv_cache_choice(facts, "int8")
        rows.append(f"| {label} | {choice or UPSTREAMS} | {why} |")
    return rows


def test_the_int8_kv_table_in_the_docs_is_the_predicates():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "generation.md").read_text()
    table = text.split("| what you write | KV cache | why |\n|---|---|---|\n", 1)[1].split("\n\n", 1)[0]
    assert table.splitlines() == kv_rows()


def test_int8_kv_only_for_the_plugins_full_length_static_layers_in_a_float_dtype():
    for kind in ("static", "default"):
        for dtype in ("float32", "bfloat16", "float16"):
            assert policy.kv_cache_choice(policy.KVFacts(kind, layers=_STATIC, dtype=dtype), "int8")[0] == "int8"
    refused = [
        policy.KVFacts(None, layers=_STATIC),
        policy.KVFacts("default", layers=()),
        policy.KVFacts("default", layers=("StaticLayer", "StaticSlidingWindowLayer")),
        policy.KVFacts("default", layers=_STATIC, one_length=False),
        policy.KVFacts("default", layers=_STATIC, offloaded=True),
        policy.KVFacts("default", layers=_STATIC, dtype="int8"),
        policy.KVFacts("default", "quantized", layers=_STATIC),
    ]
    for facts in refused:
        assert policy.kv_cache_choice(facts, "int8")[0] is None, facts
    off = policy.kv_cache_choice(policy.KVFacts("default", layers=_STATIC), None)
    assert off[0] is None and "TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE=int8" in off[1]


def test_the_kv_cache_setting_reads_its_variable_and_refuses_other_formats():
    from transformers_tpu_ext.generation import config

    assert config.current({}).kv_cache is None
    assert config.current({"TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE": "INT8"}).kv_cache == "int8"
    assert config.current({"TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE": "none"}).kv_cache is None
    (problem,) = config.check_environment({"TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE": "int4"})
    assert "TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE='int4'" in problem
    with pytest.raises(ValueError, match="kv_cache"):
        config.TPUGenerationConfig(kv_cache="fp8")
