"""Which attention a TPU serving step runs (``serving.kernel_path``): pure, milliseconds.

The "safe when" predicate of JAX's ragged paged attention kernel, the head tiling rule it mirrors, and
the K/V bytes each path reads on a workload of mixed lengths (16 to 1,000 tokens).
"""

from __future__ import annotations

import random

import pytest

from transformers_tpu_ext.serving import kernel_path
from transformers_tpu_ext.serving import policy as serving
from transformers_tpu_ext.serving.kernel_path import KernelFacts, attention_path

ARGS = (*kernel_path.KERNEL_ARGS, "sm_scale", "sliding_window", "soft_cap", "mask_value", "k_scale", "v_scale")
TAKEN = KernelFacts(jax="0.10.2", kernel_args=ARGS, jax_op=True, head_dim=128, heads=8, kv_heads=2, dtype="bfloat16")


def test_a_model_the_kernel_takes_runs_it():
    assert attention_path(TAKEN) == (
        "ragged", "JAX 0.10.2 ragged paged attention through torch.tpu.pallas.jax_op (bfloat16 pages)"
    )


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(setting="paged"), "TRANSFORMERS_TPU_EXT_SERVE_ATTENTION=paged"),
        (dict(jax=None), "JAX is not installed"),
        (dict(kernel_args=()), "JAX 0.10.2 has no ragged paged attention kernel with combined K/V pages"),
        # JAX's first kernel took keys and values as two page arrays
        (dict(kernel_args=("q", "k_pages", "v_pages", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")), "no ragged"),
        (dict(kernel_args=kernel_path.KERNEL_ARGS), "no ragged"),  # no sliding window / soft cap arguments
        (dict(jax_op=False), "no torch.tpu.pallas.jax_op"),
        (dict(attention_sinks=True), "attention sinks"),
        (dict(kv_cache="fp8"), "the fp8 KV cache"),
        (dict(dtype="float16"), "float16"),
        (dict(head_dim=96), "head size 96 (the kernel takes multiples of 128, or divisors of 128 lane-packed; pages padded to 128 lanes would hold and read 33% more bytes"),
        (dict(head_dim=64, heads=6, kv_heads=3), "head size 64 with 3 key-value heads"),
        (dict(heads=6, kv_heads=4), "6 query heads for 4 key-value heads"),
        (dict(heads=6, kv_heads=3), "3 key-value heads of size 128 in bfloat16 pages"),
        (dict(kv_cache="int8", kv_heads=1, heads=8), "1 key-value heads of size 128 in int8 pages"),
    ],
)
def test_what_the_kernel_cannot_take_runs_the_present_path(change, reason):
    path, why = attention_path(KernelFacts(**{**TAKEN.__dict__, **change}))
    assert path == "paged" and reason in why


def test_head_sizes_that_are_multiples_of_128_are_taken():
    for head_dim in (128, 256):
        assert attention_path(KernelFacts(**{**TAKEN.__dict__, "head_dim": head_dim}))[0] == "ragged"


@pytest.mark.parametrize(
    "head_dim, kv_heads, lanes", [(128, 3, 1), (256, 1, 1), (64, 8, 2), (64, 2, 2), (64, 3, 0), (32, 8, 4), (96, 8, 0), (80, 4, 0)]
)
def test_head_sizes_dividing_128_are_lane_packed(head_dim, kv_heads, lanes):
    assert kernel_path.lane_packing(head_dim, kv_heads) == lanes


def test_head_size_64_and_int8_pages_take_the_kernel():
    llama_1b = KernelFacts(**{**TAKEN.__dict__, "head_dim": 64, "heads": 32, "kv_heads": 8})
    assert attention_path(llama_1b) == (
        "ragged", "JAX 0.10.2 ragged paged attention through torch.tpu.pallas.jax_op (bfloat16 pages, 2 heads per 128 lanes)"
    )
    assert attention_path(KernelFacts(**{**llama_1b.__dict__, "kv_cache": "int8"}))[1].endswith("(int8 pages, 2 heads per 128 lanes)")
    qwen_05b = KernelFacts(**{**TAKEN.__dict__, "head_dim": 64, "heads": 14, "kv_heads": 2})
    assert attention_path(qwen_05b)[0] == "ragged"
    # int8: 2 * 1 packed head is not a whole number of 32-bit rows
    assert attention_path(KernelFacts(**{**qwen_05b.__dict__, "kv_cache": "int8"}))[0] == "paged"


TABLE = {"TPU v6": {("bfloat16", "bfloat16", 8, 2, 128, 16, 64, 256): (16, 32)}}


@pytest.mark.parametrize(
    "generation, key, sizes",
    [
        ("v6e", ("bfloat16", "bfloat16", 8, 2, 128, 16, 64, 16), (16, 32)),  # JAX's tuned entry
        ("v6e", ("bfloat16", "bfloat16", 5, 2, 128, 16, 40, 13), (13, 32)),  # rounded as JAX rounds the key
        ("v6e", ("float32", "float32", 8, 2, 128, 16, 64, 16), (16, 32)),  # not tuned: JAX's defaults (128, 32)
        ("v5e", ("bfloat16", "bfloat16", 8, 2, 128, 16, 64, 16), (16, 32)),
        ("v5e", ("bfloat16", "bfloat16", 8, 2, 128, 16, 16, 200), (128, 16)),
        ("v4", ("bfloat16", "bfloat16", 8, 2, 128, 16, 64, 64), (32, 32)),  # JAX's v4 sizes
        ("v6e", ("bfloat16", "bfloat16", 8, 2, 128, 16, 16, 8), (8, 16)),  # never past the step or the table
    ],
)
def test_block_sizes_come_from_jax_s_table_for_the_chip_torch_tpu_names(generation, key, sizes):
    assert kernel_path.block_sizes(generation, TABLE, key) == sizes


@pytest.mark.parametrize(
    "kv_heads, itemsize, tiles",
    [(1, 4, True), (2, 4, True), (3, 4, False), (4, 4, True), (8, 4, True), (12, 4, True), (6, 4, False),
     (1, 2, True), (2, 2, True), (4, 2, True), (3, 2, False), (8, 2, True), (16, 2, True), (12, 2, False)],
)
def test_the_head_tiling_rule_is_the_kernels(kv_heads, itemsize, tiles):
    # get_min_heads_per_blk: 2 * kv_heads combined heads in 32-bit rows, 1, 2, 4, 8 or a multiple of 8 rows
    assert kernel_path.heads_tile(kv_heads, itemsize) is tiles


def test_the_attention_setting_is_checked_and_read_from_the_environment():
    assert serving.current({"TRANSFORMERS_TPU_EXT_SERVE_ATTENTION": "PAGED"}).attention == "paged"
    assert serving.current({}).attention == "auto"
    problems = serving.check_environment({"TRANSFORMERS_TPU_EXT_SERVE_ATTENTION": "flash"})
    assert len(problems) == 1 and "TRANSFORMERS_TPU_EXT_SERVE_ATTENTION" in problems[0] and "auto" in problems[0]


def test_byte_counts():
    per_token = 2 * 8 * 128 * 2  # keys and values, 8 kv heads of 128, bf16
    assert kernel_path.held_kv_bytes([1, 17, 32], per_token) == 50 * per_token
    assert kernel_path.kernel_kv_bytes([1, 17, 32], 16, per_token) == (1 + 2 + 2) * 16 * per_token
    assert kernel_path.gathered_kv_bytes(16, 2048, per_token) == 16 * 2048 * per_token


def test_a_decode_step_over_mixed_lengths_reads_about_what_it_holds():
    """16 to 1,000 tokens per request, 64 requests decoding, at the default max length (2048, pages of 128)."""
    rng = random.Random(0)
    max_len = serving.DEFAULT_MAX_LEN
    page = serving.page_size_for(max_len)
    per_token = 2 * 8 * 128 * 2
    for _ in range(20):
        lens = [rng.randint(16, 1000) for _ in range(64)]
        held = kernel_path.held_kv_bytes(lens, per_token)
        read = kernel_path.kernel_kv_bytes(lens, page, per_token)
        gathered = kernel_path.gathered_kv_bytes(64, serving.blocks_per_request(max_len, page) * page, per_token)
        assert held <= read <= 1.25 * held
        assert gathered / held > 3  # the present path: max_len / mean context (about 4)


def test_the_docs_table_is_the_predicates():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    begin = text.index(kernel_path.BEGIN) + len(kernel_path.BEGIN)
    assert text[begin : text.index(kernel_path.END, begin)].strip() == kernel_path.path_table()


@pytest.mark.parametrize("head_dim, lanes", [(128, 1), (64, 2)])
def test_a_fallback_rewrites_kernel_pages_in_the_present_layout_with_their_scales(head_dim, lanes):
    # issue 37: a kernel failing in a serving step: the pages the requests in flight hold move to upstream's
    # layout ([2, page_size, kv_heads, head_dim] per layer and page) and int8 scales per layer and head to per position
    import types

    import torch

    from transformers_tpu_ext.serving import ragged

    blocks, layers, page, heads = 3, 2, 4, 4
    pages = blocks * layers
    kernel = torch.randint(-127, 128, (pages, page, heads // lanes, 2, lanes, head_dim), dtype=torch.int8)
    allocator = types.SimpleNamespace(
        cache_tensor=kernel.clone().view(pages * page, 2, heads, head_dim), num_key_value_heads=heads,  # upstream's shape
        head_dim=head_dim, tokens_per_page=page, pages_per_block=layers,
    )
    ragged.to_present_layout(allocator, chunk=4)  # chunks that do not divide the pages
    present = allocator.cache_tensor.view(pages, 2, page, heads, head_dim)
    for p in range(pages):
        for kv in range(2):
            for t in range(page):
                for h in range(heads):
                    assert torch.equal(present[p, kv, t, h], kernel[p, t, h // lanes, kv, h % lanes])
    head_scales = torch.rand(layers, 2, heads)
    rows = ragged.present_scales(allocator, head_scales).view(blocks, layers, 2, page, heads)
    assert torch.equal(rows, head_scales[None, :, :, None, :].expand(blocks, layers, 2, page, heads))


def test_only_a_failure_of_the_kernel_sends_the_manager_to_the_present_path():
    from transformers_tpu_ext.serving import ragged

    try:
        raise ValueError("transformers_tpu_ext::ragged_paged_attention_v6e_l1_0 does not lower for a TPU v6 lite")
    except ValueError as error:
        assert ragged.failed_here(error)
    try:
        try:
            raise KeyError("x")
        except KeyError as inner:
            raise RuntimeError("the step failed") from inner
    except RuntimeError as error:
        assert not ragged.failed_here(error)  # a model's own bug is upstream's to handle


def test_a_head_size_the_kernel_cannot_take_is_said_once_per_model_with_the_reason():
    # issue 37: head size 96 (Phi-3 mini) stays on the plain-PyTorch path, and the user is told why, once
    import logging

    from transformers_tpu_ext.core import wrapping
    from transformers_tpu_ext.serving import ragged
    from transformers_tpu_ext.testing.tiny import tiny_model

    model = tiny_model("qwen3", head_dim=96, num_attention_heads=4, num_key_value_heads=2)
    said = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("transformers_tpu_ext")
    logger.addHandler(handler)
    try:
        for _ in range(2):  # a second manager of the same model: nothing more said
            assert ragged.choose(model, "auto", None, False) == ("paged", None)
    finally:
        logger.removeHandler(handler)
    (message,) = said
    wrapping._warned.discard(message.removeprefix("transformers-tpu-ext: "))
    assert "Qwen3ForCausalLM" in message and "head size 96" in message and "33% more bytes" in message
