"""``warmup()`` covers every call within its limits, the longest prompt included (found by the recompile guard).

A prompt of exactly ``max_prompt_length`` tokens with no padding gets one padding column (see
docs/generation.md, "The padding column"), so it runs in the next prompt bucket: the warm-up must
compile that bucket too, or the first such call compiles in steady state.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers_tpu_ext  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402


@pytest.mark.slow
def test_the_longest_prompt_without_padding_is_warmed_up(simulated_tpu, no_new_programs):
    reference = tiny.tiny_model("qwen3", seed=0)
    tiny.check_context_sensitive(reference)
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    transformers_tpu_ext.warmup(model, max_prompt_length=16, max_new_tokens=3, max_batch_size=2)
    gen = torch.Generator().manual_seed(0)
    calls = [torch.randint(2, 300, (1, 16), generator=gen), torch.randint(2, 300, (2, 16), generator=gen),
             torch.randint(2, 300, (2, 9), generator=gen), torch.randint(2, 300, (1, 1), generator=gen)]
    with no_new_programs("calls within warmup(max_prompt_length=16, max_new_tokens=3, max_batch_size=2)"):
        outputs = [model.generate(ids.to("tpu"), max_new_tokens=3, do_sample=False).cpu() for ids in calls]
    for ids, out in zip(calls, outputs):
        assert torch.equal(out, reference.generate(ids, max_new_tokens=3, do_sample=False))
