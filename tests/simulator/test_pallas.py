"""The simulated ``torch.tpu.pallas.jax_op`` (``transformers_tpu_ext.testing.pallas``; needs JAX).

JAX's ragged paged attention kernel behind an annotated function through ``jax_op`` is lowered for the
simulated chip, then runs the kernel's reference on the same inputs (eagerly and inside a graph the
``"tpu"`` backend compiled), counts the K/V bytes of the pages each sequence's ``kv_len`` covers, and
refuses what torch_tpu refuses when it registers the function (no return annotation: JAX's kernel itself)
and what the kernel refuses when a chip traces and lowers it (no block sizes: JAX sees no TPU).
"""

from __future__ import annotations

import functools

import pytest
import torch

pytestmark = pytest.mark.slow  # the first call of the kernel's reference compiles JAX's CPU ops (~30 s)

rpa = pytest.importorskip("jax.experimental.pallas.ops.tpu.ragged_paged_attention")

from transformers_tpu_ext.testing import pallas  # noqa: E402

HEADS, KV_HEADS, DIM, PAGE, PAGES, SEQS, WIDTH = 4, 2, 128, 16, 32, 4, 4


import jax  # noqa: E402


def kernel(q: jax.Array, kv: jax.Array, kv_lens: jax.Array, pages: jax.Array, cu: jax.Array, seqs: jax.Array) -> jax.Array:
    return rpa.ragged_paged_attention(q, kv, kv_lens, pages, cu, seqs, sm_scale=0.125, num_kv_pages_per_block=2,
                                      num_queries_per_block=16)


def guessing_kernel(q: jax.Array, kv: jax.Array, kv_lens: jax.Array, pages: jax.Array, cu: jax.Array,
                    seqs: jax.Array) -> jax.Array:
    return rpa.ragged_paged_attention(q, kv, kv_lens, pages, cu, seqs, sm_scale=0.125)  # block sizes from jax.devices()


@pytest.fixture(scope="module")
def op(plugin_patches_off):
    from transformers_tpu_ext import testing

    testing.install(chips=1)
    return torch.tpu.pallas.jax_op("tests_pallas::ragged_paged_attention", kernel)


def _inputs(head_dim=DIM, kv_heads=KV_HEADS, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(16, HEADS, head_dim, generator=gen).to(dtype)
    kv = torch.randn(PAGES, PAGE, 2 * kv_heads, head_dim, generator=gen).to(dtype)
    kv_lens = torch.tensor([5, 20, 1, 0], dtype=torch.int32)  # a prefill of 5, a chunk of 3 after 17, a decode
    pages = torch.tensor([[3, 4, 0, 0], [7, 9, 11, 0], [2, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.int32)
    cu_q_lens = torch.tensor([0, 5, 8, 9, 9], dtype=torch.int32)
    num_seqs = torch.tensor([3], dtype=torch.int32)
    return [q, kv, kv_lens, pages, cu_q_lens, num_seqs]


def _reference(args):
    import jax.numpy as jnp

    arrays = [jnp.asarray(a.float().numpy() if a.is_floating_point() else a.numpy()) for a in args]
    return torch.from_numpy(__import__("numpy").asarray(rpa.ref_ragged_paged_attention(*arrays, sm_scale=0.125)).copy())


def test_jax_op_runs_the_kernels_reference_on_the_tpu_and_counts_the_pages_it_reads(op):
    args = _inputs()
    pallas.STATS.reset()
    out = op(*[a.to("tpu") for a in args])
    assert out.device.type == "tpu" and out.shape == args[0].shape and out.dtype == torch.float32
    expected = _reference(args)  # 9 real rows; the padding rows are zeros
    torch.testing.assert_close(out.cpu()[:9], expected)
    assert torch.count_nonzero(out.cpu()[9:]) == 0
    # pages of kv_len 5, 20 and 1 (the padding sequence past num_seqs reads nothing)
    assert pallas.STATS.calls == 1
    assert pallas.STATS.kv_bytes_read == (1 + 2 + 1) * PAGE * 2 * KV_HEADS * DIM * 4


def test_jax_op_runs_inside_a_compiled_graph(op, simulated_tpu):
    args = [a.to("tpu") for a in _inputs()]
    compiled = torch.compile(lambda *a: op(*a) * 2, backend="tpu")
    before = simulated_tpu.counters()
    out = compiled(*args)
    assert (simulated_tpu.counters() - before).graphs_compiled == 1
    torch.testing.assert_close(out.cpu(), 2 * op(*args).cpu())


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda a: a.__setitem__(2, a[2].long()), TypeError, "takes it as a 32-bit array"),
        (lambda a: a.__setitem__(0, a[0][:, :, :64].contiguous()) or a.__setitem__(1, a[1][..., :64].contiguous()),
         ValueError, "does not lower for a TPU v6 lite"),  # head size 64 unpacked: the kernel's lowering refuses it
        (lambda a: a.__setitem__(0, torch.randn(16, 6, DIM)) or a.__setitem__(1, torch.randn(PAGES, PAGE, 6, DIM)),
         ValueError, "can not be XLA fully tiled"),  # 3 key-value heads in float32
        (lambda a: a.__setitem__(0, a[0].to(torch.complex64)), NotImplementedError, "Unsupported dtype for pallas kernels"),
        (lambda a: a.__setitem__(2, torch.tensor([5, 70, 1, 0], dtype=torch.int32)), ValueError, "pages_per_seq"),
    ],
)
def test_jax_op_refuses_what_the_kernel_refuses(op, change, error, message):
    args = _inputs()
    change(args)
    with pytest.raises(error, match=message):
        op(*[a.to("tpu") for a in args])


def test_jax_op_refuses_jax_s_kernel_itself_as_torch_tpu_does(op):
    # torch_tpu 0.2.0 reads the function's annotations: the kernel has no return annotation
    with pytest.raises(ValueError, match="The return annotation is invalid"):
        torch.tpu.pallas.jax_op("tests_pallas::partial", functools.partial(rpa.ragged_paged_attention, sm_scale=0.125))


def test_a_kernel_left_to_guess_its_block_sizes_fails_as_in_torch_tpu_s_process(op):
    guessing = torch.tpu.pallas.jax_op("tests_pallas::guessing", guessing_kernel)
    with pytest.raises(ValueError, match="TPU version must be 4 or higher"):  # JAX sees no TPU there
        guessing(*[a.to("tpu") for a in _inputs()])


def test_jax_op_takes_tensors_only_and_one_chip(op):
    with pytest.raises(NotImplementedError, match="one chip"):
        torch.tpu.pallas.jax_op("tests_pallas::meshed", rpa.ragged_paged_attention, mesh=object())
    # get_pallas_mesh refuses first what torch_tpu refuses (tests/simulator/test_surface_wheel.py), then the mesh
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        torch.tpu.pallas.get_pallas_mesh(("x",), (1,))
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(NotImplementedError, match="one chip"):
            torch.tpu.pallas.get_pallas_mesh(("x",), (1,))
    finally:
        dist.destroy_process_group()
