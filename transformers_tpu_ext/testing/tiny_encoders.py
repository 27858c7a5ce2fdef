"""Tiny, fully local encoder models and a BERT-style tokenizer, for batch-inference tests and benchmarks.

:func:`tiny_bert_tokenizer` is a WordPiece tokenizer over the words of
:data:`~transformers_tpu_ext.testing.tiny.TINY_TEXT` (and of zero-shot classification's hypothesis
template), other words spelled in letters, with ``[CLS] A [SEP] B [SEP]`` pairs and token type ids,
``[MASK]`` and ``[PAD]``: what fill-mask, question answering and zero-shot pipelines need. The same
in every process (a trained vocabulary was not: token counts, and the buckets run, changed per run).
:func:`tiny_encoder` builds a 2-layer BERT (absolute position table of 64, so tests reach it) of a
task head with ``initializer_range=0.3``: outputs depend on every real token.
"""

from __future__ import annotations

from typing import Any

from .tiny import DEFAULT_INITIALIZER_RANGE, TINY_TEXT

__all__ = ["WORDS", "random_texts", "tiny_bert_tokenizer", "tiny_encoder"]

#: Words the random texts are drawn from (in the tokenizer's training text, so few are unknown).
WORDS = sorted({w.strip(".,").lower() for line in TINY_TEXT for w in line.split()})

_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
#: Zero-shot classification's default hypothesis template (its words are in the vocabulary, as in a real one).
_TEMPLATE = "This example is {}."


def tiny_bert_tokenizer(vocab_size: int = 200, model_max_length: int = 64) -> Any:
    """A ``PreTrainedTokenizerFast`` in BERT's shape (right padding, ``[CLS]``/``[SEP]``, type ids)."""
    import string

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    # The vocabulary is written out, not trained: the WordPiece trainer breaks ties in a different order in
    # each process, so a word outside the corpus ("this", "example") got other pieces, and token counts
    # (hence the buckets a benchmark or a test runs) changed from run to run.
    normalizer, splitter = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    lines = [*TINY_TEXT, _TEMPLATE]
    words = sorted({w for line in lines for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(line))})
    chars = sorted(set(string.ascii_lowercase + string.digits + "".join(words)))
    pieces = list(dict.fromkeys(_SPECIAL + words + chars + [f"##{c}" for c in chars]))[:vocab_size]
    tok = Tokenizer(models.WordPiece({piece: i for i, piece in enumerate(pieces)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = splitter
    tok.decoder = decoders.WordPiece()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", padding_side="right", model_max_length=model_max_length,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def tiny_encoder(task: str = "sequence_classification", seed: int = 0, num_labels: int = 3, **overrides: Any) -> Any:
    """A 2-layer, 32-wide BERT with the head of ``task`` (``sequence_classification``, ``token_classification``,
    ``masked_lm``, ``question_answering``, ``base``), in evaluation mode."""
    import torch
    from transformers import (
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForQuestionAnswering,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        BertConfig,
    )

    classes = {
        "sequence_classification": AutoModelForSequenceClassification,
        "token_classification": AutoModelForTokenClassification,
        "masked_lm": AutoModelForMaskedLM,
        "question_answering": AutoModelForQuestionAnswering,
        "base": AutoModel,
    }
    labels = {f"LABEL_{i}": i for i in range(num_labels)}
    if task == "sequence_classification" and num_labels == 3:
        labels = {"contradiction": 0, "neutral": 1, "entailment": 2}  # what zero-shot classification looks for
    settings = dict(
        vocab_size=len(tiny_bert_tokenizer()), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, type_vocab_size=2, pad_token_id=0,
        initializer_range=DEFAULT_INITIALIZER_RANGE, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        num_labels=num_labels, label2id=labels, id2label={v: k for k, v in labels.items()},
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    return classes[task].from_config(BertConfig(**settings)).eval()


def random_texts(count: int, seed: int = 0, shortest: int = 1, longest: int = 40) -> list[str]:
    """``count`` texts of random word counts in ``[shortest, longest]`` (seeded)."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(shortest, longest))) for _ in range(count)]
