"""Issue 40: the losses the batch predicate knows (TRL's RewardTrainer, KTO, ORPO, CPO, GMPO besides SFT, DPO
and GRPO), their batches' own keys (``BatchLayout``), and a loss of your own declared padding-safe
(``ignores_padding``). Plain data, and tiny tensors for the collator: milliseconds."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.training import losses
from transformers_tpu_ext.training.buckets import BatchLayout, ModelFacts, SourceFacts, plan_batch, sequence_ladder
from transformers_tpu_ext.training.losses import KNOWN_LOSSES, declared_check, ignores_padding, library_loss

LADDER = sequence_ladder(2)
REWARD = "trl.trainer.reward_trainer.RewardTrainer"
KTO = "trl.trainer.kto_trainer.KTOTrainer"
ORPO = "trl.experimental.orpo.orpo_trainer.ORPOTrainer"
CPO = "trl.experimental.cpo.cpo_trainer.CPOTrainer"
GMPO = "trl.experimental.gmpo.gmpo_trainer.GMPOTrainer"


@pytest.mark.parametrize(
    "trainer, options",
    [
        (REWARD, {}),
        (KTO, {"loss_type": "kto"}),
        (KTO, {"loss_type": "apo_zero_unpaired"}),
        (ORPO, {}),
        (CPO, {"loss_type": "simpo"}),
        (CPO, {"loss_type": "ipo"}),
        (GMPO, {"loss_type": "dapo"}),  # GMPO's own loss, whatever GRPO's option says
    ],
)
def test_the_trainers_of_trl_1_16_that_were_read_are_known(trainer, options):
    assert library_loss(trainer, version="1.16.0", options=options) is KNOWN_LOSSES[trainer]


@pytest.mark.parametrize(
    "trainer, version, options, words",
    [
        (KTO, "1.16.0", {"loss_type": "bco"}, "only apo_zero_unpaired, kto were read"),
        (CPO, "1.16.0", {"loss_type": "aot"}, "loss_type='aot'"),
        (ORPO, "1.17.0", {}, "only TRL >= 1.16, < 1.17"),  # trl.experimental: may change in any release
        (REWARD, "1.16.0", {"use_liger_kernel": True}, "Liger"),
        ("trl.trainer.rloo_trainer.RLOOTrainer", "1.16.0", {}, "a loss of your own"),
    ],
)
def test_what_was_not_read_stays_a_loss_of_your_own(trainer, version, options, words):
    reason = library_loss(trainer, version=version, options=options)
    assert isinstance(reason, str) and words in reason, reason


def test_only_the_losses_whose_steps_select_by_a_count_keep_tensors_on_the_host():
    assert {name.rsplit(".", 1)[1] for name, loss in KNOWN_LOSSES.items() if loss.counts} == {
        "DPOTrainer", "KTOTrainer", "GRPOTrainer", "GMPOTrainer"
    }


# -- a library trainer's own keys --------------------------------------------------------------------

ORPO_LAYOUT = KNOWN_LOSSES[ORPO].layout
KTO_LAYOUT = KNOWN_LOSSES[KTO].layout
_ORPO_BATCH = {
    "chosen_input_ids": (4, 20), "chosen_attention_mask": (4, 20), "chosen_labels": (4, 20),
    "rejected_input_ids": (4, 25), "rejected_attention_mask": (4, 25), "rejected_labels": (4, 25),
    "prompt_input_ids": (4, 9), "prompt_attention_mask": (4, 9), "prompt": None, "chosen": None, "rejected": None,
}


def _plan(shapes, layout, model=None, **kwargs):
    source = SourceFacts(keeps_rows=True, layout=layout)
    return plan_batch(shapes, ladder=LADDER, batch_size=4, model=model or ModelFacts(pad_token_id=0), source=source, **kwargs)


def test_chosen_and_rejected_answers_are_padded_together_and_the_prompts_left_alone():
    plan = _plan(_ORPO_BATCH, ORPO_LAYOUT)
    assert set(plan.lengths) == {k for k in _ORPO_BATCH if k.startswith(("chosen_", "rejected_"))}
    assert set(plan.lengths.values()) == {32} and plan.rows == 4  # ORPO concatenates them to the longer one
    assert plan.fills["chosen_labels"] == plan.fills["rejected_labels"] == -100
    assert plan.fills["chosen_attention_mask"] == 0 and plan.fills["rejected_input_ids"] == "pad_token_id"


def test_kto_s_completions_and_kl_completions_take_their_own_buckets():
    shapes = {
        "input_ids": (4, 30), "attention_mask": (4, 30), "completion_mask": (4, 30),
        "KL_input_ids": (4, 50), "KL_attention_mask": (4, 50), "KL_completion_mask": (4, 50),
        "label": (4,), "ref_logps": (4,),
    }
    plan = _plan(shapes, KTO_LAYOUT)
    assert plan.lengths["input_ids"] == plan.lengths["completion_mask"] == 32
    assert plan.lengths["KL_input_ids"] == plan.lengths["KL_completion_mask"] == 64
    assert plan.buckets == (32, 64)
    warm = _plan(shapes, KTO_LAYOUT, length=64)  # warmup(): every group to the length asked
    assert set(warm.lengths.values()) == {64}


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"chosen_pixel_values": (4, 3, 8, 8)}, "'chosen_pixel_values' in the trainer's batches: not read"),
        ({"chosen_token_type_ids": (4, 20), "chosen_seq_lens": (4, 20)}, "'chosen_seq_lens'"),
        ({"chosen_labels": (3, 20)}, "different numbers of rows"),
    ],
)
def test_a_key_the_layout_does_not_name_leaves_the_batch_as_collated(changes, words):
    reason = _plan({**_ORPO_BATCH, **changes}, ORPO_LAYOUT)
    assert isinstance(reason, str) and words in reason, reason


def test_a_layout_is_for_the_decoder_only_models_it_was_read_for():
    t5 = ModelFacts(causal=False, encoder_decoder=True, pad_token_id=0)
    reason = _plan(_ORPO_BATCH, ORPO_LAYOUT, model=t5)
    assert isinstance(reason, str) and "decoder-only" in reason
    odd = {"input_ids": (4, 30), "attention_mask": (4, 30), "completion_mask": (4, 30), "label": (3,)}
    assert "'label' is not one value per row" in _plan(odd, KTO_LAYOUT)


def test_a_packed_row_may_be_longer_than_the_position_table():
    """Positions restart with each packed sequence (the padding's are 0): a row of 1,014 tokens for a model of 512
    positions is padded (it was left as collated, a program set per length: SFT with packing=True on rows of 256)."""
    packed = {"input_ids": (1, 1014), "labels": (1, 1014), "position_ids": (1, 1014), "seq_idx": (1, 1014),
              "cu_seq_lens_q": (14,), "cu_seq_lens_k": (14,), "max_length_q": None, "max_length_k": None}
    plan = _plan(packed, None, model=ModelFacts(pad_token_id=0, max_positions=512))
    assert plan.sequence == 1024 and plan.rows == 1
    unpacked = _plan({"input_ids": (1, 1014), "attention_mask": (1, 1014)}, None, model=ModelFacts(max_positions=512))
    assert unpacked == "sequences of 1014 tokens are longer than the model's 512 positions"


torch = pytest.importorskip("torch")


def test_the_collator_pads_each_prefixed_key_with_its_key_s_padding():
    from transformers_tpu_ext.training.collator import BucketCollator, original_of

    batch = {
        "chosen_input_ids": torch.full((2, 5), 7), "chosen_attention_mask": torch.ones(2, 5, dtype=torch.long),
        "chosen_labels": torch.full((2, 5), 7), "rejected_input_ids": torch.full((2, 18), 8),
        "rejected_attention_mask": torch.ones(2, 18, dtype=torch.long), "rejected_labels": torch.full((2, 18), 8),
        "prompt_input_ids": torch.full((2, 3), 9), "prompt": ["a", "b"],
    }
    collator = BucketCollator(lambda f: batch, batch_size=2, pad_token_id=0, model=ModelFacts(pad_token_id=0),
                              source=SourceFacts(keeps_rows=True, layout=ORPO_LAYOUT))
    padded = collator(None)
    assert original_of(padded) is not None and padded["chosen_input_ids"].shape == padded["rejected_labels"].shape == (2, 32)
    assert padded["chosen_input_ids"][0, 5:].eq(0).all() and padded["chosen_labels"][0, 5:].eq(-100).all()
    assert padded["chosen_attention_mask"][0].sum() == 5 and padded["rejected_labels"][0, 18:].eq(-100).all()
    assert padded["prompt_input_ids"].shape == (2, 3) and padded["prompt"] == ["a", "b"]  # unread: as collated
    warm = collator.pad_to(batch, 16, 2)  # warmup(): every padded key cut to the bucket, the prompts as they are
    assert warm["rejected_input_ids"].shape == warm["chosen_labels"].shape == (2, 16)


def test_warmup_cuts_a_packed_row_to_each_bucket():
    """``warmup()`` of packed rows (TRL's padding-free SFT): every per-token key (``seq_idx`` too) is cut to the
    bucket and the sequence boundaries end there. Before, ``seq_idx`` kept the row's 512 tokens, so every bucket
    was warmed at 512 and the first real step compiled its own."""
    from transformers_tpu_ext.training.collator import BucketCollator

    bounds = torch.tensor([0, 100, 250, 400, 512], dtype=torch.int32)
    row = {
        "input_ids": torch.arange(512)[None], "labels": torch.arange(512)[None],
        "position_ids": torch.cat([torch.arange(n) for n in bounds.diff().tolist()])[None],
        "seq_idx": torch.repeat_interleave(torch.arange(4), bounds.diff())[None].int(),
        "cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": 150, "max_length_k": 150,
    }
    collator = BucketCollator(lambda f: row, batch_size=4, pad_token_id=0, model=ModelFacts(pad_token_id=0),
                              source=SourceFacts(keeps_rows=True))
    warm = collator.pad_to(row, 128, 4)
    assert {k: tuple(warm[k].shape) for k in ("input_ids", "labels", "position_ids", "seq_idx")} == dict.fromkeys(
        ("input_ids", "labels", "position_ids", "seq_idx"), (1, 128))
    assert warm["cu_seq_lens_q"].tolist() == [0, 100, 128] and warm["max_length_q"] == 100
    assert warm.original["buckets"] == (128,)


# -- a loss of your own, declared ---------------------------------------------------------------------------


def test_ignores_padding_marks_a_method_a_function_or_a_class():
    class Mine:
        @ignores_padding
        def compute_loss(self, model, inputs, **kwargs):
            return 0

    @ignores_padding(rows=False)
    class Pairs:
        pass

    def loss_func(outputs, labels, num_items_in_batch=None):
        return 0

    assert ignores_padding(loss_func) is loss_func
    assert getattr(Mine.compute_loss, losses.DECLARED) == losses.PaddingDeclaration(rows=True)
    assert getattr(Pairs, losses.DECLARED).rows is False
    assert getattr(loss_func, losses.DECLARED).rows is True


def test_the_declaration_holds_within_float_noise_and_is_refused_past_it():
    assert declared_check("Mine.compute_loss", 2.31, 2.31 + 2e-6, "4x37 padded to 4x64") is None
    problem = declared_check("Mine.compute_loss", 2.31, 2.45, "4x37 padded to 5x64")
    assert problem.startswith("Mine.compute_loss is declared with @ignores_padding, but its loss on the first batch is 2.31")
    assert "2.45 padded (4x37 padded to 5x64): it reads the padding. Remove @ignores_padding" in problem


def test_a_loss_the_plugin_does_not_know_is_named_with_the_way_to_declare_it():
    source = SourceFacts(custom_loss=True, own_loss="MyTrainer.compute_loss (my.MyTrainer), a loss of your own")
    reason = plan_batch({"input_ids": (4, 70), "labels": (4, 70)}, ladder=LADDER, source=source)
    assert reason == (
        "MyTrainer.compute_loss (my.MyTrainer), a loss of your own: whether it ignores padding is unknown "
        "(if it ignores padded positions and rows, declare it with transformers_tpu_ext.training.ignores_padding)"
    )


def _trainer_class(module, name, bases=(), **methods):
    cls = type(name, bases, dict(methods))
    cls.__module__, cls.__qualname__ = module, name
    return cls


def test_the_loss_is_the_most_derived_class_defining_it():
    """``GMPOTrainer`` (``trl.experimental``) subclasses ``GRPOTrainer`` and replaces ``_compute_loss``: its loss
    is GMPO's, not GRPO's (before, any subclass living in TRL counted as the class it derives from)."""
    from types import SimpleNamespace

    from transformers_tpu_ext.training.facts import _loss_class, known_loss

    def step(self, *args):
        return None

    grpo = _trainer_class("trl.trainer.grpo_trainer", "GRPOTrainer", compute_loss=step, _compute_loss=step)
    gmpo = _trainer_class("trl.experimental.gmpo.gmpo_trainer", "GMPOTrainer", (grpo,), _compute_loss=step)
    alias = _trainer_class("trl.experimental.kto", "KTOTrainer",
                           (_trainer_class("trl.trainer.kto_trainer", "KTOTrainer", compute_loss=step),), __init__=step)
    mine = _trainer_class("my.trainers", "Shorter", (gmpo,), _compute_loss=step)
    args = SimpleNamespace(loss_type="dapo", use_liger_kernel=False)
    assert _loss_class(object.__new__(gmpo)) == (GMPO, "GMPOTrainer._compute_loss")
    assert _loss_class(object.__new__(alias))[0] == KTO  # an alias that only changes __init__ is KTO's
    trainer = object.__new__(gmpo)
    trainer.args, trainer.compute_loss_func = args, None
    assert known_loss(trainer) is KNOWN_LOSSES[GMPO]
    own = object.__new__(mine)
    own.args, own.compute_loss_func = args, None
    assert known_loss(own) == "Shorter overrides Shorter._compute_loss: a loss of your own"


def test_a_declaration_on_the_function_the_method_or_the_class_is_read():
    from transformers_tpu_ext.training.facts import declared

    plain = _trainer_class("my.trainers", "Plain", compute_loss=lambda self, *a, **k: 0)
    method = _trainer_class("my.trainers", "Method", compute_loss=ignores_padding(lambda self, *a, **k: 0))
    klass = ignores_padding(_trainer_class("my.trainers", "Klass", (plain,)), rows=False)
    def rows(cls, func=None):
        trainer = object.__new__(cls)
        trainer.compute_loss_func = func
        found = declared(trainer)
        return None if found is None else found.rows

    assert rows(plain) is None
    assert rows(method) is True and rows(klass) is False
    assert rows(plain, ignores_padding(lambda *a, **k: 0)) is True


def test_a_trainer_that_makes_its_own_tensors_is_named_too(caplog):
    """TRL's RLOOTrainer collates lists of examples and makes its tensors in its step: not a batch the collator
    pads, but its loss is still named, once, with the way to declare it."""
    import logging

    from transformers_tpu_ext.training import collator

    collator._told.clear()
    own = SourceFacts(custom_loss=True, own_loss="RLOOTrainer: a loss of your own (compute_loss or compute_loss_func)")
    bucket = collator.BucketCollator(lambda f: list(f), batch_size=4, model=ModelFacts(), source=own)
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        assert bucket([{"prompt": "a"}]) == [{"prompt": "a"}] and bucket([{"prompt": "b"}]) == [{"prompt": "b"}]
    said = [r.getMessage() for r in caplog.records if "RLOOTrainer" in r.getMessage()]
    assert len(said) == 1 and "batches left as the trainer makes them: RLOOTrainer: a loss of your own" in said[0]
    assert "transformers_tpu_ext.training.ignores_padding" in said[0]
