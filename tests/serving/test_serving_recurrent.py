"""Continuous batching of a state-space or hybrid model (issue 39): Transformers refuses it on every device, the
plugin says so once at WARNING and names generate(), the path that runs such a model on TPU."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("transformers")


def test_upstream_refuses_recurrent_layers_also_on_cpu_and_the_warning_names_generate(simulated_tpu, caplog, monkeypatch):
    import torch
    from transformers import GenerationConfig

    from transformers_tpu_ext.core import wrapping
    from transformers_tpu_ext.testing.tiny import tiny_model

    monkeypatch.setattr(wrapping, "_warned", set())
    model = tiny_model("lfm2", seed=0)  # short convolutions ("conv" layers) beside attention
    config = GenerationConfig(max_new_tokens=3, do_sample=False, eos_token_id=1)
    with pytest.raises(ValueError, match="Invalid layer type: conv"):  # Transformers' own refusal, on the CPU
        model.generate_batch(inputs=[[5, 6, 7]], generation_config=config)
    model.to("tpu")
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        for _ in range(2):
            with pytest.raises(ValueError, match="Invalid layer type: conv"):  # the same refusal, unchanged
                model.generate_batch(inputs=[[5, 6, 7]], generation_config=config)
    said = [r.getMessage() for r in caplog.records if "continuous batching" in r.getMessage()]
    assert len(said) == 1, said  # once
    assert "refuses conv layers on every device" in said[0] and "generate() runs this state-space or hybrid model" in said[0]
    # and generate() does run it on the TPU: the CPU's tokens
    prompt = torch.tensor([[5, 6, 7]])
    out = model.generate(prompt.to("tpu"), max_new_tokens=3, do_sample=False)
    assert out.device.type == "tpu"
    assert torch.equal(out.cpu(), tiny_model("lfm2", seed=0).generate(prompt, max_new_tokens=3, do_sample=False))
