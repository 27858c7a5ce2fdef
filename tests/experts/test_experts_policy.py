"""The mixture-of-experts decisions (``experts.policy``): which experts calls take JAX's grouped matmul on TPU,
whether decoding keeps it, and how the kernel is tiled (plain data, milliseconds)."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.experts import policy

READY = dict(jax="0.10.2", kernel=True, jax_op=True)


def test_the_kernel_path_is_taken_on_tpu_with_jax_and_its_kernel_for_float32_and_bfloat16():
    for dtype in ("float32", "bfloat16"):
        assert policy.experts_path(policy.ExpertsFacts(dtype=dtype, **READY))[0] == "gmm"
    # what upstream applies around its grouped_mm the kernel path applies too
    for extra in (dict(has_bias=True, gate_layout="interleaved", transposed=True), dict(expert_parallel=True),
                  dict(has_gate=False)):
        assert policy.experts_path(policy.ExpertsFacts(**READY, **extra))[0] == "gmm"


@pytest.mark.parametrize(
    "facts, reason",
    [
        (policy.ExpertsFacts(tpu=False, **READY), "not on a TPU"),
        (policy.ExpertsFacts(dtype="float16", **READY), "float16 weights"),
        (policy.ExpertsFacts(), "JAX is not installed"),
        (policy.ExpertsFacts(jax="0.4.20", jax_op=True), "no megablox grouped matmul"),
        (policy.ExpertsFacts(jax="0.10.2", kernel=True), "no torch.tpu.pallas.jax_op"),
        (policy.ExpertsFacts(distributed_weights=True, **READY), "DTensors"),
    ],
)
def test_anything_else_keeps_transformers_grouped_mm(facts, reason):
    path, why = policy.experts_path(facts)
    assert path == "upstream" and reason in why


def test_decoding_keeps_grouped_mm_only_where_the_kernel_runs():
    keep = policy.decode_switch(policy.ExpertsFacts(**READY))
    assert keep[0] is False and "once" in keep[1]
    switch, why = policy.decode_switch(policy.ExpertsFacts())
    assert switch is True and "batched_mm" in why and "JAX is not installed" in why


@pytest.mark.parametrize("rows, padded", [(1, 8), (4, 8), (8, 8), (9, 16), (512, 512), (513, 640), (32768, 32768)])
def test_rows_are_padded_to_the_row_tile(rows, padded):
    assert policy.padded_rows(rows) == padded


def test_a_decode_step_is_one_row_tile_and_big_dimensions_are_blocks_of_512():
    assert policy.tiling(32, 2880, 5760) == (32, 512, 512)  # gpt-oss-20b decode: one row tile
    assert policy.tiling(512, 16, 64) == (512, 16, 64)  # small dimensions are one block (their full size)
    assert policy.tiling(32768, 7168, 4096) == (128, 512, 512)  # a prefill: tiles of 128 rows
    with pytest.raises(ValueError, match="pad them"):
        policy.tiling(12, 16, 16)


def test_the_docs_table_is_the_predicates():
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "mixture-of-experts.md").read_text()
    start = page.index(policy.BEGIN) + len(policy.BEGIN)
    assert page[start : page.index(policy.END, start)].strip() == policy.path_table()
