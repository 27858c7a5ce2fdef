"""Continuous batching on TPU against plain Transformers on the CPU (issue 26): logprobs
(``return_logprobs``), a request longer than the pool, prefix sharing. In-process, on the simulated
TPU, with a context-sensitive tiny Qwen3, greedy."""

from __future__ import annotations

import pytest
import torch

from transformers_tpu_ext.testing import cache_only, tiny

PROMPTS = [[5, 9, 17, 3, 44, 8], [7, 7, 120, 31, 2, 66, 90, 12, 4], [200, 13], [61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71]]
NEW = 5


@pytest.fixture
def small_steps(simulated_tpu, monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS", "16")
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS", "4")
    simulated_tpu.configure(chips=1, hbm_bytes="96MiB")
    return simulated_tpu


def _config():
    from transformers import GenerationConfig

    return GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0, max_new_tokens=NEW)


def _cpu(prompts, **cb):
    """Plain Transformers continuous batching on the CPU (a small pool: sizing it from host RAM is slow)."""
    from transformers import ContinuousBatchingConfig

    config = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64, **cb)
    out = tiny.tiny_model("qwen3", seed=0).generate_batch(prompts, generation_config=_config(), continuous_batching_config=config)
    return [out[key] for key in sorted(out, key=lambda k: int(k.split("_")[-1]))]


def _serve(manager, prompts, **kwargs):
    ids = [manager.add_request(p, max_new_tokens=NEW, **kwargs) for p in prompts]
    results = {r.request_id: r for r in (manager.get_result(timeout=120) for _ in ids)}
    return [results[i] for i in ids]


def test_logprobs_on_tpu_equal_the_cpus(small_steps):
    from transformers import ContinuousBatchingConfig

    cpu = _cpu(PROMPTS, return_logprobs=True)
    assert len({tuple(r.generated_tokens) for r in cpu}) == len(PROMPTS)  # the model reads its context
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    manager = model.init_continuous_batching(
        generation_config=_config(), continuous_batching_config=ContinuousBatchingConfig(return_logprobs=True)
    )
    assert manager.continuous_batching_config.tpu_plan is not None  # the TPU serving path, not upstream's
    manager.start()  # warms up every step shape
    try:
        with cache_only("requests with logprobs after the warm-up"):
            tpu = _serve(manager, PROMPTS)
    finally:
        manager.stop(block=True)
    for c, t in zip(cpu, tpu):
        assert t.generated_tokens == c.generated_tokens
        assert len(t.logprobs) == len(c.logprobs) == NEW
        assert torch.allclose(torch.tensor(t.logprobs), torch.tensor(c.logprobs), atol=1e-4, rtol=0)
