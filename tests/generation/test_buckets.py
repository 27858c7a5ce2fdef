"""The bucket policy: plain functions over ints."""

from __future__ import annotations

import pytest

from transformers_tpu_ext import ladders
from transformers_tpu_ext.generation import buckets


@pytest.mark.parametrize("length", range(1, 257))
def test_two_steps_per_octave_pads_at_most_a_third(length):
    ladder = ladders.geometric_ladder(16, 256, 2, 16)
    padded = buckets.prompt_bucket(length, ladder, 256)
    assert padded >= length
    assert padded <= max(16, length * 3 / 2 + 16)  # rung ratio <= 1.5, plus the 16-token tile


def test_long_prompts_are_whole_chunks_plus_a_rung():
    ladder = ladders.geometric_ladder(16, 256, 2, 16)
    assert buckets.prompt_bucket(257, ladder, 256) == 256 + 16
    assert buckets.prompt_bucket(700, ladder, 256) == 512 + 192
    assert buckets.prefill_chunk(704, 256) == 256


def test_long_prompts_add_no_prefill_shape_and_waste_little():
    ladder = ladders.geometric_ladder(16, 128, 2, 16)
    shapes = set()
    for length in range(1, 5000):
        padded = buckets.prompt_bucket(length, ladder, 128)
        chunk = buckets.prefill_chunk(padded, 128)
        # upstream's chunked prefill: whole chunks from the left, then the remainder
        shapes |= {chunk} | ({padded % chunk} if padded % chunk else set())
        if length > 128:
            assert padded - length < 128 / 3 + 16
    assert shapes == set(ladder)


def test_plan_rounds_batch_prompt_and_cache():
    plan = buckets.plan(
        3, 100, 40,
        prompt_ladder=(16, 32, 64, 128), chunk=128,
        batch_ladder=(1, 2, 4), cache_ladder=(64, 128, 256),
    )
    assert plan == (4, 128, 128, 256)
    assert (plan.batch, plan.prompt, plan.chunk, plan.cache) == (4, 128, 128, 256)


def test_cache_floor_keeps_a_warmed_up_length():
    assert buckets.cache_bucket(70, (64, 128, 256), floor=256) == 256


def test_padding_overhead_counts_prefill_and_decode_tokens():
    # 1 row, prompt 10 padded to 16, 5 new tokens (4 decode steps): (16 + 4) / (10 + 4)
    assert buckets.padding_overhead([(1, 10, 5, 1, 16)]) == pytest.approx(20 / 14)
    assert buckets.padding_overhead([(2, 16, 3, 2, 16)]) == 1.0


def test_bad_sizes_are_refused_with_the_name():
    with pytest.raises(ValueError, match="steps_per_octave"):
        ladders.geometric_ladder(16, 256, 0, 16)
    with pytest.raises(ValueError, match="batch_size=0"):
        buckets.plan(0, 1, 1, prompt_ladder=(16,), chunk=None, batch_ladder=(1,), cache_ladder=(64,))


def test_attention_overhead_counts_the_static_cache_the_decode_steps_attend_to():
    from transformers_tpu_ext.generation.buckets import attention_overhead

    assert attention_overhead([]) == 1.0
    assert attention_overhead([(1, 10, 1, 1, 64)]) == 1.0  # one token: no decode step
    # 3 decode steps of a 10-token prompt need 11 + 12 + 13 = 36 positions; a 64-long cache gives 3 x 64
    assert attention_overhead([(1, 10, 4, 1, 64)]) == 3 * 64 / 36
    assert attention_overhead([(1, 10, 4, 1, None)]) == 1.0  # a dynamic cache attends to what it needs
    assert attention_overhead([(3, 10, 4, 4, 64)]) == 4 * 3 * 64 / (3 * 36)  # dummy rows attend too
    # After one 300-token prompt, a 10-token call still attends to the 512-long cache.
    assert attention_overhead([(1, 10, 5, 1, 512)]) == 4 * 512 / (4 * 10 + 10)


def test_warmup_rows_are_buckets_for_greedy_and_real_sizes_for_sampling():
    # Issue 18, item 5: the sampling choice is compiled per real row count (it draws over the real
    # rows only), so a sampling warm-up runs each size it is given; greedy runs each bucket once.
    ladder = (1, 2, 4, 8)
    assert buckets.warmup_rows([1, 2, 3, 4], 4, ladder, sampling=False) == [1, 2, 4]
    assert buckets.warmup_rows([1, 2, 3, 4], 4, ladder, sampling=True) == [1, 2, 3, 4]
    assert buckets.warmup_rows([3, 3, 5], 8, ladder, sampling=True) == [3, 5]
    assert buckets.warmup_rows(None, 8, ladder, sampling=False) == [1, 2, 4, 8]
    assert buckets.warmup_rows(None, 4, ladder, sampling=True) == [1, 2, 4]  # sampling services pass their sizes
