"""generate() on TPU sees only what the caller gave it, and moves only token ids per step.

Padding and dummy rows never leak into callbacks or messages; seeded sampling draws the unpatched
call's stream; invalid pad ids, caches the caller sees, assisted decoding; the device loop (only
token ids cross the host link) and the host loop (options that need the logits there). One fresh
interpreter runs every scenario on a context-sensitive tiny Qwen3 and reports what a user would see.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

# Its scenarios run in a fresh interpreter (a worker script): the everyday loop (-m "not slow") skips them.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("correctness_worker.py")


@pytest.fixture(scope="module")
def seen():
    return run_python(SCRIPT, timeout=900)[0]


def test_stopping_criteria_see_the_callers_lengths_and_rows(seen):
    cpu, tpu = seen["callbacks"]["cpu"], seen["callbacks"]["tpu"]
    assert "error" not in tpu, tpu.get("error")
    assert tpu["stop"] == cpu["stop"] and len(tpu["stop"][0]) == 15  # stopped after 5 new tokens
    assert tpu["criteria_shapes"] == cpu["criteria_shapes"]  # [3, 11], [3, 12], ...


def test_a_per_row_logits_processor_sees_the_callers_rows(seen):
    cpu, tpu = seen["callbacks"]["cpu"], seen["callbacks"]["tpu"]
    assert tpu["bias"] == cpu["bias"]
    assert {row[-1] for row in tpu["bias"]} <= {7, 8, 9} and len({tuple(row[10:]) for row in tpu["bias"]}) == 3


def test_prefix_allowed_tokens_fn_sees_the_callers_batch_ids_and_lengths(seen):
    cpu, tpu = seen["callbacks"]["cpu"], seen["callbacks"]["tpu"]
    assert tpu["prefix"] == cpu["prefix"]
    assert tpu["prefix_calls"] == cpu["prefix_calls"]
    assert {batch for batch, _ in tpu["prefix_calls"]} == {0, 1, 2}
    assert {length for _, length in tpu["prefix_calls"]} == {10, 11, 12}


def test_length_errors_name_the_callers_lengths(seen):
    assert "Input length of input_ids is 26, but `max_length` is set to 20" in seen["length_error"]


def test_seeded_sampling_draws_the_unpatched_calls_stream(seen):
    assert seen["sampling_same_stream"] == [True, True, True]  # batches of 1, 3 (padded to 4), 4
    assert seen["sampling_differs_from_another_seed"]


def test_an_invalid_pad_token_id_is_never_fed_to_the_embedding(seen):
    assert seen["invalid_pad"] == {"-1": True, str(320 + 5): True}


def test_a_static_cache_the_caller_asked_for_is_upstreams(seen):
    r = seen["cache_static"]
    assert r["tpu"] == r["cpu"] == {"type": "StaticCache", "length": 15, "max_cache_len": 15, "rows": 3}
    assert r["keys_close"] and r["sequences_equal"]


def test_the_default_cache_returned_is_upstreams_dynamic_cache(seen):
    r = seen["cache_default"]
    assert r["tpu"] == r["cpu"]
    assert r["tpu"]["type"] == "DynamicCache" and r["tpu"]["length"] == 15 and r["tpu"]["rows"] == 3
    assert r["keys_close"] and r["sequences_equal"]


def test_returned_attentions_and_hidden_states_have_upstreams_shapes(seen):
    r = seen["attentions"]
    assert "error" not in r, r
    assert r["tpu"] == r["cpu"]
    assert r["tpu"]["attentions"][0][-1] == 10  # the prefill attends to the 10 prompt positions, not a cache


def test_the_cache_returned_after_inputs_embeds_holds_the_prompt(seen):
    r = seen["embeds_cache"]
    assert "error" not in r, r
    assert r["tpu"] == r["cpu"] == [[2, 2, 12, 8], "DynamicCache"]  # 10 prompt positions + 2 generated
    assert r["close"]


def test_an_invalid_pad_token_id_never_reaches_a_dummy_row(seen):
    assert seen["pad_never_generated"] == {
        f"{loop}/{rows}": True for loop in ("device_loop", "host_loop") for rows in (3, 13)
    }


@pytest.mark.parametrize("mode", ["lookup", "assisted"])
def test_assisted_decoding_with_inputs_on_the_tpu_works_as_upstream(seen, mode):
    r = seen[mode]
    assert r.get("error") is None, r.get("error")
    assert r == {"device": "tpu:0", "match": True}


@pytest.mark.parametrize("mode", ["greedy", "sample"])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("where", ["cpu", "tpu"])
def test_the_device_loop_moves_only_token_ids(seen, mode, batch, where):
    r = seen["bytes"][f"{mode}/b{batch}/{where}"]
    assert r["d2h"] <= 16  # the chosen ids (8 bytes a row), nothing vocabulary-sized
    assert r["h2d"] <= 64  # the ids fed back (and, inputs on the TPU, the result's ids returned there)
    assert r["programs"] == 0


@pytest.mark.parametrize("option", ["repetition_penalty", "output_scores"])
def test_options_that_need_the_logits_take_the_host_loop(seen, option):
    r = seen["bytes"][f"{option}/b1/tpu"]
    assert r["d2h"] >= 320 * 4  # the step's logits come to the host: what the fallback costs
    assert r["programs"] == 0


def test_the_host_loop_keeps_every_option_token_identical(seen):
    assert seen["options"] == {name: True for name in seen["options"]}
    assert set(seen["options"]) == {"repetition_penalty", "no_repeat_ngram", "bad_words", "min_new_tokens", "stop_strings"}


def test_scores_and_logits_returned_have_the_callers_rows(seen):
    r = seen["scores"]
    assert r["rows"] == [[3, 320]] * 4
    assert r["device"] == "tpu:0"
    assert r["close"] and r["logits_close"] and r["sequences"]
