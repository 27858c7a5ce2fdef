"""TRL's trainers on TPU: their losses are known to the batch predicate (``training/losses.py``), so
SFT (plain, completion-only, packed) and DPO batches are padded to buckets: the second epoch compiles
nothing (cache-only mode), and the losses equal the CPU's, with and without a PEFT LoRA adapter."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.training import losses
from transformers_tpu_ext.training.losses import library_loss

SFT = "trl.trainer.sft_trainer.SFTTrainer"
DPO = "trl.trainer.dpo_trainer.DPOTrainer"


def test_the_losses_of_trl_that_were_read_are_known():
    assert library_loss(SFT, version="1.16.0", options={"loss_type": "nll"}) is losses.KNOWN_LOSSES[SFT]
    assert library_loss(SFT, version="1.17.0.dev0", options={"loss_type": "dft"}) is losses.KNOWN_LOSSES[SFT]
    assert library_loss(DPO, version="1.16.0", options={"loss_type": ["sigmoid"]}) is losses.KNOWN_LOSSES[DPO]
    assert library_loss(DPO, version="1.16.0", options={"loss_type": ["sigmoid", "sft"]}) is losses.KNOWN_LOSSES[DPO]


@pytest.mark.parametrize(
    "defined_by, version, options, func, words",
    [
        ("my.Trainer", "1.16.0", {}, False, "a loss of your own"),
        (SFT, "0.19.1", {"loss_type": "nll"}, False, "only TRL >= 1.16, < 2.0"),
        (SFT, "2.0.0", {"loss_type": "nll"}, False, "only TRL >= 1.16"),
        (SFT, None, {"loss_type": "nll"}, False, "only TRL"),
        (SFT, "1.16.0", {"loss_type": "nll"}, True, "compute_loss_func"),
        (SFT, "1.16.0", {"loss_type": "nll", "use_liger_kernel": True}, False, "Liger"),
        (SFT, "1.16.0", {"loss_type": "chunked"}, False, "loss_type='chunked'"),
        (DPO, "1.16.0", {"loss_type": ["sigmoid", "bco_pair"]}, False, "bco_pair"),
        (DPO, "1.16.0", {"loss_type": ["sigmoid"], "use_weighting": True}, False, "use_weighting"),
    ],
)
def test_anything_else_stays_a_loss_of_your_own(defined_by, version, options, func, words):
    reason = library_loss(defined_by, version=version, compute_loss_func=func, options=options)
    assert isinstance(reason, str) and words in reason, reason


torch = pytest.importorskip("torch")


def test_a_packed_row_s_padding_joins_its_last_sequence():
    from transformers_tpu_ext.training import buckets
    from transformers_tpu_ext.training.collator import BucketCollator, original_of

    # TRL's padding-free row (also DataCollatorWithFlattening(return_seq_idx=True, return_flash_attn_kwargs=True)):
    # three sequences of 4, 6 and 3 tokens
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1, 2]])
    bounds = torch.tensor([0, 4, 10, 13], dtype=torch.int32)
    row = {
        "input_ids": torch.arange(5, 18)[None], "labels": torch.arange(5, 18)[None], "position_ids": positions,
        "seq_idx": torch.tensor([[0] * 4 + [1] * 6 + [2] * 3], dtype=torch.int32),
        "cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": 6, "max_length_k": 6,
    }
    padded = BucketCollator(lambda f: row, batch_size=4, pad_token_id=0, model=buckets.ModelFacts())(None)
    assert original_of(padded) is not None and padded["input_ids"].shape == (1, 16)
    assert padded["seq_idx"].tolist() == [[0] * 4 + [1] * 6 + [2] * 6]
    assert padded["position_ids"][0, 13:].tolist() == [0, 0, 0] and padded["labels"][0, 13:].tolist() == [-100] * 3
    assert padded["cu_seq_lens_q"].tolist() == padded["cu_seq_lens_k"].tolist() == [0, 4, 10, 16]
    assert (padded["max_length_q"], padded["max_length_k"]) == (6, 6)
    assert bounds.tolist() == [0, 4, 10, 13]  # the collator's own tensors are not written to


pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import _training  # noqa: E402
from _trl import COMMON, TOLERANCE, lora as _lora, pairs as _pairs, sft_data as _sft_data, steady  # noqa: E402

from transformers_tpu_ext.testing.tiny import tiny_model, tiny_tokenizer  # noqa: E402


def _sft(tmp, sim, *, use_cpu, mode, lora):
    _training.reset_accelerate()
    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"
    config = trl.SFTConfig(
        output_dir=str(tmp), use_cpu=use_cpu, packing=mode == "packed", max_length=128,
        completion_only_loss=mode == "completion", **COMMON,
    )
    callback = steady(sim)
    trainer = trl.SFTTrainer(
        model=tiny_model("qwen3", seed=0), args=config, train_dataset=_sft_data(mode == "completion"),
        processing_class=tokenizer, callbacks=[callback], peft_config=_lora() if lora else None,
    )
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.train()
    return trainer, callback.steps, batch


def _dpo(tmp, sim, *, use_cpu, lora):
    _training.reset_accelerate()
    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"
    config = trl.DPOConfig(output_dir=str(tmp), use_cpu=use_cpu, max_length=64, **COMMON)
    callback = steady(sim)
    trainer = trl.DPOTrainer(
        model=tiny_model("qwen3", seed=0), ref_model=None if lora else tiny_model("qwen3", seed=0), args=config,
        train_dataset=_pairs(), processing_class=tokenizer, callbacks=[callback], peft_config=_lora() if lora else None,
    )
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.train()
    return trainer, callback, batch


def _check(cpu, tpu, steps, batch):
    from transformers_tpu_ext.training.collator import original_of

    assert all(p.device.type == "tpu" for p in tpu.model.parameters())
    assert original_of(batch) is not None, "the TRL batch was not padded to a bucket"
    assert _training.max_diff(_training.losses(tpu), _training.losses(cpu)) < TOLERANCE
    assert steps and sum(steps) == 0, steps  # the second epoch compiled nothing (and cache-only did not raise)


@pytest.mark.slow
@pytest.mark.parametrize("mode, lora", [("plain", False), ("completion", True), ("packed", False), ("packed", True)])
def test_sft_reaches_steady_state_like_cpu(simulated_tpu, tmp_path, mode, lora):
    cpu, _, _ = _sft(tmp_path / "cpu", simulated_tpu, use_cpu=True, mode=mode, lora=lora)
    tpu, steps, batch = _sft(tmp_path / "tpu", simulated_tpu, use_cpu=False, mode=mode, lora=lora)
    _check(cpu, tpu, steps, batch)
    if mode == "completion":  # the prompt half is not trained on
        assert (batch["labels"][0, :4] == -100).all() and (batch["labels"][0] != -100).any()
    if mode == "packed":
        assert "position_ids" in batch and "attention_mask" not in batch
        assert int(batch["cu_seq_lens_q"][-1]) == batch["input_ids"].shape[1]  # the padding is in the last sequence
        assert batch["max_length_q"] >= int(batch["cu_seq_lens_q"].diff().max())
    else:  # no rows added: TRL's num_tokens counts the mask's tokens, as on the CPU
        assert [e["num_tokens"] for e in cpu.state.log_history if "loss" in e] == [
            e["num_tokens"] for e in tpu.state.log_history if "loss" in e
        ]


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_dpo_reaches_steady_state_like_cpu(simulated_tpu, tmp_path, lora):
    cpu, _, _ = _dpo(tmp_path / "cpu", simulated_tpu, use_cpu=True, lora=lora)
    tpu, epoch, batch = _dpo(tmp_path / "tpu", simulated_tpu, use_cpu=False, lora=lora)
    # TRL 1.16 logs logits/chosen and logits/rejected as x[completion_mask.bool()].sum(): a 1-D sum whose
    # length is the batch's count of completion tokens. Those sums run on the host (host_counts): the second
    # epoch, in cache-only mode, compiled nothing at all (before: a tiny program per count not seen yet).
    assert len(epoch.steps) == 3 and epoch.new == [], [key[:120] for _, key in epoch.new]
    _check(cpu, tpu, epoch.steps, batch)
    assert batch["input_ids"].shape[0] == 8  # 4 pairs, no rows added: the halves stay chosen / rejected
    for key in ("rewards/chosen", "rewards/margins", "logits/chosen", "logits/rejected"):
        got = [e[key] for e in tpu.state.log_history if key in e]
        want = [e[key] for e in cpu.state.log_history if key in e]
        assert got and _training.max_diff(got, want) < TOLERANCE


@pytest.mark.slow  # most of it is importing TRL's trainers
def test_the_facts_read_off_trl_trainers(simulated_tpu, tmp_path):
    from transformers_tpu_ext.training.buckets import plan_batch, sequence_ladder
    from transformers_tpu_ext.training.facts import source_facts

    def sft(**extra):
        _training.reset_accelerate()
        config = trl.SFTConfig(output_dir=str(tmp_path), use_cpu=True, max_length=64, **COMMON)
        return trl.SFTTrainer(model=tiny_model("qwen3", seed=0), args=config, train_dataset=_sft_data(False),
                              processing_class=tiny_tokenizer(), **extra)

    known = source_facts(sft(), None, True)
    assert not known.custom_loss and known.keeps_rows
    own = source_facts(sft(compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.logits.sum()), None, True)
    assert own.custom_loss and not own.keeps_rows
    reason = plan_batch({"input_ids": (4, 40), "labels": (4, 40)}, ladder=sequence_ladder(), source=own)
    # said once in the log when the first batch is left alone, naming the trainer and the way to declare it
    assert reason.startswith("SFTTrainer: TRL's SFT loss with a compute_loss_func of your own: whether it ignores padding")
    assert "transformers_tpu_ext.training.ignores_padding" in reason


def test_a_subclass_that_changes_a_loss_helper_is_a_loss_of_your_own(simulated_tpu, tmp_path):

    class Weighted(trl.DPOTrainer):  # a user's DPO variant: its loss is not TRL's
        def dpo_loss(self, *args, **kwargs):
            return super().dpo_loss(*args, **kwargs)

    class Logged(trl.SFTTrainer):  # a subclass that only adds a callback-like method keeps TRL's loss
        def log_something(self):
            return None

    class Changed(trl.SFTTrainer):
        def compute_loss(self, *args, **kwargs):
            return super().compute_loss(*args, **kwargs)

    from transformers_tpu_ext.training import facts

    assert facts._loss_helpers_of_your_own(object.__new__(Weighted)) == "Weighted.dpo_loss"
    assert facts._loss_helpers_of_your_own(object.__new__(Logged)) is None
    assert facts._loss_helpers_of_your_own(object.__new__(Changed)) == "Changed.compute_loss"


def _dpo_from_a_path(tmp, path, *, use_cpu):
    """DPO as its docs show it: the model named by a path, no reference model. TRL loads both the policy and its
    own reference model with ``from_pretrained``, where Transformers 5.25 turns Hub kernels on by default."""
    _training.reset_accelerate()
    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"
    config = trl.DPOConfig(output_dir=str(tmp), use_cpu=use_cpu, max_length=64, **{**COMMON, "num_train_epochs": 1})
    trainer = trl.DPOTrainer(model=str(path), args=config, train_dataset=_pairs(), processing_class=tokenizer)
    trainer.train()
    return trainer


@pytest.mark.slow
def test_dpo_without_a_reference_model_loads_and_trains_on_tpu_like_cpu(simulated_tpu, tmp_path):
    tiny_model("qwen3", seed=0).save_pretrained(tmp_path / "model")
    cpu = _dpo_from_a_path(tmp_path / "cpu", tmp_path / "model", use_cpu=True)
    tpu = _dpo_from_a_path(tmp_path / "tpu", tmp_path / "model", use_cpu=False)
    assert tpu.model.device.type == "tpu" and tpu.ref_model.device.type == "tpu"
    assert tpu.model.use_kernels is False and tpu.ref_model.use_kernels is False  # the default stayed off on TPU
    assert _training.max_diff(_training.losses(tpu), _training.losses(cpu)) < TOLERANCE
