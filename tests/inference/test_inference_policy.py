"""``plan_call``: which inference calls are padded to a bucket and cut back, and why the others are not.

Pure: plain shapes and facts in, a plan or a reason out (no torch, no Transformers)."""

from __future__ import annotations

import dataclasses

import pytest

from transformers_tpu_ext.inference import policy
from transformers_tpu_ext.inference.policy import CallPlan, ModelFacts, plan_call

BERT = ModelFacts(task="sequence_classification", pooling="first", pad_token_id=0, max_positions=64)
DECODER = ModelFacts(task="sequence_classification", causal=True, pooling="last_non_pad", pad_token_id=0,
                     max_positions=512, returns_cache=True)
EMBEDDER = ModelFacts(task="base", pooling="none", pad_token_id=0, max_positions=64)


def _text(rows: int, length: int, mask: bool = True, types: bool = False) -> dict:
    shapes = {"input_ids": (rows, length)}
    if mask:
        shapes["attention_mask"] = (rows, length)
    if types:
        shapes["token_type_ids"] = (rows, length)
    return shapes


def test_a_batch_is_padded_to_its_rung_and_its_rows_to_a_power_of_two():
    plan = plan_call(_text(3, 20, types=True), BERT)
    assert plan == CallPlan(rows=4, length=32, original_rows=3, original_length=20,
                            keys=("input_ids", "attention_mask", "token_type_ids"), pad_token_id=0)


def test_a_rare_short_batch_reuses_a_longer_rung_already_run():
    assert plan_call(_text(4, 30), BERT, used={48}).length == 48
    assert plan_call(_text(4, 30), BERT, used={64}, patience=0).length == 32  # 2x longer: its own rung


def test_a_batch_shorter_than_a_rung_run_pads_to_it_until_its_own_rung_is_wanted_often():
    # zero-shot classification: a batch of a few short texts (15 tokens) after batches of 48
    plan = plan_call(_text(8, 15), BERT, used={48})
    assert (plan.length, plan.deferred) == (48, 16)
    assert plan_call(_text(8, 15), BERT, used={48}, deferred={16: 1}, patience=2).length == 48
    again = plan_call(_text(8, 15), BERT, used={48}, deferred={16: policy.PATIENCE})
    assert (again.length, again.deferred) == (16, None)  # wanted often: its own rung
    assert plan_call(_text(8, 15), BERT, used={48}, patience=0).length == 16
    assert plan_call(_text(8, 15), BERT, used={16, 48}).deferred is None  # its own rung was run
    assert plan_call(_text(8, 40), BERT, used={32}).length == 48  # longer than every rung run: compiles


def test_a_partial_batch_reuses_a_larger_row_count_already_run():
    assert plan_call(_text(3, 20), BERT, used_rows={8}).rows == 8
    assert plan_call(_text(3, 20), BERT, used_rows={2}).rows == 4


def test_padding_never_passes_an_absolute_position_table():
    assert plan_call(_text(4, 60), BERT).length == 64
    assert plan_call(_text(4, 50), dataclasses.replace(BERT, max_positions=56)).length == 56
    reason = plan_call(_text(4, 70), BERT)
    assert isinstance(reason, str) and "longer than the model's 64 positions" in reason


@pytest.mark.parametrize("rope", [None, "default", "linear", "yarn", "llama3"])
def test_rope_types_that_do_not_read_the_length_are_padded(rope):
    # length_readers.ROPE_TYPES: yarn and llama3 fix their frequencies from the config at init
    assert isinstance(plan_call(_text(2, 20), dataclasses.replace(DECODER, rope_type=rope), drop_cache=True), CallPlan)


@pytest.mark.parametrize("rope", ["dynamic", "longrope", "my_own_rope"])
def test_other_rope_types_are_not(rope):
    assert plan_call(_text(2, 20), dataclasses.replace(DECODER, rope_type=rope), drop_cache=True) == (
        f"RoPE type {rope!r} reads the sequence length"
    )


def test_last_token_pooling_pads_with_the_pad_token_and_needs_one():
    plan = plan_call(_text(2, 20), dataclasses.replace(DECODER, pad_token_id=7), drop_cache=True)
    assert plan.pad_token_id == 7 and plan.no_cache
    assert "set model.config.pad_token_id" in plan_call(_text(2, 20), dataclasses.replace(DECODER, pad_token_id=None))


def test_a_kv_cache_is_dropped_only_where_no_one_reads_it():
    assert "use_cache=False" in plan_call(_text(2, 20), DECODER)  # a user's loop might read it
    assert isinstance(plan_call(_text(2, 20), DECODER, options={"use_cache": False}), CallPlan)
    assert plan_call(_text(2, 20), DECODER, drop_cache=True).no_cache  # a pipeline never does


def test_a_missing_mask_is_added_where_the_model_takes_one():
    assert plan_call(_text(2, 20, mask=False), BERT).add_mask
    no_mask = dataclasses.replace(BERT, accepts=frozenset({"input_ids"}))
    assert "would see the padding" in plan_call(_text(2, 20, mask=False), no_mask)
    causal = dataclasses.replace(DECODER, accepts=frozenset({"input_ids"}), returns_cache=False)
    plan = plan_call(_text(2, 20, mask=False), causal)
    assert isinstance(plan, CallPlan) and not plan.add_mask  # causal: padding after the tokens is never seen


@pytest.mark.parametrize(
    ("change", "shapes", "options", "reason"),
    [
        ({"task": None}, None, {}, "not a Transformers model of a known task"),
        ({"pooling": "unknown"}, None, {}, "pooling is unknown"),
        ({"training": True}, None, {}, "training mode"),
        ({"encoder_decoder": True}, None, {}, "encoder-decoder"),
        ({"experts": True}, None, {}, "mixture-of-experts"),
        ({}, {"inputs_embeds": (2, 20, 32), "attention_mask": (2, 20)}, {}, "no input_ids"),
        ({}, {"input_ids": (2, 20), "bbox": (2, 20, 4)}, {}, "no known padding: bbox"),
        ({}, {"input_ids": (2, 20), "attention_mask": (2, 19)}, {}, "different shapes"),
        ({}, {"input_ids": (2, 3, 20)}, {}, "not (batch, sequence)"),
        ({}, None, {"output_attentions": True}, "output_attentions"),
        ({}, None, {"past_key_values": object()}, "KV cache given"),
        ({}, None, {"cache": object()}, "KV cache given"),  # Transformers 5.24's name
    ],
)
def test_what_is_not_recognised_runs_unpadded(change, shapes, options, reason):
    result = plan_call(shapes or _text(2, 20), dataclasses.replace(BERT, **change), options=options)
    assert isinstance(result, str) and reason in result


def test_float_inputs_and_positional_calls_run_unpadded():
    assert "not integer" in plan_call(_text(2, 20), BERT, dtypes={"input_ids": "float"})
    assert "positional" in plan_call(_text(2, 20), BERT, positional=1)


def test_per_position_fields_by_task():
    assert policy.cut_fields("sequence_classification") == ("hidden_states",)
    assert policy.cut_fields("question_answering") == ("start_logits", "end_logits", "hidden_states")
    assert policy.cut_fields("base")[0] == "last_hidden_state"
    assert policy.row_ladder()[:5] == (1, 2, 4, 8, 16)


def test_only_pipelines_that_call_the_model_once_per_batch_are_bucketed():
    assert policy.pipeline_path("TextClassificationPipeline") and policy.pipeline_path("FillMaskPipeline")
    assert not policy.pipeline_path("TextGenerationPipeline")  # generate() buckets its own calls
    assert not policy.pipeline_path("MyTextClassificationPipeline")  # a subclass of yours: upstream's


def test_lm_eval_is_bucketed_only_for_a_known_release_and_a_causal_lm_on_one_tpu():
    assert policy.lm_eval_path("0.4.13", backend="causal", model_device="tpu") is None
    assert policy.lm_eval_path("0.4.14.dev0", backend="causal", model_device="tpu") is None
    assert "not on a TPU" in policy.lm_eval_path("0.4.13", backend="causal", model_device="cpu")
    for version in ("0.4.12", "0.5.0", None, "not a version"):
        assert "not a release whose HFLM is known" in policy.lm_eval_path(version, backend="causal", model_device="tpu")
    assert "seq2seq" in policy.lm_eval_path("0.4.13", backend="seq2seq", model_device="tpu")
    assert "several processes" in policy.lm_eval_path("0.4.13", backend="causal", model_device="tpu", processes=2)
    assert "parallelize" in policy.lm_eval_path("0.4.13", backend="causal", model_device="tpu", parallelize=True)
