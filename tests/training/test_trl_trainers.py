"""Issue 40: every trainer at steady state on the simulated TPU.

- TRL's ``RewardTrainer``, ``KTOTrainer`` and ``trl.experimental``'s ORPO and CPO: their batches are padded to
  buckets (their own keys: ``BatchLayout``), the second epoch runs in cache-only mode, and the losses are the
  CPU's;
- a loss of your own declared with ``ignores_padding``: padded and steady; one that reads the padding is
  refused at its first step, with the numbers;
- after ``training.warmup(trainer, max_length=...)``, every step of SFT with packing, SFT with
  ``torch_compile=True`` and gradient accumulation, DPO, KTO and GRPO runs in cache-only mode (count-shaped
  metrics on the host, every bucket and accumulation warmed), with the CPU's losses and metrics.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import _paths  # noqa: E402
import _training  # noqa: E402
from _trl import COMMON, like_cpu, logged, pairs, sft_data, steady, unpaired  # noqa: E402

from transformers_tpu_ext.testing.tiny import TINY_TEXT, save_tiny_model, tiny_config, tiny_model, tiny_tokenizer  # noqa: E402


def _tokenizer():
    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"
    return tokenizer


def _reward_model():
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(tiny_config("qwen3", num_labels=1, pad_token_id=0))


def _build(kind: str, tmp, *, use_cpu: bool, callbacks=(), **extra):
    """A TRL trainer of ``kind`` on the tiny context-sensitive Qwen3: two epochs, batch 4, float32."""
    _training.reset_accelerate()
    settings = dict(output_dir=str(tmp), use_cpu=use_cpu, **{**COMMON, **extra})
    callbacks = list(callbacks)
    if kind == "reward":
        config = trl.RewardConfig(max_length=64, **settings)
        return trl.RewardTrainer(model=_reward_model(), args=config, train_dataset=pairs(), processing_class=_tokenizer(),
                                 callbacks=callbacks)
    if kind in ("orpo", "cpo"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from trl.experimental.cpo import CPOConfig, CPOTrainer
            from trl.experimental.orpo import ORPOConfig, ORPOTrainer
        config_class, trainer_class = (ORPOConfig, ORPOTrainer) if kind == "orpo" else (CPOConfig, CPOTrainer)
        return trainer_class(model=tiny_model("qwen3", seed=0), args=config_class(max_length=64, **settings),
                             train_dataset=pairs(), processing_class=_tokenizer(), callbacks=callbacks)
    if kind == "kto":
        return trl.KTOTrainer(model=tiny_model("qwen3", seed=0), ref_model=tiny_model("qwen3", seed=0),
                              args=trl.KTOConfig(max_length=64, **settings), train_dataset=unpaired(),
                              processing_class=_tokenizer(), callbacks=callbacks)
    if kind == "dpo":
        return trl.DPOTrainer(model=tiny_model("qwen3", seed=0), ref_model=tiny_model("qwen3", seed=0),
                              args=trl.DPOConfig(max_length=64, **settings), train_dataset=pairs(),
                              processing_class=_tokenizer(), callbacks=callbacks)
    if kind.startswith("sft"):
        config = trl.SFTConfig(max_length=128, packing=kind == "sft_packed", **settings)
        # packed: rows of 455, 416, 451 and 198 tokens (the last batch's needs a rung of its own)
        data = sft_data(n=22 if kind == "sft_packed" else 24, max_length=120)
        return trl.SFTTrainer(model=tiny_model("qwen3", seed=0), args=config, train_dataset=data,
                              processing_class=_tokenizer(), callbacks=callbacks)
    raise ValueError(kind)


METRICS = {
    "reward": ("accuracy", "margin", "num_tokens", "mean_reward"),
    "orpo": ("rewards/chosen", "rewards/margins", "nll_loss", "log_odds_ratio"),
    "cpo": ("rewards/chosen", "rewards/margins", "nll_loss", "logps/chosen"),
    "kto": ("kl", "entropy", "logps/chosen", "logits/rejected", "num_tokens"),
    "dpo": ("rewards/chosen", "rewards/margins", "logits/chosen", "logits/rejected", "num_tokens"),
}


@pytest.mark.parametrize("kind", ["reward", "orpo", "cpo", "kto"])
def test_trl_trainers_reach_steady_state_like_cpu(simulated_tpu, tmp_path, kind):
    from transformers_tpu_ext.training.collator import original_of

    cpu = _build(kind, tmp_path / "cpu", use_cpu=True)
    cpu.train()
    epoch = steady(simulated_tpu)
    tpu = _build(kind, tmp_path / "tpu", use_cpu=False, callbacks=[epoch])
    batch = next(iter(tpu.get_train_dataloader()))
    tpu.train()
    assert original_of(batch) is not None, "the batch was not padded to a bucket"
    assert epoch.steps and sum(epoch.steps) == 0 and epoch.new == [], epoch.new[:3]  # cache-only did not raise
    like_cpu(cpu, tpu, METRICS[kind])
    if kind in ("orpo", "cpo"):  # chosen and rejected padded together, prompts (generation only) as collated
        assert batch["chosen_input_ids"].shape == batch["rejected_labels"].shape
        assert set(original_of(batch)["lengths"]) == {k for k in batch if k.startswith(("chosen_", "rejected_"))}
    if kind == "kto":
        assert batch["KL_input_ids"].shape[1] in (16, 32, 48, 64) and batch["label"].shape == (4,)


# -- a loss of your own ---------------------------------------------------------------------------------


def _own_trainer(tmp, *, use_cpu, reads_padding=False, declare=True, callbacks=()):
    from transformers import Trainer

    from transformers_tpu_ext.training import ignores_padding

    def token_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Cross-entropy of the next token, averaged over the labelled tokens (or, reading the padding, over
        every position of the batch)."""
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        logits, labels = outputs.logits[:, :-1], inputs["labels"][:, 1:]
        per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none")
        mask = labels.ne(-100)
        loss = (per_token * mask).sum() / (mask.numel() if reads_padding else mask.sum())
        return (loss, outputs) if return_outputs else loss

    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset

    cls = type("MyTrainer", (Trainer,), {"compute_loss": ignores_padding(token_loss) if declare else token_loss})
    return _paths.trainer(tmp, cpu=use_cpu, model=tiny_model("qwen3", seed=0), train=tiny_lm_dataset(22, seed=5, max_length=100),
                          collator=_training.collator(), trainer_class=cls, callbacks=callbacks, max_steps=-1, num_train_epochs=2)


def test_a_loss_declared_padding_safe_is_padded_and_steady(simulated_tpu, tmp_path, caplog):
    import logging

    from transformers_tpu_ext.training.collator import original_of

    cpu = _own_trainer(tmp_path / "cpu", use_cpu=True)
    cpu.train()
    epoch = steady(simulated_tpu)
    tpu = _own_trainer(tmp_path / "tpu", use_cpu=False, callbacks=[epoch])
    assert original_of(next(iter(tpu.get_train_dataloader()))) is not None
    with caplog.at_level(logging.INFO, logger="transformers_tpu_ext"):
        tpu.train()
    assert epoch.steps and sum(epoch.steps) == 0 and epoch.new == []
    like_cpu(cpu, tpu)
    assert any("MyTrainer.compute_loss ignores padding on the first batch" in r.getMessage() for r in caplog.records)


def test_a_declared_loss_that_reads_the_padding_is_refused(simulated_tpu, tmp_path):
    tpu = _own_trainer(tmp_path, use_cpu=False, reads_padding=True)
    with pytest.raises(ValueError, match=r"MyTrainer.compute_loss is declared with @ignores_padding, but its loss on the "
                                         r"first batch is [\d.]+ as collated and [\d.]+ padded \(4x\d+ padded to 5x\d+\): it "
                                         r"reads the padding. Remove @ignores_padding"):
        tpu.train()


def test_a_loss_of_your_own_is_named_with_the_way_to_declare_it(simulated_tpu, tmp_path, caplog):
    from transformers_tpu_ext.training import collator
    from transformers_tpu_ext.training.collator import original_of

    collator._told.clear()
    tpu = _own_trainer(tmp_path, use_cpu=False, declare=False)
    assert original_of(next(iter(tpu.get_train_dataloader()))) is None  # left as collated
    said = [r.getMessage() for r in caplog.records if "MyTrainer.compute_loss" in r.getMessage()]
    assert said and "a loss of your own: whether it ignores padding is unknown (if it ignores padded positions and " \
                    "rows, declare it with transformers_tpu_ext.training.ignores_padding)" in said[0]


# -- after warmup(), every step in cache-only mode ---------------------------------------------------------------


def _grpo(tmp, *, use_cpu, callbacks=()):
    _training.reset_accelerate()
    path = tmp.parent / "grpo-model"
    if not path.exists():
        save_tiny_model(path)
        config = json.loads((path / "generation_config.json").read_text())
        config["eos_token_id"] = [1, *range(40, 80)]  # completions stop early, at varying lengths
        (path / "generation_config.json").write_text(json.dumps(config))
    words = " ".join(TINY_TEXT).split()
    prompts = [" ".join(words[(i * 7) % 20: (i * 7) % 20 + 3 + (i * 5) % 20]) for i in range(8)]  # 3 to 22 words
    config = trl.GRPOConfig(
        output_dir=str(tmp), use_cpu=use_cpu, per_device_train_batch_size=4, num_generations=2, max_completion_length=12,
        num_train_epochs=2, logging_steps=1, report_to=[], learning_rate=1e-2, save_strategy="no", seed=0,
        disable_tqdm=True, bf16=False, generation_kwargs={"do_sample": False}, beta=0.04, entropy_coef=0.5,
    )
    return trl.GRPOTrainer(model=str(path), reward_funcs=lambda completions, **k: [len(set(t)) / (1 + len(t)) for t in completions],
                           args=config, train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
                           processing_class=tiny_tokenizer(), callbacks=list(callbacks))


WARMED = {
    "sft_packed": ({}, 512, ("entropy", "mean_token_accuracy")),
    # the CPU reference is not compiled (inductor on a CPU would take minutes; the values are the same)
    "sft_compiled": ({"torch_compile": True, "gradient_accumulation_steps": 2, "per_device_train_batch_size": 2}, 128,
                     ("entropy", "num_tokens")),
    "dpo": ({}, 64, METRICS["dpo"]),
    "kto": ({}, 64, METRICS["kto"]),
    "grpo": ({}, 64, ("reward", "kl", "entropy", "completions/mean_length", "completions/mean_terminated_length")),
}


@pytest.mark.parametrize("kind", list(WARMED))
def test_after_warmup_every_step_runs_in_cache_only_mode(simulated_tpu, tmp_path, kind):
    from transformers_tpu_ext.training import warmup

    settings, longest, metrics = WARMED[kind]
    reference = {k: v for k, v in settings.items() if k != "torch_compile"}
    build = (lambda tmp, **kw: _grpo(tmp, **kw)) if kind == "grpo" else (lambda tmp, **kw: _build(kind, tmp, **kw))
    if kind == "grpo":
        cpu = build(tmp_path / "cpu", use_cpu=True)
    else:
        cpu = _build(kind, tmp_path / "cpu", use_cpu=True, **reference)
    cpu.train()
    since = steady(simulated_tpu, since="step")
    tpu = build(tmp_path / "tpu", use_cpu=False, callbacks=[since]) if kind == "grpo" else _build(
        kind, tmp_path / "tpu", use_cpu=False, callbacks=[since], **settings)
    warmed = warmup(tpu, max_length=longest)
    tpu.train()
    assert warmed.lengths, "nothing was warmed up"
    assert since.steps and sum(since.steps) == 0 and since.new == [], since.new[:3]  # cache-only did not raise
    like_cpu(cpu, tpu, metrics)  # the warm-up left no trace: losses and logged metrics (token counts too)
    if kind == "grpo":
        assert len(set(logged(cpu, "completions/mean_length"))) > 2  # completions stop at varying lengths
