"""Issue 38: which vision-language calls are padded (``multimodal.media_plan``), and what is said when a
``generate()`` is not accelerated (``policy.notice``: one WARNING per model and reason, the caller's own
choices at DEBUG only)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from transformers_tpu_ext.generation import multimodal, policy
from transformers_tpu_ext.generation.multimodal import MediaCall, media_plan

_QWEN = MediaCall("qwen2_vl", frozenset({"mm_token_type_ids"}), frozenset({"pixel_values", "image_grid_thw"}))


@pytest.mark.parametrize(
    "call",
    [
        MediaCall("llava", per_item=frozenset({"pixel_values"})),
        MediaCall("gemma3", frozenset({"token_type_ids"}), frozenset({"pixel_values"})),
        MediaCall("gemma3", frozenset({"token_type_ids"})),  # a text-only prompt: its type ids still padded
        _QWEN,
        dataclasses.replace(_QWEN, family="qwen2_5_vl"),
        dataclasses.replace(_QWEN, family="qwen3_vl"),
    ],
)
def test_the_families_read_are_padded_and_prefilled_in_one_piece(call):
    plan = media_plan(call)
    assert plan.pad and plan.one_piece, plan.reason


def test_qwen_keeps_its_grid_beside_the_ids():
    assert media_plan(_QWEN).host == {"image_grid_thw"}
    assert media_plan(dataclasses.replace(_QWEN, per_item=frozenset())).host == frozenset()


@pytest.mark.parametrize(
    "call, reason",
    [
        (MediaCall("llava_next", per_item=frozenset({"pixel_values", "image_sizes"})), "not read (llava_next)"),
        (MediaCall(None, per_item=frozenset({"pixel_values"})), "not read"),
        (dataclasses.replace(_QWEN, per_item=frozenset({"pixel_values_videos", "video_grid_thw"})), "video_grid_thw"),
        (MediaCall("llava", per_item=frozenset({"pixel_values", "image_sizes"})), "image_sizes"),
        (MediaCall("llava", frozenset({"position_ids"}), frozenset({"pixel_values"})), "position_ids"),
        (MediaCall("llava", per_item=frozenset({"pixel_values"}), placeholder_ids=False), "placeholder"),
        (MediaCall("llava", per_item=frozenset({"pixel_values"}), pre_encodes=False), "before the prefill"),
    ],
)
def test_what_is_not_read_is_not_padded(call, reason):
    plan = media_plan(call)
    assert not plan.pad and reason in plan.reason


def test_the_reason_reaches_the_plan_and_its_warning_points_to_the_docs():
    shape = policy.CallShape(other_batched_inputs=True, other_inputs_reason="inputs of llava the plugin does not pad: x")
    facts = policy.call_facts({}, policy.ModelKind(), shape, device_decode=True)
    plan = policy.plan_call(facts, static_cache=True, bucketing=True)
    assert not plan.upstream and not plan.bucket and plan.reason.endswith("does not pad: x")
    assert plan.hint == policy.MODEL_DOCS


def test_warmup_runs_every_sequence_of_image_sizes():
    assert multimodal.warmup_image_sets(1, 2) == [(), (0,), (1,)]
    assert len(multimodal.warmup_image_sets(2, 2)) == 1 + 2 + 4
    assert multimodal.warmup_image_sets(2, 0) == [()]


# -------------------------------------------------------------------------------------------------
# The WARNING of an unaccelerated call


def _plan(options=None, model=None, call=None, static_cache=True, bucketing=True):
    facts = policy.call_facts(options or {}, policy.ModelKind(**(model or {})), policy.CallShape(**(call or {})),
                              device_decode=True)
    return policy.plan_call(facts, static_cache=static_cache, bucketing=bucketing)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(model={"encoder_decoder": True}),
        dict(call={"mode": "assisted_generation"}),
        dict(call={"inputs": "other", "ids_bucketable": False}),
        dict(options={"guidance_scale": 1.5}),
        dict(call={"cache_object": True}),
        dict(model={"layer_types": ("conv", "full_attention")}),
        dict(model={"supports_default_cache": False}),
        dict(model={"accepts_position_ids": False}),
        dict(call={"other_batched_inputs": True}),
        dict(call={"inputs": "inputs_embeds", "ids_bucketable": False}),
    ],
)
def test_what_the_model_or_the_call_keeps_from_the_plugin_is_a_warning(kwargs):
    plan = _plan(**kwargs)
    assert plan.upstream or not plan.bucket
    message = policy.notice("SomeModel", "upstream" if plan.upstream else "unbucketed", plan.reason, plan.hint)
    assert message is not None and "SomeModel" in message and plan.reason in message and "docs/" in message


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(options={"use_cache": False}),
        dict(options={"disable_compile": True}),
        dict(options={"cache_implementation": "dynamic"}),
        dict(call={"eager_stance": True}),
        dict(static_cache=False),
        dict(bucketing=False),
    ],
)
def test_the_callers_own_choices_stay_at_debug(kwargs):
    plan = _plan(**kwargs)
    assert plan.upstream or not plan.bucket
    assert plan.hint is None and policy.notice("SomeModel", "upstream", plan.reason, plan.hint) is None


def test_the_host_loop_warns_for_the_models_masks_only():
    loop = policy.LoopFacts(mode="greedy_search", device_decode=True, processors=(), model_kwargs=("cache",))
    masks = policy.decode_path(dataclasses.replace(loop, custom_mask_function=True))
    assert not masks.device and masks.hint == policy.MODEL_DOCS
    assert policy.decode_path(dataclasses.replace(loop, device_decode=False)).hint is None
    assert policy.decode_path(dataclasses.replace(loop, processors=("RepetitionPenaltyLogitsProcessor",))).hint is None


def test_one_warning_per_model_and_reason_on_the_simulated_tpu(simulated_tpu, caplog):
    """A real generate() left to upstream (classifier-free guidance) says so once, at WARNING, naming the model
    and the docs; the caller's own ``disable_compile=True`` says nothing at WARNING."""
    import torch

    from transformers_tpu_ext.core import wrapping
    from transformers_tpu_ext.testing.tiny import tiny_model

    wrapping._warned.difference_update({m for m in wrapping._warned if "generate() of Qwen3ForCausalLM" in m})
    model = tiny_model("qwen3").to("tpu")
    ids = torch.tensor([[5, 6, 7]]).to("tpu")
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        for _ in range(2):
            model.generate(ids, max_new_tokens=1, guidance_scale=1.5, do_sample=False)
        model.generate(ids, max_new_tokens=1, disable_compile=True, do_sample=False)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "generate() of" in r.getMessage()]
    assert len(said) == 1, said
    assert "Qwen3ForCausalLM" in said[0] and "classifier-free guidance" in said[0] and policy.PATHS_DOCS in said[0]
