"""Requests that fail alone under ``transformers serve --continuous-batching`` on TPU (issue 37).

One fresh interpreter runs ``transformers serve`` (its own process; 5.25 runs the model in a spawned one)
with a context-sensitive tiny Qwen3 on the simulated TPU and sends 2 x 100 concurrent completions, 5 of
each 100 bad: no prompt, an empty prompt, ``max_tokens`` 0 and -1, a prompt past the serving max length.
Every bad one is a 400 naming the limit (refused at ``add_request``, ``serving.wrap_requests``; Transformers
5.24's server answers it with a bare 500), every good one the CPU's greedy tokens, ``/health`` 200
throughout, and the model's process compiles nothing after its warm-up (its simulated TPU's report). Before,
an empty prompt reached the scheduler and raised in the step's shape (``serving.shapes``), which stopped
the generation loop: a 500 for it, then a 503 for every later request and for ``/health``, until a
restart; ``max_tokens`` 0 or -3 were accepted with an empty completion.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

SCRIPT = Path(__file__).with_name("serve_bad_requests_worker.py")

ENV = {
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "64",
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "16",
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN": "64",
}

pytestmark = pytest.mark.slow  # transformers serve end to end, 200 requests


@pytest.fixture(scope="module")
def served():
    return run_python(SCRIPT, env=ENV, timeout=1200)[0]


def test_every_good_request_gets_the_cpu_tokens(served):
    assert served["good"]["total"] == 190
    assert served["good"]["ok"] == 190, served["good"]["wrong"][:3]
    assert served["after"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ("no prompt", "empty prompt"),
        ("empty prompt", "empty prompt"),
        ("max_tokens 0", "must be at least 1, got 0"),
        ("max_tokens -1", "must be at least 1, got -1"),
        ("too long", "TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN"),
    ],
)
def test_every_bad_request_is_a_400_naming_the_limit(served, bad, message):
    answers = served["bad"][bad]
    assert len(answers) == 2
    for status, detail in answers:
        if _release(served["transformers"]) >= (5, 25):  # 5.25's handler answers a request's ValueError with a 400
            assert status == 400 and message in detail, detail
        else:  # 5.24's server answers any error of a request with a 500, without its message: it fails alone
            assert status == 500, detail


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_the_server_stays_healthy(served):
    *statuses, count = served["health"]
    assert statuses == [200] and count > 0


def test_the_model_process_serves_them_on_the_patched_path_and_compiles_nothing_after_warm_up(served):
    # read from the simulated TPU's report of the process that runs the model (5.25: spawned by the server)
    engine = served["engine"]
    assert engine["patch"] == "applied"
    assert engine["programs_after_warmup"] == 0
