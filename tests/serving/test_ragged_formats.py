"""JAX's ragged paged attention kernel on the serving path for every head size and page format (issue 37;
needs JAX: ``scripts/check_jax.sh`` runs it).

One fresh interpreter, context-sensitive tiny Qwen3s of 8 query and 4 key-value heads on the simulated TPU
(its ``jax_op`` applies torch-tpu's registration rules and lowers the kernel for the chip before running its
reference). 12 mixed requests (prompts 100 to 600 tokens, 6 new tokens each, up to 256 tokens a step) through a manager, for head
size 64 (two heads lane-packed per 128 lanes) and 128, float and int8 pages: the CPU's ``generate()`` tokens
(int8: the same int8 math, a scale per layer and key-value head; its pages hold a quarter of float32's bytes), a decode step reading at most 1.25x the
K/V bytes it holds, nothing compiled for the same requests again. And a kernel that torch_tpu refuses at
registration: the manager falls back to the plain-PyTorch attention with one warning, and serves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

pytestmark = pytest.mark.slow

pytest.importorskip("jax.experimental.pallas.ops.tpu.ragged_paged_attention")

SCRIPT = Path(__file__).with_name("ragged_formats_worker.py")
ENV = {
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "256",  # fewer prefill steps (each runs JAX's reference op by op)
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "16",
    "TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN": "1024",
    "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
}
FORMATS = ["64_float", "64_int8", "128_float", "128_int8"]


@pytest.fixture(scope="module")
def served():
    return run_python(SCRIPT, env=ENV, timeout=3600)[0]


@pytest.mark.parametrize("name", FORMATS)
def test_every_head_size_and_page_format_runs_the_kernel_with_the_cpu_tokens(served, name):
    got = served[name]
    assert got["attention"] == "ragged" and got["match"] and got["again"]
    assert got["lanes"] == (2 if name.startswith("64") else 1)
    assert got["pages_dtype"] == ("torch.int8" if name.endswith("int8") else "torch.float32")
    if name.endswith("int8"):  # int8 pages: a quarter of the float32 model's bytes for the same tokens held
        assert got["kv_bytes_held"] * 4 == served[name.replace("int8", "float")]["kv_bytes_held"]


@pytest.mark.parametrize("name", FORMATS)
def test_a_decode_step_reads_at_most_125_percent_of_what_it_holds(served, name):
    got = served[name]
    assert got["decode_ratio"] <= 1.25
    assert got["simulated_read"] > 0


@pytest.mark.parametrize("name", FORMATS)
def test_a_second_batch_compiles_nothing(served, name):
    assert served[name]["second_batch_programs"] == 0


def test_a_kernel_refused_at_registration_falls_back_and_serves(served):
    failed = served["forced_failure"]
    assert failed["attention"] == "paged" and failed["match"]
    assert len(failed["warnings"]) == 1 and "forced: this torch_tpu refuses the kernel" in failed["warnings"][0]
