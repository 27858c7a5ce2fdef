"""The token comparisons can fail: attending to the padding columns changes a context-sensitive
model's tokens, and the comparison catches it (a degenerate model would not notice).

``generation.wrap_generate._BREAK_PADDING_MASK`` (a test-only switch) unmasks the left-padding columns the
plugin adds to bucket a prompt, the kind of bug the padding logic could have.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

# Its scenarios run in a fresh interpreter (a worker script): the everyday loop (-m "not slow") skips them.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("mutation_worker.py")


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
