"""A state-space model of a family ``generation.recurrent`` does not know (issue 39): Transformers' own generate(),
untouched, named once at WARNING.

Falcon-Mamba's mixer is Mamba's with extra normalisations: close, but not what the predicate has a proof for,
so the plugin leaves it alone: Transformers' generate() runs as the plugin's decision log says, with the CPU's
tokens on the input's device, and one WARNING for any number of calls.
"""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _falcon_mamba():
    from transformers import AutoConfig, AutoModelForCausalLM

    from transformers_tpu_ext.testing.tiny import DEFAULT_INITIALIZER_RANGE

    config = AutoConfig.for_model("falcon_mamba", vocab_size=320, hidden_size=32, num_hidden_layers=2, state_size=8,
                                  expand=2, conv_kernel=4, initializer_range=DEFAULT_INITIALIZER_RANGE,
                                  pad_token_id=0, eos_token_id=1, bos_token_id=1)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def test_an_unknown_recurrent_family_is_upstreams_with_one_warning(simulated_tpu, caplog, monkeypatch):
    from transformers_tpu_ext.core import wrapping

    monkeypatch.setattr(wrapping, "_warned", set())
    prompt = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 7, 8, 9]])
    mask = (prompt != 0).long()
    model = _falcon_mamba()
    expected = model.generate(prompt, attention_mask=mask, max_new_tokens=4, do_sample=False)
    model.to("tpu")
    with caplog.at_level(logging.DEBUG, logger="transformers_tpu_ext"):
        outs = [model.generate(prompt.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=4, do_sample=False)
                for _ in range(2)]
    messages = [r.getMessage() for r in caplog.records]
    for out in outs:
        assert out.device.type == "tpu" and torch.equal(out.cpu(), expected)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "transformers_tpu_ext"]
    assert len(warned) == 1, warned
    assert "falcon_mamba has recurrent layers of a family the plugin has no proof for" in warned[0]
    assert "docs/generation.md#state-space-and-hybrid-models" in warned[0]
    assert any("generate() left to upstream" in m and "falcon_mamba" in m for m in messages), messages
    assert not any("generate() handled" in m for m in messages), messages
