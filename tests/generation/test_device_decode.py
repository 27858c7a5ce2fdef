"""The device loop's token choice computes what upstream's processors compute (plain CPU tensors).

``device_decode._choose`` runs on the TPU inside a compiled graph; here it runs eagerly on CPU
tensors, against upstream's ``LogitsProcessor`` objects on the same scores: the processed scores
must be bitwise equal, so greedy tokens and seeded samples are the ones upstream picks.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation import logits_process as lp

from transformers_tpu_ext.generation import device_decode
from transformers_tpu_ext.generation.views import CriteriaView, Padding, ProcessorsView, StreamerView

VOCAB = 97


def scores(rows=4, seed=0):
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def selector(processors, *, sample=False, real_rows=4):
    return device_decode.DeviceSelector(
        processors, sample=sample, device=torch.device("cpu"), real_rows=real_rows, compile_backend=None
    )


def processed(processors, logits, length=10):
    """The scores the device's choice picks from."""
    return selector(processors, real_rows=logits.shape[0]).process(logits, length)


CASES = {
    "temperature": [lp.TemperatureLogitsWarper(0.7)],
    "top_k": [lp.TopKLogitsWarper(5)],
    "top_k_keep": [lp.TopKLogitsWarper(1, min_tokens_to_keep=3)],
    "top_k_beyond_vocab": [lp.TopKLogitsWarper(500)],
    "top_p": [lp.TopPLogitsWarper(0.9)],
    "top_p_keep": [lp.TopPLogitsWarper(0.05, min_tokens_to_keep=2)],
    "min_p": [lp.MinPLogitsWarper(0.1)],
    "chain": [
        lp.TemperatureLogitsWarper(0.6),
        lp.TopKLogitsWarper(20),
        lp.TopPLogitsWarper(0.95),
        lp.MinPLogitsWarper(0.05),
    ],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_scores_are_bitwise_upstreams(name):
    processors = CASES[name]
    logits = scores()
    expected = logits.clone()
    ids = torch.zeros((logits.shape[0], 10), dtype=torch.long)
    for processor in processors:
        expected = processor(ids, expected)
    assert torch.equal(processed(processors, logits), expected)


@pytest.mark.parametrize("length, masked", [(7, True), (8, False)])
def test_minimum_lengths_mask_the_end_of_sequence_like_upstream(length, masked):
    logits = scores()
    ids = torch.zeros((logits.shape[0], length), dtype=torch.long)
    for processor in (
        lp.MinLengthLogitsProcessor(8, eos_token_id=[3, 5]),
        lp.MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=4, min_new_tokens=4, eos_token_id=3),
    ):
        expected = processor(ids, logits.clone())
        got = processed([processor], logits, length=length)
        assert torch.equal(got, expected)
        assert bool(torch.isinf(got[:, 3]).all()) is masked


def test_seeded_sampling_draws_what_upstream_draws_for_the_real_rows():
    logits = scores(rows=4)
    processors = CASES["chain"]
    ids = torch.zeros((3, 10), dtype=torch.long)
    expected_scores = logits[:3].clone()
    for processor in processors:
        expected_scores = processor(ids, expected_scores)
    torch.manual_seed(11)
    expected = torch.multinomial(torch.softmax(expected_scores, dim=-1), 1).squeeze(1)
    torch.manual_seed(11)
    chosen, _ = selector(processors, sample=True, real_rows=3)(logits, None, 10)
    assert chosen.shape == (4,)  # the dummy row gets a placeholder, drawn from nothing
    assert torch.equal(chosen[:3], expected)


def test_greedy_choice_and_positions():
    logits = scores()
    positions = torch.tensor([[4], [5], [6], [7]])
    chosen, after = selector([])(logits, positions, 10)
    assert torch.equal(chosen, logits.argmax(-1))
    assert torch.equal(after, positions + 1)


def test_a_processor_without_a_device_implementation_is_refused():
    with pytest.raises(ValueError, match="RepetitionPenaltyLogitsProcessor"):
        selector([lp.RepetitionPenaltyLogitsProcessor(1.2)])


# -- views ------------------------------------------------------------------------------------


PADDING = Padding(pad=2, real_batch=3, padded_batch=4)


def test_padding_real_rows_follow_upstreams_grouping():
    assert PADDING.real_rows(4) == 3
    assert PADDING.real_rows(8) == 6  # two beams or returned sequences per entry, dummy entry last
    assert not Padding() and Padding(pad=1) and Padding(real_batch=1, padded_batch=2)


def test_processors_see_the_callers_rows_and_columns():
    seen = {}

    def processors(input_ids, scores):
        seen["shape"] = tuple(input_ids.shape)
        return scores * 2

    ids = torch.arange(4 * 7).reshape(4, 7)
    logits = scores(rows=4)
    out = ProcessorsView(processors, PADDING)(ids, logits)
    assert seen["shape"] == (3, 5)
    assert torch.equal(out[:3], logits[:3] * 2) and torch.equal(out[3], logits[3])


@pytest.mark.parametrize("first_done", [False, True])
def test_criteria_see_the_callers_rows_and_dummy_rows_follow_the_first(first_done):
    seen = {}

    def criteria(input_ids, scores):
        seen["ids"] = input_ids.clone()
        return torch.tensor([first_done, False, True])

    ids = torch.arange(4 * 7).reshape(4, 7)
    done = CriteriaView(criteria, PADDING)(ids, None)
    assert torch.equal(seen["ids"], ids[:3, 2:])
    # The dummy row finishes with the first row: never later (the loop ends with the real rows),
    # never sooner (it is fed the pad token only when the first row is).
    assert done.tolist() == [first_done, False, True, first_done]


def test_streamer_gets_the_prompt_without_padding_then_the_real_rows():
    parts = []

    class Collect:
        def put(self, value):
            parts.append(value)

        def end(self):
            parts.append("end")

    view = StreamerView(Collect(), PADDING)
    view.put(torch.arange(4 * 7).reshape(4, 7))
    view.put(torch.tensor([10, 11, 12, 13]))
    view.end()
    assert parts[0].shape == (3, 5) and parts[1].tolist() == [10, 11, 12] and parts[2] == "end"


def test_filter_value_and_min_tokens_to_keep_follow_the_processor():
    logits = scores()
    processor = lp.TopKLogitsWarper(2, filter_value=-50.0)
    got = processed([processor], logits)
    assert torch.equal(got, processor(torch.zeros((4, 1), dtype=torch.long), logits.clone()))
    assert (got == -50.0).sum(-1).tolist() == [VOCAB - 2] * 4
    assert not math.isinf(float(got.min()))
