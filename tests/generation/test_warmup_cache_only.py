"""A warm-up is done when the same work then runs in torch_tpu's cache-only mode (issue 25).

After ``warmup()``, 24 mixed calls within its bounds (batch 1 and 2, prompts of 1-64 tokens from a
tokenizer, 1-8 new tokens, inputs on the TPU and on the host; greedy, with the scores and the cache
handed back, and sampling at per-call temperatures) run with ``torch.tpu._set_cache_only(True)``:
any program the process does not hold, a graph or an eager operation of a new signature (Python
numbers included), fails the call. Their tokens equal plain CPU Transformers'.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers_tpu_ext  # noqa: E402
from transformers_tpu_ext.generation import buckets  # noqa: E402
from transformers_tpu_ext.generation.config import TPUGenerationConfig  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402

WORDS = "the quick brown fox jumps over a lazy dog and then some more words appear here at last".split()


def _calls(count: int, seed: int = 0) -> list[tuple[list[str], int, bool]]:
    rng = random.Random(seed)
    calls = []
    for index in range(count):
        batch = rng.choice([1, 2])
        texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24))) for _ in range(batch)]
        calls.append((texts, rng.randint(1, 8), index % 2 == 0))
    return calls


@pytest.fixture(scope="module")
def reference():
    model = tiny.tiny_model("qwen3", seed=0)
    tiny.check_context_sensitive(model)
    return model


def test_warmup_covers_every_padded_prompt_length_past_the_chunk():
    settings = TPUGenerationConfig()
    prompts = buckets.warmup_prompts(64, settings.prompt_ladder(), settings.prefill_chunk)
    assert prompts == [16, 32, 64, 80]  # 64 tokens with their padding column: one chunk and a 16-token piece
    long = buckets.warmup_prompts(200, settings.prompt_ladder(), settings.prefill_chunk)
    assert long[-1] == 208 and {80, 96, 128, 144, 160, 192, 208} <= set(long)


def test_the_recompile_limit_follows_the_buckets():
    # docs/generation.md's long-prompt settings: 66 forward graphs for batches up to 32, past a fixed 64.
    settings = TPUGenerationConfig(steps_per_octave=2, prefill_chunk=512, batch_buckets=(1, 2, 4, 8, 16, 32))
    assert settings.forward_graphs() == 66
    assert settings.dynamo_recompile_limit() >= 2 * 66
    assert TPUGenerationConfig(recompile_limit=1000).dynamo_recompile_limit() == 1000


@pytest.mark.slow
def test_24_mixed_calls_after_warmup_run_in_cache_only_mode(simulated_tpu, cache_only, reference):
    tokenizer = tiny.tiny_tokenizer()
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    bounds = dict(max_prompt_length=64, max_new_tokens=8, batch_sizes=[1, 2])
    transformers_tpu_ext.warmup(model, **bounds)
    transformers_tpu_ext.warmup(model, **bounds, return_dict_in_generate=True, output_scores=True)
    sampling = dict(do_sample=True, top_p=0.9)
    transformers_tpu_ext.warmup(model, **bounds, **sampling, temperature=0.7)
    for index, (texts, new, on_tpu) in enumerate(_calls(24)):
        inputs = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=64)
        expected_inputs = dict(inputs)
        if on_tpu:
            inputs = inputs.to("tpu")
        kind = index % 3
        with cache_only(f"call {index}: {len(texts)} x {inputs['input_ids'].shape[1]} tokens, {new} new, kind {kind}"):
            if kind == 0:
                out = model.generate(**inputs, max_new_tokens=new, do_sample=False)
            elif kind == 1:
                out = model.generate(**inputs, max_new_tokens=new, do_sample=False, return_dict_in_generate=True,
                                     output_scores=True)
            else:
                torch.manual_seed(index)
                out = model.generate(**inputs, max_new_tokens=new, **sampling, temperature=0.5 + 0.05 * index)
        if kind == 0:
            assert torch.equal(out.cpu(), reference.generate(**expected_inputs, max_new_tokens=new, do_sample=False))
        elif kind == 1:
            expected = reference.generate(**expected_inputs, max_new_tokens=new, do_sample=False,
                                          return_dict_in_generate=True, output_scores=True)
            assert torch.equal(out.sequences.cpu(), expected.sequences)
            assert len(out.scores) == len(expected.scores)
            assert all(torch.allclose(a.cpu(), b, atol=1e-4) for a, b in zip(out.scores, expected.scores))
            # the cache handed back is upstream's: its real lengths, on the model's device
            assert out.past_key_values.get_seq_length() == expected.past_key_values.get_seq_length()
            layer, expected_layer = out.past_key_values.layers[0], expected.past_key_values.layers[0]
            assert layer.keys.device.type == "tpu"
            assert torch.allclose(layer.keys.cpu(), expected_layer.keys, atol=1e-5)
        else:
            assert out.shape[1] <= expected_inputs["input_ids"].shape[1] + new
