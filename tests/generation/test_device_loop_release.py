"""The device loop on the installed Transformers release: per decode step only the chosen token ids cross
between host and TPU. Transformers 5.23 names the cache ``past_key_values`` (5.24+: ``cache``); the glue reads
the installed release's name (``generation.call.cache_key``), else every call silently took the host loop
(vocabulary-sized logits to the host each step). In-process and fast: the matrix's compatibility subset runs it
on every tested release (scripts/matrix.sh)."""

from __future__ import annotations

import torch

from transformers_tpu_ext.generation.call import cache_key
from transformers_tpu_ext.testing.tiny import tiny_model


def test_the_cache_key_is_the_installed_releases():
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    assert cache_key() in GenerateDecoderOnlyOutput.__dataclass_fields__


def test_the_device_loop_moves_only_token_ids_on_this_release(simulated_tpu):
    model = tiny_model("llama", vocab_size=320).to("tpu")
    prompt = torch.randint(2, 320, (2, 10), generator=torch.Generator().manual_seed(0))

    def counts(new_tokens: int):
        model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)  # warm
        before = simulated_tpu.counters()
        out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, return_dict_in_generate=True)
        return simulated_tpu.counters() - before, out

    (short, _), (long, out) = counts(4), counts(12)
    steps_and_rows = (12 - 4) * prompt.shape[0]
    assert (long.d2h_bytes - short.d2h_bytes) / steps_and_rows <= 16  # the chosen ids, nothing vocabulary-sized
    assert (long - short).programs == 0
    assert getattr(out, cache_key()) is not None  # the cache handed back under the release's name
