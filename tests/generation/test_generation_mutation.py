"""The token comparisons can fail: attending to the padding columns changes a context-sensitive
model's tokens, and the comparison catches it (a degenerate model would not notice).

``generation.wrap_generate._BREAK_PADDING_MASK`` (a test-only switch) unmasks the left-padding columns the
plugin adds to bucket a prompt, the kind of bug the padding logic could have.
"""

from __future__ import annotations

import pytest

from _subprocess import run_python

SCRIPT = r"""
import torch
from transformers_tpu_ext import testing
from transformers_tpu_ext.generation import wrap_generate as generation
from transformers_tpu_ext.testing.tiny import tiny_model

sim = testing.install(chips=4)
r = {}
for name, overrides in (("context_sensitive", {}), ("degenerate", {"initializer_range": 0.02})):
    model = tiny_model("qwen3", seed=0, **overrides)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, model.config.vocab_size, (1, n), generator=gen) for n in (3, 5, 7, 9)]
    refs = [model.generate(p, max_new_tokens=8, do_sample=False) for p in prompts]
    model.to("tpu")
    for broken in (False, True):
        generation._BREAK_PADDING_MASK = broken
        outs = [model.generate(p.to("tpu"), max_new_tokens=8, do_sample=False).cpu() for p in prompts]
        r[f"{name}/{'broken' if broken else 'intact'}"] = sum(torch.equal(a, b) for a, b in zip(outs, refs))
    generation._BREAK_PADDING_MASK = False
report(r)
"""


@pytest.fixture(scope="module")
def matches():
    return run_python(SCRIPT, timeout=600)[0]


def test_intact_padding_gives_the_cpu_tokens(matches):
    assert matches["context_sensitive/intact"] == 4
    assert matches["degenerate/intact"] == 4


def test_attending_to_the_padding_is_caught_on_a_context_sensitive_model(matches):
    assert matches["context_sensitive/broken"] == 0  # every prompt was padded, every one differs


def test_a_degenerate_model_would_have_hidden_it(matches):
    # Why the tiny models are context-sensitive: with the default init the same bug goes unnoticed.
    assert matches["degenerate/broken"] == 4
