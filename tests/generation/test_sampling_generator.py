"""Issue 31: seeded sampling draws from the TPU's generator on every loop of a handled call.

Without the plugin a TPU call samples on the TPU, from the TPU's generator. The plugin's host loop
(options that need the logits on the host) and beam sampling run upstream's loop with the probabilities
on the CPU; before the fix their ``torch.multinomial`` drew from the CPU's generator, so the same seed gave
other tokens than with the plugin disabled once the CPU's stream had moved (data shuffling, a
``torch.rand`` of the user's). Each case seeds, moves the CPU's stream, and samples, plugin off and on.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402


@pytest.fixture
def tpu(simulated_tpu):
    import transformers.generation.utils  # noqa: F401 - the patch target imported

    ext.activate()
    return simulated_tpu


@pytest.mark.slow
@pytest.mark.parametrize(
    "options", [{}, {"repetition_penalty": 1.3}, {"num_beams": 2}], ids=["device loop", "host loop", "beam sampling"]
)
def test_a_seed_gives_the_tokens_of_the_plugin_disabled(tpu, options):
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    ids = torch.randint(2, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0)).to("tpu")

    def sample():
        torch.manual_seed(0)
        torch.rand(5)  # the CPU's stream moves on; the TPU's does not
        return model.generate(ids, max_new_tokens=8, do_sample=True, **options).cpu()

    ext.deactivate()
    try:
        unpatched = sample()
    finally:
        ext.activate()
    assert torch.equal(sample(), unpatched)
    assert torch.multinomial.__module__.startswith("torch")  # the original is back after the call


class _DrawsOnTheHost:
    """A processor of the user's that samples with torch.multinomial over host probabilities."""

    def __init__(self) -> None:
        self.draws = []

    def __call__(self, input_ids, scores):
        self.draws.append(int(torch.multinomial(torch.full((1000,), 1e-3), 1)))
        return scores


@pytest.mark.slow
@pytest.mark.parametrize("inputs_on", ["cpu", "tpu"])
def test_a_callbacks_own_draws_keep_the_host_generator(tpu, inputs_on):
    # With host inputs upstream samples on the host; with device inputs on the device; a callback's own
    # draw over host probabilities takes the host generator either way.
    from transformers import LogitsProcessorList

    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    ids = torch.randint(2, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(1)).to(inputs_on)

    def sample():
        processor = _DrawsOnTheHost()
        torch.manual_seed(0)
        out = model.generate(ids, max_new_tokens=4, do_sample=True, repetition_penalty=1.3,  # the host loop
                             logits_processor=LogitsProcessorList([processor]))
        return processor.draws, out.cpu().tolist()

    ext.deactivate()
    try:
        unpatched = sample()
    finally:
        ext.activate()
    assert sample() == unpatched  # drawn from the CPU's generator, as without the plugin
