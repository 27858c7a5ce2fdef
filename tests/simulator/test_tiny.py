"""The tiny test models are context-sensitive, so comparing their tokens proves something."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.testing import tiny


@pytest.mark.parametrize("arch", tiny.ARCHITECTURES)
def test_every_tiny_architecture_is_context_sensitive(arch):
    model = tiny.tiny_model(arch, seed=0)
    tiny.check_context_sensitive(model)  # raises AssertionError otherwise


def test_the_check_catches_the_degenerate_default_init():
    # Transformers' default init (0.02) gives a tiny Qwen3 whose greedy output ignores the context.
    with pytest.raises(AssertionError, match="not context-sensitive"):
        tiny.check_context_sensitive(tiny.tiny_model("qwen3", seed=0, initializer_range=0.02))


def test_traits_of_the_architectures():
    config = {arch: tiny.tiny_config(arch) for arch in tiny.ARCHITECTURES}
    assert config["qwen3"].tie_word_embeddings and config["qwen3"].num_key_value_heads == 2
    assert config["falcon"].multi_query
    assert config["mistral"].sliding_window == 8
    assert config["gemma2"].layer_types == ["sliding_attention", "full_attention"]
    assert config["gemma3"].model_type == "gemma3_text"
    assert config["phi3"].rope_parameters["partial_rotary_factor"] == 0.5
    assert config["gpt_neox"].rope_parameters["partial_rotary_factor"] == 0.25
    assert config["gpt2"].model_type == "gpt2"
    with pytest.raises(ValueError, match="unknown tiny architecture"):
        tiny.tiny_config("t5")
