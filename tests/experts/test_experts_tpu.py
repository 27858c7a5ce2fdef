"""Mixture-of-experts models on the simulated TPU with the default experts implementation (issue 39): Mixtral,
Qwen3-MoE, gpt-oss and DeepSeek-V3 (context-sensitive tiny models, ``testing.tiny.MOE_ARCHITECTURES``).

- ``generate()``: the CPU's tokens; a second call of other prompts in the same buckets compiles nothing
  (cache-only mode); each decode step reads at most 1.25x the selected experts' weight bytes (the kernel's reads,
  ``testing.megablox.STATS``, plus any torch operation's, ``testing.reads``), where Transformers' own decode
  (``batched_mm``) reads an expert once per (token, expert) pair;
- training: the CPU's loss and gradients, through the kernel's backward;
- without JAX: Transformers' ``grouped_mm`` (torch-tpu's ``histc`` on int32 ids and ``_grouped_mm``) runs as is,
  with the CPU's tokens: nothing a chip refuses.
"""

from __future__ import annotations

import copy

import pytest
import torch

from transformers_tpu_ext.testing import cache_only, megablox, reads, tiny

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("simulated_tpu")]
pytest.importorskip("jax.experimental.pallas.ops.tpu.megablox")

NEW = 6


def _prompts(seed: int, rows: int = 4, length: int = 12) -> torch.Tensor:
    return torch.randint(2, 300, (rows, length), generator=torch.Generator().manual_seed(seed))


def _generate(model, prompts, new=NEW):
    return model.generate(prompts, max_new_tokens=new, min_new_tokens=new, do_sample=False)


def _expert_weights(model) -> list[torch.Tensor]:
    return [p for name, p in model.named_parameters() if name.endswith(("gate_up_proj", "up_proj", "down_proj")) and p.dim() == 3]


def _decode_reads(model, prompts) -> tuple[float, float]:
    """Expert weight bytes per decode step, read and selected (the floor), from a generate of NEW tokens minus a
    generate of one (its prefill)."""
    totals = []
    for new in (1, NEW):
        megablox.STATS.reset()
        with reads.watch(_expert_weights(model)) as counter:
            _generate(model, prompts.to("tpu"), new)
        totals.append((megablox.STATS.weight_bytes_read + counter.bytes, megablox.STATS.selected_bytes))
    steps = NEW - 1
    return (totals[1][0] - totals[0][0]) / steps, (totals[1][1] - totals[0][1]) / steps


@pytest.mark.parametrize("arch", tiny.MOE_ARCHITECTURES)
def test_generate_gives_the_cpus_tokens_compiles_nothing_more_and_reads_only_the_selected_experts(arch):
    model = tiny.tiny_model(arch)
    first, second = _prompts(0), _prompts(1)
    expected = [_generate(model, p) for p in (first, second)]
    model.to("tpu")
    assert torch.equal(_generate(model, first.to("tpu")).cpu(), expected[0])
    with cache_only(f"{arch}: generate() of other prompts in the same buckets"):
        assert torch.equal(_generate(model, second.to("tpu")).cpu(), expected[1])
    read, floor = _decode_reads(model, first)
    assert floor > 0 and read <= 1.25 * floor, (read, floor)


def test_transformers_decode_reads_an_expert_per_pair(monkeypatch):
    """What the kernel path saves: Transformers' decode (batched_mm) on the same model reads more than the floor."""
    from transformers_tpu_ext.experts import policy

    model = tiny.tiny_model("qwen3_moe")
    prompts = _prompts(0)
    model.to("tpu")
    _generate(model, prompts.to("tpu"))  # warm (kernel path): the floor
    _, floor = _decode_reads(model, prompts)
    monkeypatch.setattr(policy, "experts_path", lambda facts: ("upstream", "test: Transformers' experts"))
    read, _ = _decode_reads(model, prompts)
    assert read > 1.25 * floor, (read, floor)


@pytest.mark.parametrize("arch", tiny.MOE_ARCHITECTURES)
def test_training_gives_the_cpus_loss_and_gradients(arch):
    model = tiny.tiny_model(arch).train()
    ids = _prompts(2, rows=2, length=16)
    reference = copy.deepcopy(model)
    loss = reference(ids, labels=ids).loss
    loss.backward()
    model.to("tpu")
    megablox.STATS.reset()
    tpu_loss = model(ids.to("tpu"), labels=ids.to("tpu")).loss
    tpu_loss.backward()
    assert megablox.STATS.tgmm_calls > 0  # the kernel's backward
    torch.testing.assert_close(tpu_loss.detach().cpu(), loss.detach(), rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_without_jax_transformers_grouped_mm_runs_as_a_chip_runs_it(monkeypatch):
    from transformers_tpu_ext.experts import runtime

    monkeypatch.setattr(runtime, "_environment", [(None, False, False)])  # as without JAX
    monkeypatch.setattr(runtime, "_environment_fn", runtime.environment)
    model = tiny.tiny_model("mixtral")
    prompts = _prompts(3)
    expected = _generate(model, prompts)
    model.to("tpu")
    megablox.STATS.reset()
    assert torch.equal(_generate(model, prompts.to("tpu")).cpu(), expected)
    assert megablox.STATS.gmm_calls == 0
