"""Ladders of shape buckets (``transformers_tpu_ext.ladders``), shared by every capability that pads."""

from __future__ import annotations

from transformers_tpu_ext import ladders


def test_power_of_two_ladder_is_one_step_per_octave():
    assert ladders.geometric_ladder(16, 256, 1, 16) == (16, 32, 64, 128, 256)


def test_default_ladder_has_two_rungs_per_octave_in_multiples_of_16():
    assert ladders.geometric_ladder(16, 256, 2, 16) == (16, 32, 48, 64, 96, 128, 192, 256)


def test_ladder_ends_at_the_maximum():
    assert ladders.geometric_ladder(16, 250, 2, 1)[-1] == 250
    assert ladders.geometric_ladder(16, 200, 2, 16)[-1] == 208


def test_round_up_past_the_last_bucket_uses_its_multiples():
    assert ladders.round_up(3, (1, 2, 4)) == 4
    assert ladders.round_up(9, (1, 2, 4)) == 12
