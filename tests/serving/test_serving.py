"""Continuous batching and ``transformers serve`` on the simulated TPU (patch ``continuous_batching``).

One fresh interpreter runs every scenario and reports what a user would see (tokens, programs
compiled, the cache's size, messages); a second runs the main scenario with the patch disabled, to
show those facts come from the patch. Small ladders (32 tokens, 8 requests: two step shapes) keep
compilation short; the policy behind bigger ladders is unit-tested in ``test_serving_policy.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

# Its scenarios run in a fresh interpreter (a worker script): the everyday loop (-m "not slow") skips them.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("serving_worker.py")

ENV = {"TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "32", "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "8"}


@pytest.fixture(scope="module")
def served():
    return run_python(SCRIPT, env=ENV, timeout=600)[0]


def test_mixed_stream_compiles_nothing_after_warmup_and_matches_generate(served):
    a = served["A"]
    assert a["planned"] and a["shapes"] == 2
    assert a["warmup_graphs"] == a["shapes"]  # one graph per (tokens, requests) shape, K never a shape
    assert a["stream_programs"] == 0
    assert a["match"]
    assert a["plan"]["stats"]["tokens"] == sum([1, 70, 9, 33, 16, 2, 48, 25, 5, 40]) + sum([8, 1, 5, 3, 8, 2, 6, 4, 7, 1]) - 10
    assert a["plan"]["stats"]["token_overhead"] >= 1.0


def test_tpu_backend_synchronous_path_and_attention_restored(served):
    a = served["A"]
    assert a["backend"] == "tpu" and a["compute_stream"] and a["async_batching"] is False
    assert a["attention_during"] == "tpu_paged|sdpa" and a["attention_after"] == "sdpa"


def test_paged_cache_is_sized_from_the_chip_hbm(served):
    a = served["A"]
    plan = a["plan"]
    assert a["cache_bytes"] == plan["kv_cache_bytes"]
    assert plan["kv_budget_bytes"] == a["hbm"] - plan["resident_bytes"] - plan["headroom_bytes"]
    assert plan["kv_cache_bytes"] + plan["step_bytes"] <= plan["kv_budget_bytes"]
    assert plan["kv_cache_fraction_of_budget"] >= 0.8


def test_generate_batch_with_a_sliding_window_matches_and_reuses_its_programs(served):
    first, second = served["B"]
    assert first["match"] and second["match"]
    assert first["graphs"] == 2 and second["graphs"] == 0


def test_user_mistakes_and_adaptations_are_reported_up_front(served):
    # 600 tokens for a model of 512 positions: no serving max length could take it (the max length's own message:
    # test_serve_bad_requests.py)
    assert "max_position_embeddings" in served["too_long"] and "600" in served["too_long"]
    compile_config = served["compile_config"]
    assert compile_config["backend"] == "tpu" and compile_config["mode"] == "default"
    assert compile_config["async_batching"] is False
    assert len(compile_config["warnings"]) == 1 and "backend='inductor' -> 'tpu'" in compile_config["warnings"][0]


def test_off_tpu_nothing_changes(served):
    for case in served["off_tpu"].values():
        assert case == {"planned": False, "attention": "sdpa", "match": True}


def test_transformers_serve_answers_on_the_tpu_and_compiles_once(served):
    # `transformers serve` in a process of its own (5.25: the model in a spawned process, "model"): the programs
    # are counted in the process that runs the model (its simulated TPU's report), where the patch is applied
    serve = served["serve"]
    assert serve["match"], serve["answers"]
    assert serve["engine_patch"] == "applied" and not serve["engine_pid_is_own"]
    assert serve["loaded_programs"] + serve["programs"][0] > 0  # its warm-up: with the model (5.25) or the first request
    assert serve["programs"][1] == 0


def test_deactivate_restores_the_originals_and_activate_reapplies(served):
    assert served["reverted"] and served["reapplied"]


def test_without_the_patch_the_stream_keeps_compiling():
    r = run_python(SCRIPT, env={**ENV, "MODE": "disabled", "TRANSFORMERS_TPU_EXT_DISABLE": "continuous_batching"})[0]
    a = r["A"]
    assert not a["planned"] and a["warmup_graphs"] == 0
    assert a["stream_programs"] > 100  # eager, one program per new operation shape
    assert a["match"]  # upstream is correct, just not static
    assert a["attention_during"] == "sdpa"
