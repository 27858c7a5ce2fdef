"""The opt-in int8 KV cache of generate() on TPU (``TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE=int8``).

One fresh interpreter, one context-sensitive tiny Qwen3 with a realistic head_dim (64): the plugin's
static cache holds int8 keys/values and float32 scales; its tokens equal the same math on CPU (a
float static layer storing each key/value quantize-dequantized, written in the test, passed to
upstream's generate(), plugin inactive) and differ from the float cache's; its logits differ from the
float cache's; the bytes are those ``quantization.capacity`` counts and at most 0.55x bf16; it
compiles no more programs than the plain static cache (0 on a repeat); beam search reorders the
scales; the cache handed back is a plain one in the model's dtype; upstream's quantized cache is left
alone (said once).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python

# Its scenarios run in a fresh interpreter (a worker script): the everyday loop (-m "not slow") skips them.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("kv_int8_worker.py")


@pytest.fixture(scope="module")
def kv():
    return run_python(SCRIPT, timeout=900)[0]


def test_the_plugins_static_cache_holds_int8_only_when_asked(kv):
    assert set(kv["layers"]["plain"]) == {"StaticLayer"}
    assert set(kv["layers"]["int8"]) == {"Int8StaticLayer"} and kv["layers"]["dtypes"] == ["torch.int8"]


def test_int8_tokens_equal_the_same_int8_cache_on_cpu(kv):
    assert kv["tokens"] == {"int8_equals_cpu_int8": True, "plain_equals_cpu_float": True, "int8_differs_from_float": True}
    assert kv["logits"]["tokens_equal"]


def test_int8_logits_are_the_cpu_int8_ones_and_not_the_float_caches(kv):
    logits = kv["logits"]
    assert logits["close_to_cpu_int8"] < 1e-4
    assert logits["from_float_cache"] > 1e-3 and logits["float_vs_int8_cpu"] > 1e-3  # the quantization is in use


def test_int8_cache_bytes_are_what_capacity_counts_and_about_half_of_bf16(kv):
    b = kv["bytes"]
    assert b["held"] == b["capacity"]
    assert b["int8_bf16_model"] <= 0.55 * b["bf16"]


def test_int8_compiles_no_more_than_the_plain_static_cache_and_decodes_on_the_device(kv):
    plain, int8 = kv["programs"]["plain"], kv["programs"]["int8"]
    assert int8[0] <= plain[0]  # graphs (the decode step: one)
    assert int8[2] == 0 and plain[2] == 0  # a repeat compiles nothing
    plain_d2h, int8_d2h = kv["programs"]["d2h"]
    assert int8_d2h == plain_d2h  # the device loop (token ids cross the host link, never the logits)


def test_the_warmup_compiles_what_an_int8_call_runs(kv):
    assert kv["after_warmup"] == 0


def test_the_returned_cache_is_upstreams_kind_holding_the_dequantized_values(kv):
    returned = kv["returned"]
    assert returned["type"] == "StaticCache" and returned["layer"] == "StaticLayer"
    assert returned["dtype"] == "torch.float32" and returned["keys_are_the_int8_values"]
    assert returned["default"] == "DynamicCache"


def test_beam_search_reorders_the_scales_with_the_data(kv):
    assert kv["beams"]["tokens"] and kv["beams"]["scores"] < 1e-5


def test_upstreams_quantized_cache_is_left_alone_and_the_alternative_said_once(kv):
    assert kv["quantized_said"] == 1
