"""Continuous batching on TPU against plain Transformers on the CPU (issue 26): 200 requests of random lengths,
logprobs (``return_logprobs``), a request longer than the KV cache's pool (``serving.pool``), prefix
sharing (``allow_block_sharing``: a shared system prompt prefilled once, with the plain-PyTorch
attention, a sliding-window model, and JAX's ragged kernel). In-process, on the simulated TPU, with
context-sensitive tiny Qwen3s, greedy."""

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


def _cpu(prompts, model_args=None, **cb):
    """Plain Transformers continuous batching on the CPU (a small pool: sizing it from host RAM is slow)."""
    from transformers import ContinuousBatchingConfig

    config = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64, **cb)
    out = tiny.tiny_model("qwen3", seed=0, **(model_args or {})).generate_batch(prompts, generation_config=_config(), continuous_batching_config=config)
    return [out[key] for key in sorted(out, key=lambda k: int(k.split("_")[-1]))]


def _serve(manager, prompts, **kwargs):
    ids = [manager.add_request(p, max_new_tokens=NEW, **kwargs) for p in prompts]
    results = {r.request_id: r for r in (manager.get_result(timeout=120) for _ in ids)}
    return [results[i] for i in ids]


@pytest.mark.slow
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


def test_fit_to_pool_lowers_max_new_tokens_and_refuses_a_prompt_with_no_room():
    from transformers_tpu_ext.serving import pool

    assert pool.fit_to_pool(10, 5, 64, num_blocks=4, page_size=16) == 5
    assert pool.fit_to_pool(62, 5, 64, num_blocks=4, page_size=16) == 2
    assert pool.fit_to_pool(62, None, 64, num_blocks=4, page_size=16) == 2
    with pytest.raises(ValueError, match="could never be scheduled"):
        pool.fit_to_pool(64, 1, 64, num_blocks=4, page_size=16)


def test_a_request_longer_than_the_pool_is_refused_and_the_others_complete(small_steps, monkeypatch, caplog):
    """A pool of 4 pages of 16 tokens (64 tokens): Transformers would fail every request in flight on a
    prompt of 100 tokens ("No requests can be scheduled and no requests can be offloaded."); on TPU
    ``add_request`` refuses it, and lowers the ``max_new_tokens`` of a 62-token prompt to 2."""
    import logging

    from transformers import ContinuousBatchingConfig

    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN", "128")
    long_prompt, near_full = list(range(3, 103)), list(range(100, 162))
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    config = ContinuousBatchingConfig(num_blocks=4, page_size=16)
    manager = model.init_continuous_batching(generation_config=_config(), continuous_batching_config=config)
    manager.start()
    try:
        first = manager.add_request(PROMPTS[0], max_new_tokens=NEW)  # in flight while the others come
        with pytest.raises(ValueError, match=r"100 tokens; the TPU paged KV cache holds 64 tokens in all \(4 pages of 16"):
            manager.add_request(long_prompt, max_new_tokens=NEW)
        with pytest.raises(ValueError, match="TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN"):  # past the max length: its message
            manager.add_request(list(range(3, 133)), max_new_tokens=NEW)
        with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
            lowered = manager.add_request(near_full, max_new_tokens=NEW, request_id="near-full")
            again = manager.add_request(near_full, max_new_tokens=NEW, request_id="near-full-again")
        said = [r.getMessage() for r in caplog.records]
        for request in ("near-full", "near-full-again"):  # every lowered request is named, not only the first
            assert any(f"request {request}: max_new_tokens lowered from {NEW} to 2 to fit the TPU paged KV cache (64 tokens" in m
                       for m in said), said
        last = manager.add_request(PROMPTS[1], max_new_tokens=NEW)
        results = {r.request_id: r for r in (manager.get_result(timeout=120) for _ in range(4))}
    finally:
        manager.stop(block=True)
    assert all(r.error is None for r in results.values())
    cpu = _cpu([PROMPTS[0], near_full, PROMPTS[1]])
    assert results[first].generated_tokens == cpu[0].generated_tokens
    assert results[lowered].generated_tokens == results[again].generated_tokens == cpu[1].generated_tokens[:2]
    assert results[last].generated_tokens == cpu[2].generated_tokens



def test_requests_added_before_the_cache_exists_get_the_same_pool_check(small_steps, monkeypatch, caplog):
    """Added before ``start()`` (no cache, no pool yet): the 100-token prompt fails alone, with the message
    ``add_request`` gives once the pool is known; the 62-token one is lowered to 2 new tokens; the others are
    served. (Transformers would fail all four: "No requests can be scheduled and no requests can be offloaded.")"""
    import logging

    from transformers import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.requests import RequestStatus

    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN", "128")
    long_prompt, near_full = list(range(3, 103)), list(range(100, 162))
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    config = ContinuousBatchingConfig(num_blocks=4, page_size=16)
    manager = model.init_continuous_batching(generation_config=_config(), continuous_batching_config=config)
    prompts = [PROMPTS[0], long_prompt, near_full, PROMPTS[1]]
    ids = [manager.add_request(p, max_new_tokens=NEW) for p in prompts]  # before the cache: nothing refused yet
    assert manager.batch_processor is None
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        manager.start()
        try:
            results = {r.request_id: r for r in (manager.get_result(timeout=120) for _ in ids)}
        finally:
            manager.stop(block=True)
    first, refused, lowered, last = (results[i] for i in ids)
    assert refused.status == RequestStatus.FAILED
    assert "100 tokens; the TPU paged KV cache holds 64 tokens in all (4 pages of 16" in refused.error
    assert any(f"request {ids[2]}: max_new_tokens lowered from {NEW} to 2 to fit the TPU paged KV cache (64 tokens"
               in r.getMessage() for r in caplog.records)
    assert [first.error, lowered.error, last.error] == [None, None, None]
    cpu = _cpu([PROMPTS[0], near_full, PROMPTS[1]])
    assert first.generated_tokens == cpu[0].generated_tokens
    assert lowered.generated_tokens == cpu[1].generated_tokens[:2]
    assert last.generated_tokens == cpu[2].generated_tokens


@pytest.mark.slow
def test_generate_batch_fails_only_the_request_longer_than_the_pool(small_steps):
    from transformers import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.requests import RequestStatus

    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    config = ContinuousBatchingConfig(num_blocks=4, page_size=16)
    out = model.generate_batch([PROMPTS[0], list(range(3, 103)), PROMPTS[1]], generation_config=_config(),
                               continuous_batching_config=config)
    results = [out[key] for key in sorted(out, key=lambda k: int(k.split("_")[-1]))]
    assert [r.status for r in results] == [RequestStatus.FINISHED, RequestStatus.FAILED, RequestStatus.FINISHED]
    assert "100 tokens; the TPU paged KV cache holds 64 tokens in all" in results[1].error
    cpu = _cpu([PROMPTS[0], PROMPTS[1]])
    assert [results[0].generated_tokens, results[2].generated_tokens] == [r.generated_tokens for r in cpu]


SYSTEM = [11 + (7 * i) % 250 for i in range(40)]  # a shared "system prompt": two whole pages of 16, and 8 tokens
QUESTIONS = [[5, 9, 17], [7, 120, 31, 2], [200, 13, 14, 15, 16], [61, 62]]


def _prefill_tokens(sharing, attention, kv_cache=None, **model_args):
    """Serves the system prompt + each question (the first alone, then the others) on the TPU: tokens, prefill tokens."""
    from transformers import ContinuousBatchingConfig

    model = tiny.tiny_model("qwen3", seed=0, **model_args).to("tpu")
    config = ContinuousBatchingConfig(page_size=16, allow_block_sharing=sharing)
    manager = model.init_continuous_batching(generation_config=_config(), continuous_batching_config=config)
    manager.start()
    try:
        results = _serve(manager, [SYSTEM + QUESTIONS[0]]) + _serve(manager, [SYSTEM + q for q in QUESTIONS[1:]])
        assert manager.batch_processor.cache.use_prefix_sharing == sharing
        assert manager.continuous_batching_config.tpu_plan.attention == attention
        assert manager.continuous_batching_config.tpu_plan.kv_cache == kv_cache
    finally:
        manager.stop(block=True)
    stats = manager.continuous_batching_config.tpu_plan.stats
    return [r.generated_tokens for r in results], stats.tokens - sum(len(r.generated_tokens) - 1 for r in results)


@pytest.mark.parametrize(
    "attention, model_args",
    [
        pytest.param("paged", {}, id="paged"),
        pytest.param(
            "paged",
            {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8, "use_sliding_window": True},
            id="sliding-window",  # upstream's sliding-window cache cannot share; the TPU path's one group can
        ),
        pytest.param("ragged", {"head_dim": 128}, marks=pytest.mark.slow, id="ragged-kernel"),
    ],
)
def test_a_shared_system_prompt_is_prefilled_once(small_steps, attention, model_args):
    if attention == "ragged":
        pytest.importorskip("jax.experimental.pallas.ops.tpu.ragged_paged_attention")
    cpu = [r.generated_tokens for r in _cpu([SYSTEM + q for q in QUESTIONS], model_args, allow_block_sharing=False)]
    assert len({tuple(t) for t in cpu}) == len(QUESTIONS)
    tokens, prefill = _prefill_tokens(True, attention, **model_args)
    unshared_tokens, unshared_prefill = _prefill_tokens(False, attention, **model_args)
    assert tokens == unshared_tokens == cpu
    assert unshared_prefill == sum(len(SYSTEM) + len(q) for q in QUESTIONS)
    assert prefill == unshared_prefill - 3 * 32  # the system prompt's two whole pages, computed once


@pytest.mark.slow
def test_prefix_sharing_with_the_int8_kv_cache_reads_the_shared_pages_scales(small_steps, monkeypatch):
    """Shared int8 pages are read with their own scales (the scale tensor is addressed by the same slots):
    the tokens with sharing are those without it (the int8 cache is lossy, so not compared with the CPU)."""
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_KV_CACHE", "int8")
    tokens, prefill = _prefill_tokens(True, "paged", "int8")
    unshared_tokens, unshared_prefill = _prefill_tokens(False, "paged", "int8")
    assert tokens == unshared_tokens and len({tuple(t) for t in tokens}) == len(QUESTIONS)
    assert prefill == unshared_prefill - 3 * 32


@pytest.mark.slow
def test_200_requests_of_random_lengths_compile_nothing_after_the_warmup(simulated_tpu, monkeypatch):
    """200 requests, prompts of 1 to 120 tokens (the max length is 128) and 1 to 4 new tokens, all added at
    once: prefill chunks and decodes mixed in every step, requests joining as others leave. After the
    warm-up (one step shape, 64 tokens and 16 requests) nothing compiles (cache-only mode raises on any
    new program, eager operations included), and every request's tokens are plain CPU ``generate()``'s."""
    from transformers import GenerationConfig

    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_TOKEN_BUCKETS", "64")
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_REQUEST_BUCKETS", "16")
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS", "64")
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS", "16")
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN", "128")
    simulated_tpu.configure(chips=1, hbm_bytes="96MiB")
    generator = torch.Generator().manual_seed(26)
    lengths = torch.randint(1, 121, (200,), generator=generator).tolist()
    news = torch.randint(1, 5, (200,), generator=generator).tolist()
    model = tiny.tiny_model("qwen3", seed=0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(2, vocab, (n,), generator=generator).tolist() for n in lengths]
    with torch.no_grad():
        cpu = [model.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(p):].tolist()
               for p, n in zip(prompts, news)]
    assert len({tuple(t) for t in cpu}) > 150  # the model reads its prompts
    model.to("tpu")
    config = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0)
    manager = model.init_continuous_batching(generation_config=config)
    plan = manager.continuous_batching_config.tpu_plan
    assert plan.shapes == [(64, 16)]
    manager.start()  # warms up its one step shape
    try:
        before = simulated_tpu.counters()
        with cache_only("200 requests of random lengths after the warm-up"):
            ids = [manager.add_request(p, max_new_tokens=n) for p, n in zip(prompts, news)]
            results = {r.request_id: r for r in (manager.get_result(timeout=300) for _ in ids)}
        after = simulated_tpu.counters() - before
    finally:
        manager.stop(block=True)
    assert after.programs == 0
    assert [results[i].error for i in ids] == [None] * 200
    assert [results[i].generated_tokens for i in ids] == cpu
    stats = plan.stats
    assert stats.requests >= 200 and stats.steps < stats.tokens  # several requests per step
    assert stats.shapes == {(64, 16)}
