"""The opt-in int8 paged cache of continuous batching on TPU (``TRANSFORMERS_TPU_EXT_SERVE_KV_CACHE=int8``).

One fresh interpreter, one context-sensitive tiny Qwen3 with head_dim 64: int8 pages and a float32
scale per position and key-value head; each request's tokens equal the same math on CPU (generate()
with a float static layer storing quantize-dequantized keys/values, written here) and differ from
the float cache's; no program after the warm-up; the cache's bytes are the plan's; the pool of a bf16
model holds about twice the tokens; a block copy (a fork) copies the scales with the pages.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

# Its scenarios run in a fresh interpreter (a worker script): the everyday loop (-m "not slow") skips them.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("kv_int8_serving_worker.py")

ENV = {"TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "32", "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "8"}


@pytest.fixture(scope="module")
def served():
    return run_python(SCRIPT, env=ENV, timeout=900)[0]


def test_int8_pages_give_the_tokens_of_the_same_math_on_cpu(served):
    tokens = served["tokens"]
    assert tokens["equal_cpu_int8"]
    assert any(tokens["differ_from_float"])  # the quantization is in use


def test_int8_pages_compile_nothing_after_the_warmup(served):
    programs = served["programs"]
    assert programs["warmup_graphs"] == programs["shapes"] and programs["stream"] == 0


def test_int8_pages_and_scales_are_the_planned_bytes(served):
    b = served["bytes"]
    assert b["pages_dtype"] == "torch.int8" and b["format"] == "int8"
    assert b["held"] == b["plan"]


def test_a_block_copy_copies_the_scales_with_the_pages(served):
    assert served["fork"] == {"scales": True, "pages": True}


def test_the_pool_of_a_bf16_model_holds_about_twice_the_tokens(served):
    capacity = served["capacity"]
    assert 1.8 <= capacity["int8"] / capacity["None"] <= 2.0


def test_the_int8_cache_dtype_replaces_only_the_dtype_argument():
    import torch

    from transformers_tpu_ext.serving.runtime import int8_pages

    args = ("config", "cb", "device", "helper", torch.bfloat16, True)
    assert int8_pages(args, {}) == (("config", "cb", "device", "helper", torch.int8, True), {}, torch.bfloat16)
    kwargs = {"dtype": torch.float32, "model_supports_logits_to_keep": True}
    assert int8_pages(args[:4], kwargs) == (args[:4], {**kwargs, "dtype": torch.int8}, torch.float32)
