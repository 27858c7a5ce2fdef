"""JAX's megablox grouped matmul on the simulated TPU (``testing.megablox``): the weight bytes its grid reads,
lowered for a chip (what the chip refuses is refused), run as its definition (rows no group covers left unwritten)."""


import pytest
import torch

from transformers_tpu_ext.testing import megablox


def test_a_decode_step_reads_each_selected_expert_once():
    # 4 rows in one tile, experts 0 and 2 selected (2 rows each): their [k, n] weights once each
    assert megablox.gmm_weight_reads([2, 0, 2, 0], 32, 64, (8, 32, 64), 2) == 2 * 32 * 64 * 2


def test_each_row_tile_a_group_touches_reads_its_blocks_again():
    # 20 rows in tiles of 8: group 0 rows 0-9 (tiles 0, 1), group 1 rows 10-19 (tiles 1, 2); k in 2 blocks
    one = 16 * 8 * 4  # a [tk, tn] float32 block
    assert megablox.gmm_weight_reads([10, 10], 32, 8, (8, 16, 8), 4) == 4 * 2 * one
    # with one k block, consecutive visits of the same group reuse the block (Pallas copies it once)
    assert megablox.gmm_weight_reads([10, 10], 16, 8, (8, 16, 8), 4) == 2 * one


@pytest.fixture(scope="module")
def ops(plugin_patches_off):
    pytest.importorskip("jax.experimental.pallas.ops.tpu.megablox")
    from transformers_tpu_ext import testing
    from transformers_tpu_ext.experts import kernel

    testing.install(chips=1)
    kernel.register()
    return kernel


def test_gmm_runs_its_definition_and_leaves_rows_of_no_group_unwritten(ops):
    gen = torch.Generator().manual_seed(0)
    lhs, weights = torch.randn(8, 16, generator=gen), torch.randn(3, 32, 16, generator=gen)  # [experts, n, k]
    sizes = torch.tensor([2, 0, 4], dtype=torch.int32)  # rows 6 and 7: no group
    megablox.STATS.reset()
    out = ops.op("gmm_t")(lhs.to("tpu"), weights.to("tpu"), sizes.to("tpu")).cpu()
    torch.testing.assert_close(out[:2], lhs[:2] @ weights[0].T)
    torch.testing.assert_close(out[2:6], lhs[2:6] @ weights[2].T)
    assert torch.isnan(out[6:]).all()
    assert megablox.STATS.weight_bytes_read == megablox.STATS.selected_bytes == 2 * 32 * 16 * 4


def test_a_block_the_chip_cannot_lay_out_is_refused_when_lowered(ops):
    import importlib

    import jax

    backend = importlib.import_module(megablox.MODULE)

    def gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
        return backend.gmm(lhs, rhs, group_sizes, tiling=(8, 32, 16))  # n block 16 of 32: neither 128 nor whole

    op = torch.tpu.pallas.jax_op("tests_megablox::bad_tiling", gmm)
    args = [torch.randn(8, 32), torch.randn(2, 32, 32), torch.tensor([4, 4], dtype=torch.int32)]
    with pytest.raises(ValueError, match="does not lower for a TPU"):
        op(*[a.to("tpu") for a in args])
    def good(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
        return backend.gmm(lhs, rhs, group_sizes, tiling=(8, 32, 32))  # the same call, blocks the chip takes

    out = torch.tpu.pallas.jax_op("tests_megablox::good_tiling", good)(*[a.to("tpu") for a in args]).cpu()
    torch.testing.assert_close(out[:4], args[0][:4] @ args[1][0])
