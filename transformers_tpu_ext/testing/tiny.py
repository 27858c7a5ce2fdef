"""Tiny, fully local models and tokenizers for the demo, the tests and users' own CI.

Nothing here touches the Hub: the tokenizer is a byte-level BPE trained in-process on a few
sentences, the model is built from a config with random (seeded) weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["TINY_TEXT", "save_tiny_model", "tiny_config", "tiny_model", "tiny_tokenizer"]

TINY_TEXT = [
    "The secret to baking a good cake is",
    "Cloud TPUs run PyTorch natively through torch_tpu.",
    "Static shapes avoid recompilation on a TPU.",
    "Tensor parallelism splits a model across chips.",
    "A tiny model is enough to test a plugin end to end.",
]

#: Architectures :func:`tiny_config` knows, with the traits the tests care about.
_ARCHS = {
    # Qwen3-0.6B-shaped: tied input/output embeddings, 2 KV heads for 4 query heads.
    "qwen3": dict(tie_word_embeddings=True, num_attention_heads=4, num_key_value_heads=2, head_dim=8),
    # Llama-shaped: untied, as many KV heads as query heads.
    "llama": dict(tie_word_embeddings=False, num_attention_heads=4, num_key_value_heads=4, head_dim=8),
}


def tiny_tokenizer(vocab_size: int = 320) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on :data:`TINY_TEXT` (left padding)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|pad|>", "<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TINY_TEXT, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|eos|>", padding_side="left"
    )


def tiny_config(arch: str = "qwen3", vocab_size: int | None = None, **overrides: Any) -> Any:
    """A 2-layer, 32-wide config of ``arch`` (``"qwen3"`` or ``"llama"``)."""
    from transformers import AutoConfig

    if arch not in _ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {sorted(_ARCHS)}")
    params: dict[str, Any] = dict(
        vocab_size=vocab_size or len(tiny_tokenizer()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    params.update(_ARCHS[arch])
    params.update(overrides)
    return AutoConfig.for_model(arch, **params)


def tiny_model(arch: str = "qwen3", seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised (seeded) causal LM of ``arch``, in float32, on CPU, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    return model.eval()


def save_tiny_model(path: str | os.PathLike[str], arch: str = "qwen3", seed: int = 0, **overrides: Any) -> Path:
    """Save a tiny model and its tokenizer to ``path`` so ``from_pretrained(path)`` works offline."""
    path = Path(path)
    tokenizer = tiny_tokenizer()
    model = tiny_model(arch, seed=seed, vocab_size=len(tokenizer), **overrides)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
