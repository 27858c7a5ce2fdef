"""Continuous batching of the mixture-of-experts families on the simulated TPU (issue 39): DeepSeek-V3's
multi-head latent attention (the paged cache holds its latents; each request's are read back and expanded by the
model) and gpt-oss's attention sinks (computed by the paged attention), served on the TPU path with the tokens of
plain Transformers on the CPU, and a second batch of other prompts compiling nothing (cache-only mode).
Context-sensitive tiny models (``testing.tiny.MOE_ARCHITECTURES``), greedy, in-process."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.testing import cache_only, tiny

pytestmark = pytest.mark.slow

FIRST = [[5, 9, 17, 3, 44, 8], [7, 7, 120, 31, 2, 66, 90, 12, 4], [200, 13]]
SECOND = [[11, 12, 13, 14], [99, 98, 97, 96, 95, 94, 93, 92, 91, 90, 89], [4, 5, 6]]  # the same max_len rung (16)
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


def _tokens(out):
    return [out[key].generated_tokens for key in sorted(out, key=lambda k: int(k.split("_")[-1]))]


def _cpu(arch, prompts):
    from transformers import ContinuousBatchingConfig

    model = tiny.tiny_model(arch)
    config = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64)
    return _tokens(model.generate_batch(prompts, generation_config=_config(), continuous_batching_config=config))


@pytest.mark.parametrize("arch", ["deepseek_v3", "gpt_oss"])
def test_generate_batch_serves_latent_attention_and_sinks_on_tpu_with_cpu_tokens_and_a_steady_second_batch(
    small_steps, arch, monkeypatch
):
    from transformers_tpu_ext.serving import patch_continuous_batching as patch

    expected = [_cpu(arch, prompts) for prompts in (FIRST, SECOND)]
    assert len({tuple(t) for t in expected[0] + expected[1]}) == 6  # the model reads its context
    plans = []
    made = patch._plan_manager
    monkeypatch.setattr(patch, "_plan_manager", lambda resolved, *a: (made(resolved, *a), plans.append(resolved.tpu_plan)))
    model = tiny.tiny_model(arch).to("tpu")
    first = _tokens(model.generate_batch(FIRST, generation_config=_config()))  # warms up, then serves
    assert plans and plans[0].attention == "paged"  # the TPU serving path (not upstream's manager)
    assert first == expected[0]
    with cache_only(f"{arch}: a second batch of other prompts"):
        second = _tokens(model.generate_batch(SECOND, generation_config=_config()))
    assert second == expected[1]
