"""generate() on the simulated TPU: plain code, fast, token-identical (patch ``generation``).

Fresh interpreters run the scenarios (patches and the simulator are process-global) and report what
a user would see; one runs the same script with the patch disabled, to show those facts come from
the patch. Every token comparison uses a context-sensitive tiny model (asserted in the script), so
attending to the wrong positions changes the tokens (``test_generation_mutation.py`` proves it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

# Its scenarios run in a fresh interpreter (a worker script): the everyday loop (-m "not slow") skips them.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("generation_worker.py")


@pytest.fixture(scope="module")
def with_patch():
    return run_python(SCRIPT, timeout=600)[0]


def test_tpu_inputs_no_cache_argument_compile_and_stay_compiled(with_patch):
    r = with_patch["tpu_inputs"]
    assert r["device"] == "tpu:0"
    assert r["match"]
    assert r["graphs"] >= 1  # the decode step is compiled (static cache by default)
    assert r["second_call_programs"] == 0


def test_user_compile_config_is_adapted_with_one_warning(with_patch):
    r = with_patch["compile_config"]
    assert r["ok"] and r["match"]
    assert len(r["warnings"]) == 1
    assert "mode='reduce-overhead' dropped" in r["warnings"][0] and "'tpu'" in r["warnings"][0]


def test_prompts_in_one_bucket_compile_once_and_match_unpadded_tokens(with_patch):
    r = with_patch["same_bucket"]
    assert r["match"]
    assert r["programs"][1:] == [0, 0]


def test_left_padded_batch_is_bucketed_and_matches(with_patch):
    assert with_patch["ragged_batch"] == {"shape": [3, 16], "match": True}


def test_sampling_with_a_seed_is_reproducible_and_keeps_its_rows(with_patch):
    assert with_patch["sampling"] == {"reproducible": True, "shape": [6, 17]}


def test_streamer_sees_the_unpadded_prompt_and_every_token(with_patch):
    assert with_patch["streamer"] == {"prompt_unpadded": True, "all_tokens": True, "ended": True}


def test_other_modes_and_options_keep_working(with_patch):
    assert with_patch["beam"]["match"]
    assert with_patch["disable_compile"] == {"match": True, "graphs": 0}
    assert with_patch["max_length"]["match"]
    assert with_patch["eos"]["match"] and with_patch["eos"]["length"] < 7 + 8


def test_warmup_compiles_every_bucket_within_the_limits(with_patch):
    r = with_patch["warmup"]
    assert r["shapes"] == 2 * 3  # batch buckets 1, 2 x prompt rungs 16, 32, 64
    # The last two prompts are exactly a rung long (16, 32): their padding column moves them to
    # the next rung, whose masked graph warmup compiled (no mask-less graph of their own).
    assert r["programs_after"] == [0, 0, 0, 0, 0]


def test_without_the_patch_the_same_code_is_slow_or_broken():
    r = run_python(SCRIPT, env={"TRANSFORMERS_TPU_EXT_DISABLE": "generation"}, timeout=600)[0]
    assert r["tpu_inputs"]["graphs"] == 0  # nothing compiled: the dynamic cache grows every step
    assert r["compile_config"]["ok"] is False  # the tpu backend rejects mode="reduce-overhead"
    assert r["same_bucket"]["programs"][1] > 0  # every new prompt length costs new programs


EXTRA = Path(__file__).with_name("generation_extra_worker.py")


@pytest.fixture(scope="module")
def extra():
    return run_python(EXTRA)[0]


def test_encoder_decoder_with_inputs_on_tpu_matches_cpu(extra):
    r = extra["t5"]
    assert r.get("error") is None
    assert r["device"] == "tpu:0"
    assert r["match"] and r["distinct"] > 1


def test_inputs_embeds_on_tpu_match_cpu_and_decode_is_compiled(extra):
    r = extra["embeds"]
    assert r.get("error") is None
    assert r["device"] == "tpu:0"
    assert r["match"]
    assert r["graphs"] >= 1  # static cache by default: the decode step is compiled


def test_users_own_error_surfaces_once_without_a_fallback_log(extra):
    r = extra["user_error"]
    assert r["error"] == "ValueError"
    assert "modified the pretrained model configuration" in r["message"]
    assert r["falling_back_logged"] is False
