"""A ragged paged attention kernel that passes its check when the manager is made, then fails inside the
compiled step (issue 37; needs JAX: ``scripts/check_jax.sh`` runs it).

torch_tpu lowers a ``jax_op`` for each new input shape when the compiled step first runs it; the
worker makes the simulated lowering refuse every shape past the first ``n`` once the manager exists:

- during the warm-up (``n = 0``): the manager falls back to the plain-PyTorch attention with one
  warning, precompiles its steps again, serves the CPU's tokens, and a second batch compiles nothing;
- in the first serving steps, without a warm-up (``n = 1``: the prefill step runs the kernel and writes
  the pages in its layout; the first decode step's shape fails): the pages are rewritten in the
  plain-PyTorch layout, the step runs again, and the requests in flight get the CPU's tokens
  (int8 pages: their scales per layer and head become per position, and the requests are served).

Before the fallback, the step's error reached upstream's batch loop, which failed every request in
flight (and each later step failed the same way).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

pytestmark = pytest.mark.slow

pytest.importorskip("jax.experimental.pallas.ops.tpu.ragged_paged_attention")

SCRIPT = Path(__file__).with_name("ragged_fallback_worker.py")
ENV = {
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "64",
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "4",
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN": "128",
    "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
}


@pytest.fixture(scope="module")
def served():
    return run_python(SCRIPT, env=ENV, timeout=1800)[0]


@pytest.mark.parametrize("when", ["warmup", "serving", "serving_int8"])
def test_a_kernel_failing_in_the_compiled_step_falls_back_once_and_keeps_serving(served, when):
    got = served[when]
    assert got["chosen"] == "ragged" and got["attention"] == "paged"
    assert len(got["warnings"]) == 1, got["warnings"]
    assert "forced: Mosaic refuses" in got["warnings"][0]
    assert "precompiling" in got["warnings"][0] if when == "warmup" else "in a serving step" in got["warnings"][0]
    assert all(tokens and tokens[0] != "error" and len(tokens) == 4 for tokens in got["got"]), got["got"]


@pytest.mark.parametrize("when", ["warmup", "serving"])
def test_the_requests_get_the_cpu_tokens(served, when):
    assert served[when]["match"] and served[when]["again"], served[when]


def test_after_a_fallback_in_the_warm_up_a_batch_compiles_nothing(served):
    assert served["warmup"]["second_batch_programs"] == 0
