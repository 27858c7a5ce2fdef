"""The simulated TPU computes the mixture-of-experts ops a chip computes, and refuses what it refuses
(``transformers_tpu_ext.testing.grouped_ops``: torch-tpu 0.2.0's ``histc`` and ``_grouped_mm``)."""

from __future__ import annotations

import pytest
import torch


def test_histc_counts_int32_expert_ids_in_their_dtype_as_the_chip_does(simulated_tpu):
    ids = torch.tensor([0, 1, 1, 3, 3, 3], dtype=torch.int32)
    counts = torch.histc(ids.to("tpu"), bins=4, min=0, max=3)
    assert counts.device.type == "tpu" and counts.dtype == torch.int32  # the chip keeps the input's dtype
    assert counts.cpu().tolist() == [1, 2, 0, 3]
    with pytest.raises(RuntimeError, match="histogram_cpu"):  # what the CPU does with the same call
        torch.histc(ids, bins=4, min=0, max=3)
    out = torch.empty(4, dtype=torch.int32, device="tpu")
    torch.histc(ids.to("tpu"), bins=4, min=0, max=3, out=out)
    assert out.cpu().tolist() == [1, 2, 0, 3]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.bool])
def test_histc_refuses_bfloat16_and_bool_as_the_chip_does(simulated_tpu, dtype):
    with pytest.raises(NotImplementedError, match="not implemented for"):
        torch.histc(torch.ones(4, dtype=dtype, device="tpu"), bins=2, min=0, max=1)


def test_histc_of_floats_is_pytorchs(simulated_tpu):
    x = torch.tensor([0.0, 0.5, 2.0, 3.0])
    assert torch.equal(torch.histc(x.to("tpu"), bins=3, min=0, max=3).cpu(), torch.histc(x, bins=3, min=0, max=3))


def test_grouped_mm_takes_what_the_wheels_meta_takes_and_computes_the_cpus_product(simulated_tpu):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(6, 8, generator=gen).bfloat16()
    w = torch.randn(3, 4, 8, generator=gen).bfloat16()  # [experts, out, in]: the transposed view below
    offs = torch.tensor([2, 2, 6])  # int64 offsets and 8-byte strides: PyTorch's CPU kernel refuses both
    with pytest.raises(RuntimeError):
        torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    out = torch.nn.functional.grouped_mm(a.to("tpu"), w.to("tpu").transpose(-2, -1), offs=offs.to("tpu"))
    expected = torch._grouped_mm(a.float(), w.float().transpose(-2, -1), offs=offs.int()).bfloat16()
    assert out.device.type == "tpu" and out.dtype == torch.bfloat16 and torch.equal(out.cpu(), expected)


@pytest.mark.parametrize(
    "change, error, message",
    [
        (dict(a=torch.float16), RuntimeError, "same dtype"),
        (dict(a=torch.int32, w=torch.int32), RuntimeError, "float32, float16, or bfloat16"),
        (dict(bias=True), NotImplementedError, "expected bias to be undefined"),
        (dict(offs=torch.float32), RuntimeError, "offs to be int32 or int64"),
    ],
)
def test_grouped_mm_refuses_what_the_chip_refuses(simulated_tpu, change, error, message):
    a = torch.ones(4, 8, dtype=change.get("a", torch.float32), device="tpu")
    w = torch.ones(2, 8, 4, dtype=change.get("w", torch.float32), device="tpu")
    offs = torch.tensor([2, 4], dtype=change.get("offs", torch.int32), device="tpu")
    bias = torch.ones(2, 4, device="tpu") if change.get("bias") else None
    with pytest.raises(error, match=message):
        torch._grouped_mm(a, w, offs=offs, bias=bias)


def test_transformers_default_experts_run_compiled_on_the_simulated_tpu(simulated_tpu):
    """Upstream's grouped_mm experts (histc on int32 ids, then grouped_mm) compile to one graph, as on a chip."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    experts = _experts(num_experts=4)
    hidden = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    index = torch.tensor([[0, 2], [2, 3], [1, 0], [3, 3], [2, 1]])
    weights = torch.rand(5, 2, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = grouped_mm_experts_forward(experts, hidden, index, weights)  # on the CPU (histc of floats)
    experts.to("tpu")
    step = torch.compile(lambda h, i, w: grouped_mm_experts_forward(experts, h, i, w), backend="tpu")
    before = simulated_tpu.counters()
    out = step(hidden.to("tpu"), index.to("tpu"), weights.to("tpu"))
    assert (simulated_tpu.counters() - before).graphs_compiled == 1
    torch.testing.assert_close(out.cpu(), expected)


def _experts(num_experts: int) -> torch.nn.Module:
    import types

    from transformers.activations import ACT2FN
    from transformers.integrations.moe import _default_apply_gate

    torch.manual_seed(0)
    experts = torch.nn.Module()
    experts.gate_up_proj = torch.nn.Parameter(torch.randn(num_experts, 2 * 8, 8) * 0.3)
    experts.down_proj = torch.nn.Parameter(torch.randn(num_experts, 8, 8) * 0.3)
    experts.act_fn = ACT2FN["silu"]
    experts._apply_gate = types.MethodType(_default_apply_gate, experts)
    experts.num_experts, experts.has_gate, experts.has_bias, experts.is_transposed = num_experts, True, False, False
    experts.has_post_expert_norm, experts._is_expert_parallel = False, False
    return experts


@pytest.mark.parametrize("layout", ["2d_3d", "3d_2d", "2d_2d", "3d_3d"])
def test_grouped_mm_of_every_layout_is_the_cpus_where_the_cpu_takes_it(simulated_tpu, layout):
    gen = torch.Generator().manual_seed(3)
    offs = torch.tensor([4, 4, 12, 16], dtype=torch.int32)  # an empty group among them
    shapes = {"2d_3d": ((16, 8), (4, 8, 12)), "3d_2d": ((4, 12, 8), (8, 16)), "2d_2d": ((12, 16), (16, 8)),
              "3d_3d": ((4, 12, 8), (4, 8, 16))}[layout]
    a, b = (torch.randn(*shape, generator=gen) for shape in shapes)
    groups = None if layout == "3d_3d" else offs
    expected = torch._grouped_mm(a, b, offs=groups)  # 16-byte strides, int32 offsets: the CPU kernel takes these
    out = torch._grouped_mm(a.to("tpu"), b.to("tpu"), offs=None if groups is None else groups.to("tpu"))
    torch.testing.assert_close(out.cpu(), expected)


def test_grouped_mm_backward_over_sizes_the_cpu_kernel_refuses(simulated_tpu):
    """37 columns: PyTorch's CPU kernel wants 16-byte strides, a chip does not. The backward's 2D x 2D product
    (the experts' weight gradient) ran inside the autograd engine's device thread, where the CPU kernel's error
    aborted the process (Transformers' mixtral/qwen3_moe/jamba test_enable_input_require_grads_with_gradient_checkpointing)."""
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(10, 37, generator=gen)
    w = torch.randn(3, 37, 5, generator=gen)
    offs = torch.tensor([3, 3, 10], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch._grouped_mm(a, w, offs=offs)
    a_tpu, w_tpu = a.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    out = torch._grouped_mm(a_tpu, w_tpu, offs=offs.to("tpu"))
    (out * out).sum().backward()
    a_ref, w_ref = a.clone().requires_grad_(), w.clone().requires_grad_()
    ref = torch.cat([a_ref[0:3] @ w_ref[0], a_ref[3:3] @ w_ref[1], a_ref[3:10] @ w_ref[2]])
    (ref * ref).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    torch.testing.assert_close(a_tpu.grad.cpu(), a_ref.grad)
    torch.testing.assert_close(w_tpu.grad.cpu(), w_ref.grad)
