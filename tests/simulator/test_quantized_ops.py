"""The simulated TPU refuses the quantized kernels torch_tpu 0.2.0 lacks, eagerly and in compiled graphs.

``transformers_tpu_ext.testing.quantized_ops``: no int8/int4 matmul (``_int_mm``, ``_weight_int8pack_mm``,
``_weight_int4pack_mm``...), ``_scaled_mm`` / ``_scaled_mm_v2`` with torch_tpu's recipes only and without
``use_fast_accum``. The same calls on CPU tensors run (the simulator changes nothing off the device).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformers_tpu_ext.testing import quantized_ops


@pytest.fixture
def sim(simulated_tpu):
    return simulated_tpu


def _int8(*shape):
    return torch.randint(-8, 8, shape, dtype=torch.int8)


def _fp8(*shape):
    return torch.randn(*shape).to(torch.float8_e4m3fn)


MISSING_CALLS = {
    "_int_mm": lambda d: torch._int_mm(_int8(32, 64).to(d), _int8(64, 32).to(d)),
    "_weight_int8pack_mm": lambda d: torch._weight_int8pack_mm(
        torch.randn(4, 64).to(d), _int8(32, 64).to(d), torch.ones(32).to(d)
    ),
    "_convert_weight_to_int4pack_for_cpu": lambda d: torch._convert_weight_to_int4pack_for_cpu(
        torch.randint(0, 15, (32, 64), dtype=torch.int32).to(d), 2
    ),
}


@pytest.mark.parametrize("name", sorted(MISSING_CALLS))
def test_missing_int8_and_int4_kernels_are_refused_eagerly(sim, name):
    call = MISSING_CALLS[name]
    assert call("cpu") is not None  # the CPU has them
    with pytest.raises(NotImplementedError, match=rf"aten::{name} is not implemented for TPU"):
        call("tpu")


def test_missing_kernels_are_refused_inside_a_compiled_graph(sim):
    step = torch.compile(lambda a, b: torch._int_mm(a, b).float() * 0.5, backend="tpu")
    a, b = _int8(32, 64), _int8(64, 32)
    with pytest.raises(Exception, match=r"aten::_int_mm is not implemented for TPU"):
        step(a.to("tpu"), b.to("tpu"))
    torch._dynamo.reset()
    expected = torch._int_mm(a, b).float() * 0.5
    assert torch.equal(torch.compile(lambda a, b: torch._int_mm(a, b).float() * 0.5, backend="aot_eager")(a, b), expected)


def test_every_missing_kernel_this_torch_has_is_refused(sim):
    from transformers_tpu_ext.testing import device

    refused = [name for name in quantized_ops.MISSING if getattr(torch.ops.aten, name, None) is not None]
    assert "_int_mm" in refused and "_weight_int4pack_mm" in refused
    for name in refused:
        for overload in getattr(torch.ops.aten, name).overloads():
            assert device._SPECIAL[getattr(getattr(torch.ops.aten, name), overload)] is not None


def test_scaled_mm_tensorwise_and_rowwise_run_like_the_cpu(sim):
    x, w = _fp8(16, 64), _fp8(32, 64).t()
    one = torch.tensor(1.5)
    rows, cols = torch.rand(16, 1) + 0.5, torch.rand(1, 32) + 0.5
    for sa, sb in ((one, one), (rows, cols)):
        cpu = torch._scaled_mm(x, w, sa, sb, out_dtype=torch.bfloat16)
        tpu = torch._scaled_mm(x.to("tpu"), w.to("tpu"), sa.to("tpu"), sb.to("tpu"), out_dtype=torch.bfloat16)
        assert tpu.device.type == "tpu" and torch.equal(tpu.cpu(), cpu)


def test_scaled_mm_other_recipes_and_fast_accum_are_refused(sim):
    x, w = _fp8(16, 64).to("tpu"), _fp8(32, 64).t().to("tpu")
    one = torch.tensor(1.0).to("tpu")
    with pytest.raises(RuntimeError, match=r"^use_fast_accum=true is not supported yet on TPU$"):
        torch._scaled_mm(x, w, one, one, out_dtype=torch.bfloat16, use_fast_accum=True)
    # A column scale for the activations: not one of torch_tpu's recipes (the CPU takes a transposed layout of it).
    with pytest.raises(RuntimeError, match=r"_scaled_mm on TPU supports TensorWise, RowWise, or BlockWise1x32"):
        torch._scaled_mm(x, w, torch.ones(16, 1).to("tpu"), torch.ones(1, 1).to("tpu"), out_dtype=torch.bfloat16)


def test_scaled_mm_v2_recipes(sim):
    x, w = _fp8(16, 64), _fp8(32, 64).t()
    sa, sb = torch.rand(16, 1) + 0.5, torch.rand(1, 32) + 0.5
    rowwise = F.ScalingType.RowWise
    cpu = F.scaled_mm(x, w, sa, rowwise, sb, rowwise, output_dtype=torch.bfloat16)
    tpu = F.scaled_mm(x.to("tpu"), w.to("tpu"), sa.to("tpu"), rowwise, sb.to("tpu"), rowwise, output_dtype=torch.bfloat16)
    assert torch.equal(tpu.cpu(), cpu)
    # FineGrainedFP8's 128x128 weight blocks: not wired into torch_tpu 0.2.0.
    blocks = torch.ones(1, 1).to("tpu")
    with pytest.raises(RuntimeError, match=r"BlockWise1x32 scaling; got BlockWise128x128 for scale_b"):
        F.scaled_mm(x.to("tpu"), w.to("tpu"), sa.to("tpu"), rowwise, blocks, F.ScalingType.BlockWise128x128,
                    output_dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"^use_fast_accum=true is not supported yet on TPU$"):
        F.scaled_mm(x.to("tpu"), w.to("tpu"), sa.to("tpu"), rowwise, sb.to("tpu"), rowwise,
                    output_dtype=torch.bfloat16, use_fast_accum=True)
