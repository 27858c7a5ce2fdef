"""User callbacks see tensors on the device of the call's inputs, as upstream hands them.

A logits processor or stopping criterion written the usual way makes its tensors on ``model.device``;
the plugin's loop keeps the growing tensors on the host, and a TPU refuses an operation that mixes a
host and a device tensor. The callbacks get the call's device, and the tokens equal plain CPU
Transformers with the same callbacks.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList  # noqa: E402

from transformers_tpu_ext.generation import policy  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402


class Bias(LogitsProcessor):
    """Adds a bias made on the model's device (the usual way to write one)."""

    def __init__(self, vocab: int, device, token: int) -> None:
        self.bias = torch.zeros(vocab, device=device)
        self.bias[token] = 50.0
        self.devices = []

    def __call__(self, input_ids, scores):
        self.devices.append((input_ids.device.type, scores.device.type))
        return scores + self.bias


class StopOn(StoppingCriteria):
    """Stops a row when its last token is ``token`` (a tensor made on the model's device)."""

    def __init__(self, device, token: int) -> None:
        self.token = torch.tensor([token], device=device)
        self.devices = []

    def __call__(self, input_ids, scores, **kwargs):
        self.devices.append(input_ids.device.type)
        return torch.isin(input_ids[:, -1], self.token)


def test_the_predicate_follows_the_inputs():
    assert policy.callback_device("tpu")[0] == "caller"
    assert policy.callback_device("cpu")[0] == "host"
    assert policy.callback_device(None)[0] == "host"


@pytest.fixture(scope="module")
def models():
    reference = tiny.tiny_model("llama", seed=1)
    tiny.check_context_sensitive(reference)
    return reference


def _generate(model, ids, device, **kwargs):
    vocab = model.config.vocab_size
    bias = Bias(vocab, device, token=7)
    stop = StopOn(device, token=9)
    out = model.generate(
        ids.to(device),
        attention_mask=torch.ones_like(ids).to(device),
        max_new_tokens=6,
        logits_processor=LogitsProcessorList([bias]),
        stopping_criteria=StoppingCriteriaList([stop]),
        prefix_allowed_tokens_fn=lambda batch_id, sent: [7, 9, int(sent[-1]) % vocab] if sent.device == ids.to(device).device else [],
        **kwargs,
    )
    return out.cpu(), bias.devices, stop.devices


@pytest.mark.slow
@pytest.mark.parametrize("mode", [dict(do_sample=False), dict(num_beams=2, do_sample=False)], ids=["greedy", "beams"])
def test_processors_and_criteria_get_tpu_tensors_and_cpu_tokens(simulated_tpu, models, mode):
    ids = torch.tensor([[5, 17, 33, 2, 40], [8, 8, 12, 60, 3]])
    expected, cpu_seen, _ = _generate(models, ids, "cpu", **mode)
    assert set(cpu_seen) == {("cpu", "cpu")}
    model = tiny.tiny_model("llama", seed=1).to("tpu")
    out, seen, stop_seen = _generate(model, ids, "tpu", **mode)
    assert set(seen) == {("tpu", "tpu")}
    assert set(stop_seen) == {"tpu"}
    assert torch.equal(out, expected)


@pytest.mark.slow
def test_inputs_on_the_host_keep_host_callbacks(simulated_tpu, models):
    ids = torch.tensor([[5, 17, 33, 2, 40]])
    model = tiny.tiny_model("llama", seed=1).to("tpu")
    vocab = model.config.vocab_size
    bias = Bias(vocab, "cpu", token=7)
    out = model.generate(ids, max_new_tokens=4, do_sample=False, logits_processor=LogitsProcessorList([bias]))
    assert set(bias.devices) == {("cpu", "cpu")}
    expected = models.generate(ids, max_new_tokens=4, do_sample=False, logits_processor=LogitsProcessorList([Bias(vocab, "cpu", 7)]))
    assert torch.equal(out.cpu(), expected)
