"""The premises of ``generation.recurrent.recurrent_path``, checked on Transformers' own models on the CPU (issue 39).

The predicate pads a state-space or hybrid model's prompt on the left only where the padding is invisible, and
prefills it in chunks only where its mixer continues from the cache. Both are facts about Transformers' code,
checked here on each family's context-sensitive tiny model, plugin off:

- a left-padded prompt (its padding masked) gives the unpadded prompt's logits; with a random bias on the
  mixer's input projection (the family's bias field) it does not: that is why the predicate keeps such a
  prompt unpadded, and why this comparison can fail;
- upstream's own chunked prefill (``prefill_chunk_size``) gives the one-piece prefill's logits exactly where
  the family says it continues (``Family.continues``): Mamba's and Jamba's scans restart from zero.
"""

from __future__ import annotations

import pytest

from transformers_tpu_ext.generation import recurrent
from transformers_tpu_ext.testing.tiny import RECURRENT_ARCHITECTURES

pytestmark = pytest.mark.slow  # tiny models of six families, CPU only (about 30 s)

torch = pytest.importorskip("torch")

PAD_ID, PADDING, LENGTH = 5, 12, 20


def _model(arch: str, bias: bool = False):
    from transformers_tpu_ext.testing.tiny import tiny_model

    family = recurrent.FAMILIES[arch]
    model = tiny_model(arch, seed=0, **({family.bias: bias} if family.bias else {}))
    if bias:  # Transformers initialises biases to zero, which no padding could reveal
        torch.manual_seed(7)
        with torch.no_grad():
            for module in model.modules():
                if type(module).__name__ == family.mixer:
                    module.in_proj.bias.normal_(0, 1.0)
    return model


def _padding_changes(model) -> float:
    ids = torch.randint(2, model.config.vocab_size, (1, LENGTH), generator=torch.Generator().manual_seed(0))
    padded = torch.cat([torch.full((1, PADDING), PAD_ID), ids], 1)
    mask = torch.cat([torch.zeros(1, PADDING, dtype=torch.long), torch.ones(1, LENGTH, dtype=torch.long)], 1)
    with torch.no_grad():
        alone = model(ids).logits[0, -1]
        beside = model(padded, attention_mask=mask).logits[0, -1]
    return float((alone - beside).abs().max())


def _path(arch: str, bias: bool | None) -> recurrent.RecurrentPath:
    family = recurrent.FAMILIES[arch]
    return recurrent.recurrent_path(recurrent.RecurrentFacts(arch, ("linear_attention",), (family.mixer,), bias=bias))


@pytest.mark.parametrize("arch", RECURRENT_ARCHITECTURES)
def test_left_padding_is_invisible_where_the_predicate_pads(arch):
    family = recurrent.FAMILIES[arch]
    assert _path(arch, False if family.bias else None).pad_prompt
    assert _padding_changes(_model(arch)) < 1e-4


@pytest.mark.parametrize("arch", [a for a in RECURRENT_ARCHITECTURES if recurrent.FAMILIES[a].bias])
def test_a_bias_on_the_input_projection_makes_the_padding_visible(arch):
    assert not _path(arch, True).pad_prompt
    assert _padding_changes(_model(arch, bias=True)) > 1e-2


@pytest.mark.parametrize("arch", RECURRENT_ARCHITECTURES)
def test_a_chunked_prefill_continues_exactly_where_the_family_says(arch):
    model = _model(arch)
    ids = torch.randint(2, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    options = dict(max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
    whole = model.generate(ids, **options)
    chunked = model.generate(ids, prefill_chunk_size=16, **options)
    difference = float((whole.logits[0] - chunked.logits[0]).abs().max())
    continues = difference < 1e-4
    assert continues is recurrent.FAMILIES[arch].continues, difference
    assert _path(arch, False if recurrent.FAMILIES[arch].bias else None).chunked_prefill is continues
