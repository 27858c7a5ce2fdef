"""The plain facts the batch predicate decides from, read off real Transformers models and Trainers
(``transformers_tpu_ext.training.facts``): what a model is decides what padding is exact for it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import _paths  # noqa: E402

from transformers_tpu_ext.training.facts import model_facts, packs, source_facts  # noqa: E402


def test_a_decoder_only_lm_is_causal_with_per_token_labels():
    facts = model_facts(_paths.causal_lm("qwen3"))
    assert facts.known and facts.causal and facts.per_token_labels and not facts.encoder_decoder
    assert facts.max_positions == 512 and facts.accepts_attention_mask and not facts.extra_outputs


def test_gpt2_and_bert_have_position_tables_and_bert_is_not_causal():
    gpt2 = model_facts(_paths.causal_lm("gpt2", n_positions=200))
    assert gpt2.causal and gpt2.max_positions == 200
    bert = model_facts(_paths.bert_mlm(max_position_embeddings=200))
    assert bert.known and not bert.causal and bert.per_token_labels and bert.max_positions == 200


def test_t5_has_two_sides():
    facts = model_facts(_paths.t5())
    assert facts.known and facts.encoder_decoder and not facts.causal and facts.per_token_labels


def test_a_decoder_classifier_pools_its_last_token_and_knows_its_pad_token():
    with_pad = model_facts(_paths.classifier(num_labels=3, pad_token_id=5))
    assert with_pad.known and with_pad.pools_last_token and with_pad.pad_token_id == 5 and not with_pad.per_token_labels
    assert model_facts(_paths.classifier(num_labels=3, pad_token_id=None)).pad_token_id is None


def test_what_is_not_a_known_task_is_unknown():
    assert not model_facts(torch.nn.Linear(4, 2)).known
    from transformers import AutoModel

    assert not model_facts(AutoModel.from_config(_paths.bert_config())).known  # a bare encoder: no task head


def test_wrappers_are_seen_through():
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(_paths.causal_lm("qwen3"), peft.LoraConfig(r=4, target_modules=["q_proj"]))
    assert model_facts(lora) == model_facts(lora.get_base_model())
    assert model_facts(lora).known and model_facts(lora).causal


def test_router_logits_are_an_auxiliary_loss_and_extra_outputs():
    model = _paths.causal_lm("qwen3")
    model.config.output_router_logits = True
    facts = model_facts(model)
    assert facts.aux_loss and facts.extra_outputs


def test_the_loop_facts_of_a_trainer(tmp_path):
    from transformers import DataCollatorWithFlattening, Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer

    plain = _paths.trainer(tmp_path, cpu=True, model=_paths.causal_lm("qwen3"))
    facts = source_facts(plain, plain.data_collator, training=False)
    assert facts.cuts_outputs and not facts.custom_loss and not facts.generates and not facts.packed

    class OwnLoss(Trainer):
        def compute_loss(self, model, inputs, **kwargs):
            return super().compute_loss(model, inputs, **kwargs)

    class OwnStep(Trainer):
        def prediction_step(self, *args, **kwargs):
            return super().prediction_step(*args, **kwargs)

    own_loss = _paths.trainer(tmp_path, cpu=True, model=_paths.causal_lm("qwen3"), trainer_class=OwnLoss)
    assert source_facts(own_loss, None, training=True).custom_loss
    own_step = _paths.trainer(tmp_path, cpu=True, model=_paths.causal_lm("qwen3"), trainer_class=OwnStep)
    assert not source_facts(own_step, None, training=False).cuts_outputs
    generating = _paths.trainer(
        tmp_path, cpu=True, model=_paths.causal_lm("qwen3"), trainer_class=Seq2SeqTrainer,
        args_class=Seq2SeqTrainingArguments, predict_with_generate=True, include_for_metrics=["inputs"],
    )
    facts = source_facts(generating, None, training=False)
    assert facts.generates and facts.cuts_outputs and facts.returns_inputs
    assert not source_facts(generating, None, training=True).generates
    assert packs(DataCollatorWithFlattening()) and not packs(plain.data_collator)
