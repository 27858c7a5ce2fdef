"""The tiny models the tensor-parallel tests shard, shared by the gloo and the launcher tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    initializer_range=0.3,  # varied greedy tokens, so that "identical tokens" means something
)


def configs() -> dict[str, Any]:
    from transformers import Glm4Config, LlamaConfig, Qwen3Config

    return {
        # GLM-4-shaped: 2 KV heads, 8 query heads (the reproduction)
        "glm_kv2": Glm4Config(num_attention_heads=8, num_key_value_heads=2, head_dim=8, **COMMON),
        "llama_kv3": LlamaConfig(num_attention_heads=6, num_key_value_heads=3, head_dim=8, **{**COMMON, "hidden_size": 48}),
        "qwen3_tied": Qwen3Config(
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, **COMMON
        ),
        "llama_divisible": LlamaConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=16, **COMMON),
    }


def save(name: str, path: Path) -> str:
    """Save the seeded tiny model ``name`` (a key of :func:`configs`) to ``path``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(configs()[name]).save_pretrained(path)
    return str(path)
