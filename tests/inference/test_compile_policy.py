"""``compile_path``: which padded inference calls run as one compiled program, and why the others do not.

Pure: plain facts in, ``None`` or a reason out (no torch)."""

from __future__ import annotations

import dataclasses

import pytest

from transformers_tpu_ext.inference import paths
from transformers_tpu_ext.inference.compile_policy import CompileFacts, compile_path, padding_waste, planned_graphs
from transformers_tpu_ext.inference.warm_up import infer_buckets


def test_a_padded_call_of_the_model_itself_under_no_grad_compiles():
    assert compile_path(CompileFacts()) is None
    assert compile_path(CompileFacts(options=frozenset({"use_cache", "return_dict", "output_hidden_states"}))) is None


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"padded": False}, "not padded"),
        ({"enabled": False}, "compile=False"),
        ({"eager_stance": True}, "force_eager"),
        ({"compiling": True}, "inside a compiled region"),
        ({"wrapper": "PeftModel"}, "a PeftModel wraps the model"),
        ({"forward_replaced": True}, "Accelerate's offload hooks"),
        ({"hooks": 1}, "1 forward hook on the model"),
        ({"hooks": 3}, "3 forward hooks"),
        ({"grad": True}, "torch.no_grad()"),
        ({"options": frozenset({"labels_smoothing"})}, "options labels_smoothing"),
        ({"graph_break": "Unsupported: data-dependent branch"}, "breaks the graph (Unsupported: data-dependent branch)"),
    ],
)
def test_each_refusal_says_why_and_what_would_help(change, words):
    reason = compile_path(dataclasses.replace(CompileFacts(), **change))
    assert reason is not None and words in reason


def test_the_first_refusal_wins_in_a_fixed_order():
    facts = CompileFacts(padded=False, hooks=2, grad=True)
    assert "not padded" in compile_path(facts)


def test_graphs_planned_and_padding_waste():
    assert planned_graphs([16, 32, 32], [8, 4]) == 4
    assert planned_graphs([], []) == 1
    assert padding_waste(100, 160) == 1.6 and padding_waste(0, 10) == 1.0


def test_warmup_buckets_cover_every_rung_up_to_the_limits():
    assert infer_buckets(40, 8) == [(r, n) for r in (1, 2, 4, 8) for n in (16, 32, 48)]
    assert infer_buckets(20, batch_sizes=[3, 8]) == [(4, 16), (4, 32), (8, 16), (8, 32)]
    assert infer_buckets(600, 1, max_positions=512)[-1] == (1, 512)
    with pytest.raises(ValueError, match="max_length and max_batch_size >= 1"):
        infer_buckets(0, 1)


def test_the_docs_table_is_rendered_from_the_predicate():
    table = paths.compile_table()
    for case in paths.COMPILE_CASES:
        assert case.what in table
    assert "one compiled program per bucket" in table and "op by op" in table
