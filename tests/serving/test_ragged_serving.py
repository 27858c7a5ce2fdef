"""Continuous batching on TPU with JAX's ragged paged attention kernel (``serving.ragged``; needs JAX).

One fresh interpreter serves a mixed stream (prompts 1..90 tokens, chunked past 32, prefill and decode
in the same steps, pages of 8 tokens) with a context-sensitive tiny Qwen3 of head size 128 (the kernel's), the kernel run
through the simulated ``torch.tpu.pallas.jax_op`` (the kernel's reference on the same inputs); then the
same requests with the present plain-PyTorch attention (``TRANSFORMERS_TPU_EXT_SERVE_ATTENTION=paged``);
then a sliding-window model (Mistral, window 8); then a JAX without the kernel (head size 64 takes the kernel now: test_ragged_formats.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

# Its scenarios run in a fresh interpreter (a worker script): the everyday loop (-m "not slow") skips them.
pytestmark = pytest.mark.slow

pytest.importorskip("jax.experimental.pallas.ops.tpu.ragged_paged_attention")

SCRIPT = Path(__file__).with_name("ragged_serving_worker.py")

ENV = {
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "32",
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "8",
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN": "128",
    "TRANSFORMERS_TPU_EXT_SERVE_PAGE_SIZE": "8",  # pages small next to these short requests
    # The kernel's reference runs op by op on JAX's CPU backend: each new shape compiles a little XLA
    # program; unoptimized ones compile several times faster and compute the same.
    "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
}


@pytest.fixture(scope="module")
def served():
    return run_python(SCRIPT, env=ENV, timeout=1500)[0]


def test_the_kernel_path_gives_the_tokens_of_plain_transformers_on_cpu(served):
    kernel = served["kernel"]
    assert kernel["attention"] == "ragged" and kernel["match"]
    assert kernel["calls"] == kernel["steps"] * kernel["layers"]  # one kernel call per layer and step


def test_the_kernel_path_compiles_nothing_after_the_warmup(served):
    assert served["kernel"]["stream_programs"] == 0  # and cache-only mode raised on none


def test_the_kernel_reads_the_pages_the_requests_hold(served):
    kernel = served["kernel"]
    # What the simulator saw the kernel read is what the plugin counts, layer by layer.
    assert kernel["simulated_read"] == kernel["planned_read"] * kernel["layers"]
    assert kernel["decode_ratio"] <= 1.25
    # The present path gathers max_len keys for every scheduled token: several times what is held.
    assert served["present"]["decode_ratio"] > 3 * kernel["decode_ratio"]


def test_the_present_path_gives_the_same_tokens_without_the_kernel(served):
    assert served["present"] == {**served["present"], "attention": "paged", "match": True, "calls": 0}


def test_the_sliding_window_goes_to_the_kernel(served):
    assert served["sliding"] == {"attention": "ragged", "match": True}


@pytest.mark.parametrize(
    "case, reason", [("no_kernel", "has no ragged paged attention kernel")]
)
def test_what_the_kernel_cannot_take_runs_the_present_path_and_says_why(served, case, reason):
    attention, messages = served[case]
    assert attention == "paged"
    assert len(messages) == 1 and reason in messages[0]
