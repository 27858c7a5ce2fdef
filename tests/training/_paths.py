"""Shared pieces of the path tests (issue 19): tiny context-sensitive models of the kinds the issue names,
a Trainer builder, and the reference run (plain CPU, every patch of the plugin switched off).

Public APIs only (transformers, accelerate, transformers_tpu_ext.testing.tiny, _training.py): the
reference switches the plugin off with ``TRANSFORMERS_TPU_EXT_DISABLE=all``, whatever its modules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import _training
from _training import patches_disabled

#: Per-step losses of two runs of the same script agree to this (float32, tiny models).
TOLERANCE = 1e-3
VOCAB = 320
BATCH = 4


@contextlib.contextmanager
def reference_run() -> Iterator[None]:
    """The reference: every patch of the plugin off (``TRANSFORMERS_TPU_EXT_DISABLE=all``); run it with ``use_cpu=True``."""
    with patches_disabled("all"):
        yield


def both(run: Callable[[bool], Any]) -> tuple[Any, Any]:
    """``(run(cpu=True) with the plugin disabled, run(cpu=False) on the simulated TPU with the plugin)``."""
    with reference_run():
        cpu = run(True)
    _training.reset_accelerate()
    tpu = run(False)
    return cpu, tpu


def trainer(
    tmp: Any,
    *,
    cpu: bool,
    model: Any,
    train: Any = None,
    evaluation: Any = None,
    collator: Any = None,
    trainer_class: Any = None,
    args_class: Any = None,
    processing_class: Any = None,
    optimizers: Any = (None, None),
    callbacks: Any = (),
    compute_metrics: Any = None,
    **overrides: Any,
) -> Any:
    """A Trainer with the settings of tests/_training.py (batch 4, linear schedule, seed 0, log every step)."""
    from transformers import Trainer, TrainingArguments, default_data_collator

    _training.reset_accelerate()
    settings = dict(
        output_dir=str(tmp), per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH, max_steps=6,
        logging_steps=1, report_to=[], learning_rate=1e-3, lr_scheduler_type="linear", save_strategy="no",
        seed=0, disable_tqdm=True, use_cpu=cpu,
    )
    settings.update(overrides)
    return (trainer_class or Trainer)(
        model=model,
        args=(args_class or TrainingArguments)(**settings),
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=collator or default_data_collator,
        processing_class=processing_class,
        optimizers=optimizers,
        callbacks=list(callbacks),
        compute_metrics=compute_metrics,
    )


def losses(run: Any) -> list[float]:
    return _training.losses(run)


def max_diff(a: list[float], b: list[float]) -> float:
    return _training.max_diff(a, b)


# -- tiny models of the kinds the issue names (2 layers, width 32, context-sensitive init) -------------


def _init() -> float:
    from transformers_tpu_ext.testing.tiny import DEFAULT_INITIALIZER_RANGE

    return DEFAULT_INITIALIZER_RANGE


def _seeded(build: Callable[[], Any], seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    return build()


def causal_lm(arch: str = "qwen3", seed: int = 0, **overrides: Any) -> Any:
    """A tiny causal LM of testing.tiny; GPT-2's dropout off (the CPU and the TPU draw different numbers)."""
    from transformers_tpu_ext.testing.tiny import tiny_model

    if arch == "gpt2":
        overrides = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, **overrides}
    return tiny_model(arch, seed=seed, **overrides)


def bert_config(**overrides: Any) -> Any:
    from transformers import AutoConfig

    params = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=512, pad_token_id=0, initializer_range=_init(), hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    params.update(overrides)
    return AutoConfig.for_model("bert", **params)


def bert_mlm(seed: int = 0, **overrides: Any) -> Any:
    from transformers import AutoModelForMaskedLM

    return _seeded(lambda: AutoModelForMaskedLM.from_config(bert_config(**overrides)), seed)


def t5(seed: int = 0, **overrides: Any) -> Any:
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    params = dict(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, dropout_rate=0.0,
    )
    params.update(overrides)
    return _seeded(lambda: AutoModelForSeq2SeqLM.from_config(AutoConfig.for_model("t5", **params)), seed)


def classifier(arch: str = "qwen3", seed: int = 0, **overrides: Any) -> Any:
    from transformers import AutoModelForSequenceClassification

    from transformers_tpu_ext.testing.tiny import tiny_config

    return _seeded(lambda: AutoModelForSequenceClassification.from_config(tiny_config(arch, **overrides)), seed)


def tokenizer(padding_side: str = "right") -> Any:
    from transformers_tpu_ext.testing.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    tok.padding_side = padding_side
    return tok


# -- data ---------------------------------------------------------------------------------------------


def token_lists(n: int, low: int, high: int, seed: int = 0) -> list[list[int]]:
    """``n`` token lists with lengths in ``[low, high]`` (ids avoid 0 = padding and 1 = end of sequence)."""
    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset

    return [row["input_ids"] for row in tiny_lm_dataset(n, min_length=low, max_length=high, seed=seed, vocab_size=VOCAB)]


def mlm_blocks(n: int, length: int, seed: int = 0) -> list[dict[str, list[int]]]:
    """Fixed-length MLM examples as ``group_texts`` + a pre-masked dataset give them: input_ids and labels, no mask."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    rows = []
    for ids in token_lists(n, length, length, seed=seed):
        chosen = torch.rand(length, generator=gen) < 0.3
        labels = [t if c else -100 for t, c in zip(ids, chosen.tolist())]
        masked = [3 if c else t for t, c in zip(ids, chosen.tolist())]  # id 3 stands for [MASK]
        rows.append({"input_ids": masked, "labels": labels})
    return rows
