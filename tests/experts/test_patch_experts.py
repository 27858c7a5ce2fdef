"""The experts patch: Transformers' ``"grouped_mm"`` replaced through ``ExpertsInterface.register`` while the plugin
is active, Transformers' own function back after ``deactivate()``, and off TPU the very same computation."""

from __future__ import annotations

import torch

import transformers_tpu_ext as ext


def test_grouped_mm_is_registered_while_active_and_given_back_exactly():
    from transformers.integrations import moe

    ext.activate()
    ours = moe.ALL_EXPERTS_FUNCTIONS["grouped_mm"]
    assert ours is not moe.grouped_mm_experts_forward and ours.__wrapped__ is moe.grouped_mm_experts_forward
    ext.deactivate()
    try:
        assert moe.ALL_EXPERTS_FUNCTIONS["grouped_mm"] is moe.grouped_mm_experts_forward
    finally:
        ext.activate()
    assert moe.ALL_EXPERTS_FUNCTIONS["grouped_mm"] is ours


def test_off_tpu_the_dispatcher_computes_transformers_grouped_mm():
    from transformers.integrations import moe

    from transformers_tpu_ext.testing import tiny

    ext.activate()
    model = tiny.tiny_model("qwen3_moe")
    experts = model.model.layers[0].mlp.experts
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(0))
    index = torch.tensor([[0, 2], [2, 3], [1, 0], [3, 3], [7, 1]])
    weights = torch.rand(5, 2, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(experts(hidden, index, weights), moe.grouped_mm_experts_forward(experts, hidden, index, weights))
