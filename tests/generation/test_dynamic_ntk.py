"""Dynamic-NTK rotary on the simulated TPU (issue 39): under its threshold the plugin's path, steady; a call whose
sequence passes ``max_position_embeddings`` is Transformers' ``generate()``, with one warning naming the reason
(``core.length_readers.generation_plan``; docs/generation.md says why it cannot be made steady without copying
upstream's stateful ``dynamic_rope_update``). Both give the CPU's tokens."""

from __future__ import annotations

import logging

import pytest
import torch

from transformers_tpu_ext.core import length_readers
from transformers_tpu_ext.testing import cache_only, tiny

THRESHOLD = 32
_DYNAMIC = length_readers.ModelLengths((length_readers.Rotary("dynamic", THRESHOLD),))


@pytest.mark.parametrize("longest, new, upstream", [(10, 8, False), (20, 13, False), (20, 14, True), (40, 1, True)])
def test_a_call_whose_sequence_passes_the_threshold_is_left_to_upstream_with_a_warning(longest, new, upstream):
    plan = length_readers.generation_plan(_DYNAMIC, columns=longest, longest=longest, new_tokens=new, padded=None, chunk=None)
    assert plan.upstream is upstream and plan.warn is upstream  # the last forward's max(position_ids) + 1 > 32


@pytest.mark.slow
def test_under_the_threshold_steady_past_it_transformers_with_the_cpus_tokens(simulated_tpu, caplog):
    model = tiny.tiny_model(
        "llama", max_position_embeddings=THRESHOLD, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    )
    calls = [(10, 8), (11, 7), (12, 6), (20, 20)]  # under, under, under (cache-only), past
    prompts = [torch.randint(2, 300, (1, n), generator=torch.Generator().manual_seed(i)) for i, (n, _) in enumerate(calls)]
    expected = [model.generate(p, max_new_tokens=new, min_new_tokens=new, do_sample=False) for p, (_, new) in zip(prompts, calls)]
    model.to("tpu")
    for i in (0, 1):  # warm-up: two calls under the threshold
        out = model.generate(prompts[i].to("tpu"), max_new_tokens=calls[i][1], min_new_tokens=calls[i][1], do_sample=False)
        assert torch.equal(out.cpu(), expected[i])
    with cache_only("a third call under the dynamic-NTK threshold"):
        out = model.generate(prompts[2].to("tpu"), max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert torch.equal(out.cpu(), expected[2])
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        out = model.generate(prompts[3].to("tpu"), max_new_tokens=20, min_new_tokens=20, do_sample=False)
    assert torch.equal(out.cpu(), expected[3])
    assert any("runs unpatched" in r.message and "dynamic" in r.message for r in caplog.records)
