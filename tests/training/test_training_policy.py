"""Training policy on plain data: batch buckets (``batch_buckets``) and decisions (``training_policy``)."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.training import buckets as batch_buckets, policy as training_policy
from transformers_tpu_ext.training.buckets import BatchPlan, ModelFacts, SourceFacts, choose_length, plan_batch, sequence_ladder

LADDER = sequence_ladder(2)


# -- sequence ladder and length choice ---------------------------------------------------------


def test_ladder_is_geometric_in_multiples_of_16():
    assert LADDER[:8] == (16, 32, 48, 64, 96, 128, 192, 256)
    assert sequence_ladder(1)[:5] == (16, 32, 64, 128, 256)
    assert all(r % 16 == 0 for r in LADDER)


def test_a_length_takes_its_rung():
    assert [choose_length(n, LADDER, used=()) for n in (1, 16, 17, 50, 97, 120)] == [16, 16, 32, 64, 128, 128]


def test_an_unused_rung_reuses_a_used_one_within_the_factor():
    # 96 not compiled yet, 128 is and costs 1.33x: reuse it; 64 -> 128 would cost 2x: compile 64.
    assert choose_length(90, LADDER, used={128}, reuse=1.5) == 128
    assert choose_length(60, LADDER, used={128}, reuse=1.5) == 64
    assert choose_length(60, LADDER, used={128}, reuse=2.0) == 128
    assert choose_length(90, LADDER, used={96, 128}, reuse=1.5) == 96  # its own rung, when used
    assert choose_length(90, LADDER, used={128}, reuse=1.0) == 96  # reuse off


def test_lengths_over_an_epoch_are_bounded_by_the_rungs():
    used: set[int] = set()
    for length in range(1, 121):
        used.add(choose_length(length, LADDER, used))
    assert used <= {r for r in LADDER if r <= 128}


# -- plan of one batch ---------------------------------------------------------------------------


def test_causal_lm_batch_pads_every_per_token_key_to_one_rung():
    shapes = {"input_ids": (4, 70), "attention_mask": (4, 70), "labels": (4, 70)}
    plan = plan_batch(shapes, ladder=LADDER, batch_size=4)
    assert plan == BatchPlan(rows=4, lengths={"input_ids": 96, "attention_mask": 96, "labels": 96}, sequence=96, sides=((96, 70),))
    assert plan.buckets == (96,) and not plan.add_mask and plan.pad_token_id is None


def test_partial_batch_is_completed_to_the_batch_size():
    shapes = {"input_ids": (3, 20), "labels": (3, 20)}
    assert plan_batch(shapes, ladder=LADDER, batch_size=4).rows == 4
    # evaluation, no labels, or a non-tensor value: rows stay as they are
    assert plan_batch(shapes, ladder=LADDER, batch_size=4, pad_rows=False).rows == 3
    assert plan_batch({"input_ids": (3, 20)}, ladder=LADDER, batch_size=4).rows == 3
    assert plan_batch({**shapes, "ids": None}, ladder=LADDER, batch_size=4).rows == 3
    # float labels on a per-token model: no value ignores an added row (or the padding): left alone
    assert isinstance(plan_batch(shapes, ladder=LADDER, batch_size=4, integer_labels=False), str)
    assert isinstance(plan_batch(shapes, ladder=LADDER, batch_size=4, dtypes={"labels": "float"}), str)


def test_sequence_classification_labels_have_no_sequence_axis():
    shapes = {"input_ids": (2, 20), "attention_mask": (2, 20), "labels": (2,)}
    classifier = ModelFacts(causal=False, per_token_labels=False)
    plan = plan_batch(shapes, ladder=LADDER, batch_size=4, model=classifier)
    assert plan.lengths == {"input_ids": 32, "attention_mask": 32} and plan.rows == 4
    # regression (float labels): no value to ignore an added row with
    assert plan_batch(shapes, ladder=LADDER, batch_size=4, model=classifier, dtypes={"labels": "float"}).rows == 2
    # 1-D labels on a model whose loss is per token: not what its loss expects, left alone
    assert "per-example labels" in plan_batch(shapes, ladder=LADDER, batch_size=4)


def test_unknown_tensor_on_the_sequence_axis_leaves_the_batch_alone():
    shapes = {"input_ids": (4, 20), "my_weights": (4, 20)}
    reason = plan_batch(shapes, ladder=LADDER, batch_size=4)
    assert isinstance(reason, str) and "my_weights" in reason


def test_batch_without_per_token_tensors_is_left_alone():
    assert isinstance(plan_batch({"pixel_values": (4, 3, 8, 8)}, ladder=LADDER), str)


# -- the batch predicate, rule by rule (docs/training.md's table is rendered from the same function) --


def _plan(shapes, model=ModelFacts(), source=SourceFacts(), **kwargs):
    return plan_batch(shapes, ladder=LADDER, batch_size=4, model=model, source=source, **kwargs)


LM = {"input_ids": (4, 20), "attention_mask": (4, 20), "labels": (4, 20)}


@pytest.mark.parametrize(
    "model, source, dtypes, words",
    [
        (ModelFacts(known=False), SourceFacts(), {}, "not a Transformers model"),
        (ModelFacts(), SourceFacts(), {"input_ids": "float"}, "not integer token ids"),
        (ModelFacts(), SourceFacts(custom_loss=True), {}, "loss of your own"),
        (ModelFacts(), SourceFacts(training=False, cuts_outputs=True, generates=True), {}, "generate()"),
        (ModelFacts(), SourceFacts(training=False), {}, "prediction_step of your own"),
        (ModelFacts(), SourceFacts(training=False, cuts_outputs=True, returns_inputs=True), {}, "include_for_metrics"),
        (ModelFacts(extra_outputs=True), SourceFacts(training=False, cuts_outputs=True), {}, "hidden states"),
    ],
)
def test_what_is_not_known_is_left_alone(model, source, dtypes, words):
    reason = _plan(LM, model, source, dtypes=dtypes)
    assert isinstance(reason, str) and words in reason, reason


def test_multi_label_float_labels_are_per_example():
    shapes = {"input_ids": (4, 20), "attention_mask": (4, 20), "labels": (4, 3)}
    classifier = ModelFacts(causal=False, per_token_labels=False)
    plan = _plan(shapes, classifier, dtypes={"labels": "float"})
    assert plan.lengths == {"input_ids": 32, "attention_mask": 32} and plan.rows == 4
    partial = {k: (3, *shape[1:]) for k, shape in shapes.items()}
    assert _plan(partial, classifier, dtypes={"labels": "float"}).rows == 3  # BCE has no ignored value


def test_a_last_token_classifier_pads_with_the_configs_pad_token_or_not_at_all():
    shapes = {"input_ids": (1, 20), "labels": (1,)}
    with_pad = ModelFacts(per_token_labels=False, pools_last_token=True, pad_token_id=7)
    assert _plan(shapes, with_pad).pad_token_id == 7
    assert "pad_token_id" in _plan(shapes, ModelFacts(per_token_labels=False, pools_last_token=True))


def test_packed_sequences_get_position_ids_no_mask_and_no_rows():
    packed = {"input_ids": (1, 150), "labels": (1, 150), "position_ids": (1, 150)}
    plan = _plan(packed, source=SourceFacts(packed=True))
    assert plan.lengths == {"input_ids": 192, "labels": 192, "position_ids": 192} and plan.rows == 1 and not plan.add_mask
    # detected from position ids without a mask too; the sequence index and the flash-attention
    # boundaries (DataCollatorWithFlattening(return_seq_idx=True), TRL's padding-free rows) are padded
    # as the last sequence's; any other key is unknown
    assert _plan(packed).rows == 1
    flat = {**packed, "seq_idx": (1, 150), "cu_seq_lens_q": (5,), "cu_seq_lens_k": (5,), "max_length_q": None}
    plan = _plan(flat, source=SourceFacts(packed=True))
    assert plan.lengths == {"input_ids": 192, "labels": 192, "position_ids": 192, "seq_idx": 192}
    assert batch_buckets.SEQUENCE_PADDING["seq_idx"] == batch_buckets.LAST_VALUE
    assert "my_ids" in _plan({**packed, "my_ids": (1, 150)}, source=SourceFacts(packed=True))
    assert "not causal" in _plan(packed, ModelFacts(causal=False), SourceFacts(packed=True))


def test_a_mask_is_added_where_padding_would_be_seen():
    blocks = {"input_ids": (4, 100), "labels": (4, 100)}
    bert = ModelFacts(causal=False)
    plan = _plan(blocks, bert)
    assert plan.add_mask and plan.lengths["attention_mask"] == plan.lengths["input_ids"] == 128
    assert not _plan(blocks).add_mask  # causal: nothing sees the padding
    assert _plan(blocks, ModelFacts(aux_loss=True)).add_mask  # a load-balancing loss counts unmasked tokens
    assert "takes no attention_mask" in _plan(blocks, ModelFacts(causal=False, accepts_attention_mask=False))


def test_padding_never_creates_a_position_past_the_table():
    gpt2 = ModelFacts(max_positions=200)
    assert _plan({"input_ids": (4, 195), "labels": (4, 195)}, gpt2).lengths["input_ids"] == 200
    assert _plan({"input_ids": (4, 150), "labels": (4, 150)}, gpt2).lengths["input_ids"] == 192
    assert "longer than the model's 200 positions" in _plan({"input_ids": (4, 230), "labels": (4, 230)}, gpt2)


def test_encoder_decoder_sides_each_take_their_own_bucket():
    t5 = ModelFacts(causal=False, encoder_decoder=True, max_decoder_positions=12)
    shapes = {"input_ids": (4, 100), "attention_mask": (4, 100), "labels": (4, 12), "decoder_input_ids": (4, 12)}
    plan = _plan(shapes, t5)
    assert plan.lengths == {"input_ids": 128, "attention_mask": 128, "labels": 12, "decoder_input_ids": 12}
    assert plan.sides == ((128, 100), (12, 12)) and plan.buckets == (128, 12)
    # evaluation: sides padded to one length could not be told apart in the outputs
    same = {"input_ids": (4, 40), "attention_mask": (4, 40), "labels": (4, 35)}
    evaluation = SourceFacts(training=False, cuts_outputs=True)
    assert "could not be told apart" in _plan(same, ModelFacts(causal=False, encoder_decoder=True), evaluation)
    assert "not an encoder-decoder" in _plan({**LM, "decoder_input_ids": (4, 20)})


def test_evaluation_pads_lengths_never_rows():
    plan = _plan({k: (3, 33) for k in LM}, source=SourceFacts(training=False, cuts_outputs=True))
    assert plan.rows == 3 and plan.sides == ((48, 33),)


def test_warmup_pads_the_encoder_side_to_the_length_asked():
    plan = _plan(LM, length=64)
    assert plan.lengths["input_ids"] == 64 and plan.sequence == 64


def test_evaluation_outputs_are_cut_on_the_axis_of_their_side():
    sides = ((64, 50), (16, 9))
    assert batch_buckets.cut_length((4, 64, 320), sides) == 50
    assert batch_buckets.cut_length((4, 16, 320), sides) == 9
    assert batch_buckets.cut_length((4, 320), sides) is None
    assert batch_buckets.cut_length((4,), sides) is None
    assert batch_buckets.cut_length((4, 64), ((64, 64),)) is None  # not padded


# -- settings ------------------------------------------------------------------------------------


def test_settings_from_the_environment():
    assert batch_buckets.settings({}) == batch_buckets.Settings(True, sequence_ladder(2), 1.5)
    assert batch_buckets.settings({"TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS": "0"}).enabled is False
    custom = batch_buckets.settings({"TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS": "512,128,256"})
    assert custom.ladder == (128, 256, 512)
    assert batch_buckets.settings({"TRANSFORMERS_TPU_EXT_TRAIN_STEPS_PER_OCTAVE": "1"}).ladder[:3] == (16, 32, 64)
    assert batch_buckets.settings({"TRANSFORMERS_TPU_EXT_TRAIN_REUSE": "1"}).reuse == 1.0


@pytest.mark.parametrize(
    "name, value",
    [("TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS", "big"), ("TRANSFORMERS_TPU_EXT_TRAIN_STEPS_PER_OCTAVE", "0"),
     ("TRANSFORMERS_TPU_EXT_TRAIN_REUSE", "0.5")],
)
def test_bad_settings_name_the_variable(name, value):
    with pytest.raises(ValueError, match=name):
        batch_buckets.settings({name: value})


# -- distributed decisions -----------------------------------------------------------------------


def test_process_group_backend():
    assert training_policy.process_group_backend(None) == "tpu_dist"
    assert training_policy.process_group_backend("tpu") == "tpu"
    with pytest.raises(ValueError, match="cannot reduce TPU tensors.*tpu_dist"):
        training_policy.process_group_backend("nccl")


def test_wrapper_kind():
    assert training_policy.wrapper_kind(["OptimizedModule", "DistributedDataParallel", "Model"], False) == "ddp"
    assert training_policy.wrapper_kind(["FSDPQwen3ForCausalLM"], True) == "fsdp"
    assert training_policy.wrapper_kind(["FullyShardedDataParallel"], False) == "fsdp1"
    assert training_policy.wrapper_kind(["Qwen3ForCausalLM"], True) == "fsdp"  # tensor parallel (DTensor)
    assert training_policy.wrapper_kind(["Qwen3ForCausalLM"], False) is None


def test_replica_problems():
    ok = dict(world_size=2, num_processes=2, wrapper="ddp", trainable=True)
    assert training_policy.replica_problem(**ok) is None
    assert training_policy.replica_problem(**{**ok, "world_size": 1, "num_processes": 1, "wrapper": None}) is None
    alone = training_policy.replica_problem(**{**ok, "num_processes": 1, "wrapper": None})
    assert "every process would train its own copy" in alone and "transformers-tpu launch" in alone
    unsynced = training_policy.replica_problem(**{**ok, "wrapper": None})
    assert "unsynchronised replicas" in unsynced and "DDP or FSDP2" in unsynced
    assert "FSDP2" in training_policy.replica_problem(**{**ok, "wrapper": "fsdp1"})
    assert training_policy.replica_problem(**{**ok, "wrapper": None, "trainable": False}) is None


# -- compile and optimizer -----------------------------------------------------------------------


def test_compile_settings_for_tpu():
    assert training_policy.adapt_compile(None, None) == ("tpu", None, [])
    assert training_policy.adapt_compile("tpu", "default") == ("tpu", "default", [])
    backend, mode, notes = training_policy.adapt_compile("inductor", "max-autotune")
    assert (backend, mode) == ("tpu", None) and len(notes) == 2 and "inductor" in notes[0]


ADAMW = "torch.optim.adamw.AdamW"


@pytest.mark.parametrize("kind", ["torch.optim.adam.Adam", ADAMW])
def test_adam_and_adamw_are_adapted_during_the_step(kind):
    default = training_policy.optimizer_plan(kind, {"lr": 1e-3, "foreach": None, "fused": None})
    assert default.action == "adapt" and default.tensor_lr and default.compile_step
    assert default.settings == {"foreach": True, "capturable": True}
    fused = training_policy.optimizer_plan(kind, {"lr": 0.0, "fused": True})
    assert fused.action == "adapt" and fused.tensor_lr and fused.settings == {} and not fused.compile_step


@pytest.mark.parametrize(
    "kind, group, kwargs, words",
    [
        ("torch.optim.sgd.SGD", {"lr": 0.1}, {}, "not an optimizer known"),
        ("transformers.optimization.Adafactor", {"lr": None}, {}, "not an optimizer known"),
        ("my.AdamWSubclass", {"lr": 1e-3}, {}, "not an optimizer known"),
        (ADAMW, {"lr": 1e-3, "foreach": False}, {}, "foreach=False"),
        (ADAMW, {"lr": 1e-3, "differentiable": True}, {}, "differentiable"),
        (ADAMW, {"lr": object()}, {}, "not a Python number"),
        (ADAMW, {"lr": 1e-3}, {"sharded": True}, "DTensor"),
        (ADAMW, {"lr": 1e-3, "fused": True}, {"on_device": False}, "not all dense"),
    ],
)
def test_every_other_optimizer_steps_as_made(kind, group, kwargs, words):
    plan = training_policy.optimizer_plan(kind, group, **kwargs)
    assert plan.action == "leave" and words in plan.reason and not plan.tensor_lr and not plan.settings


def test_a_trainer_that_reads_every_row_gets_no_rows():
    # TRL's DPO pairs the halves of the rows; SFT counts the mask's tokens: lengths padded, rows kept
    dpo = {"input_ids": (6, 70), "attention_mask": (6, 70), "completion_mask": (6, 70)}
    plan = _plan(dpo, source=SourceFacts(keeps_rows=True))
    assert plan.rows == 6 and plan.lengths["completion_mask"] == 96
    assert batch_buckets.SEQUENCE_PADDING["completion_mask"] == 0
    assert _plan(_lm_shapes(3, 20), source=SourceFacts(keeps_rows=True)).rows == 3
    assert _plan(_lm_shapes(3, 20)).rows == 4


def _lm_shapes(rows, length):
    return {"input_ids": (rows, length), "attention_mask": (rows, length), "labels": (rows, length)}
