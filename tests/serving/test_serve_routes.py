"""A ``ContinuousBatchingManager`` leaves the model usable: every route of ``transformers serve
--continuous-batching`` before and after continuous-batching requests, and the model itself inside
a running manager's ``pause()`` block (issue 18, item 3).

One fresh interpreter runs Transformers' own serve app on the simulated TPU with a context-sensitive
tiny Qwen3 (a chat template and single-token decision labels added, so every text route has
something to answer), and the same requests' answers computed on the CPU with the plugin doing
nothing there. On main, the manager switched the model's attention to its paged kernel for its whole
life: ``/v1/systemone`` (which runs the model outside continuous batching) answered 500 after the
first chat request, and a forward in ``pause()`` raised ``KeyError: 'tpu_positions'``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

SCRIPT = Path(__file__).with_name("serve_routes_worker.py")

ENV = {"TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "32", "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "8"}


pytestmark = pytest.mark.slow  # one interpreter: transformers serve and a manager, end to end


@pytest.fixture(scope="module")
def served():
    return run_python(SCRIPT, env=ENV, timeout=900)[0]


def test_every_route_answers_before_and_after_continuous_batching_requests(served):
    expected = served["expected"]
    answers = {
        "GET /health": [200, None],
        "GET /v1/models": [200, None],
        "POST /v1/systemone": [200, expected["systemone"]],  # runs the model outside continuous batching
        "POST /v1/completions": [200, expected["completions"]],
    }
    assert served["before"] == {route: answers[route] for route in ("GET /health", "GET /v1/models", "POST /v1/systemone")}
    for when in ("first", "again"):
        got = served[when]
        assert {route: got[route] for route in answers} == answers, when
        # The chat routes answer with the tiny model's response parsing (upstream's; it keeps the prompt
        # text here), ending with the CPU's greedy continuation of the same message.
        for route in ("POST /v1/chat/completions", "POST /v1/responses"):
            status, text = got[route]
            assert status == 200 and text.endswith(expected["chat"]), (when, route, got[route])
    assert served["again"] == served["first"]
    # counted in the process that runs the model (Transformers 5.25: a spawned one), where the patch applies
    assert served["engine"]["patch"] == "applied"


def test_the_model_works_inside_a_running_managers_pause(served):
    pause = served["pause"]
    assert pause["logits_close"] and pause["tokens_equal"] and pause["request_equal"]
    assert pause["attention_during"] == "tpu_paged|sdpa" and pause["attention_after"] == "sdpa"
