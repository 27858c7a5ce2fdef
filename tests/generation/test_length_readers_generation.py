"""Issue 31: ``generate()`` for models whose rotary embedding reads the length of the forward pass gives
plain CPU Transformers' tokens on the simulated TPU with the plugin.

LongRoPE (tiny Phi-3) and dynamic NTK (tiny Llama), original context 64: prompts of 40, 100 and 300
tokens, batch 1 and a ragged left-padded batch, greedy and beam search. Before the fix, the plugin
prefilled every bucketed prompt in 64-token chunks, so the first chunks' keys were rotated with the short
(or unscaled) frequencies where the whole prompt rotates them with the long (or scaled) ones: 100- and
300-token prompts gave other tokens, silently. The CPU reference and the TPU model are two copies of one
seeded model that see the same calls in the same order (dynamic NTK's frequencies follow the history of
lengths, on both).
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402

ORIGINAL = 64


def longrope_phi3():
    return tiny.tiny_model(
        "phi3", seed=0, original_max_position_embeddings=ORIGINAL, max_position_embeddings=512,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": ORIGINAL,
                         "short_factor": [1.0, 1.0, 1.0, 1.0], "long_factor": [1.0, 3.0, 9.0, 27.0]},
    )


def dynamic_llama():
    return tiny.tiny_model("llama", seed=0, max_position_embeddings=ORIGINAL,
                           rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0})


MODELS = {"longrope": longrope_phi3, "dynamic": dynamic_llama}


@pytest.fixture
def tpu(simulated_tpu):
    import transformers.generation.utils  # noqa: F401 - the patch target imported

    ext.activate()
    assert "generation" in ext.active_patches()
    return simulated_tpu


@contextlib.contextmanager
def plugin_disabled():
    ext.deactivate()
    try:
        yield
    finally:
        ext.activate()


def prompts(vocab: int, length: int, rows: int):
    """``rows`` prompts of ``length`` columns; rows 2 and 3 left-padded by 7 and by half the length."""
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(2, vocab, (3, length), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    mask[2, : length // 2] = 0
    ids[mask == 0] = 0
    return ids[:rows], mask[:rows]


def compare(kind: str, cases, new_tokens: int = 4):
    """The tokens of each case on CPU (plugin off) and on the TPU (plugin on); the mismatches."""
    make = MODELS[kind]
    reference, model = make(), make().to("tpu")
    tiny.check_context_sensitive(reference)
    mismatches = []
    for length, rows, beams in cases:
        ids, mask = prompts(reference.config.vocab_size, length, rows)
        options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=beams)
        with plugin_disabled():
            expected = reference.generate(ids, attention_mask=mask, **options)
        got = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), **options).cpu()
        if not torch.equal(got, expected):
            mismatches.append((length, rows, beams, got[:, -new_tokens:].tolist(), expected[:, -new_tokens:].tolist()))
    return mismatches


@pytest.mark.parametrize("kind", ["longrope", pytest.param("dynamic", marks=pytest.mark.slow)])  # dynamic: ~20 s of compiling
def test_a_prompt_past_the_original_context_gives_the_cpus_tokens(tpu, kind):
    """100 tokens, batch 1, greedy: past the threshold and longer than one prefill chunk."""
    assert compare(kind, [(100, 1, 1)]) == []


@pytest.mark.slow  # compiled on the simulator (dynamic NTK recompiles its decode step as it rescales): minutes
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_prompts_of_40_and_300_tokens_ragged_greedy_and_beams(tpu, kind):
    """A part of the issue's matrix (all 24 cases per model agree too, but take many minutes on the simulator)."""
    assert compare(kind, [(40, 3, 2), (300, 3, 1), (300, 1, 2)]) == []
