"""``torch.Generator(device="tpu")`` on the simulated TPU: a generator of the device, as torch_tpu has.

Before, the simulator raised PyTorch's "register PrivateUse1HooksInterface ... getNewGenerator" error,
and 9 of Transformers' watermarking tests failed on it in both plugin configurations.
"""

from __future__ import annotations

import copy
import pickle

import pytest

torch = pytest.importorskip("torch")


def test_a_tpu_generator_is_a_generator_of_the_tpu(simulated_tpu):
    g = torch.Generator(device="tpu")
    assert g.device == torch.device("tpu", 0)
    assert torch.Generator(device=torch.device("tpu")).device.type == "tpu"
    assert isinstance(g, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
    assert torch.Generator().device.type == "cpu"
    assert torch.tpu.default_generators[0].device.type == "tpu"
    assert g.manual_seed(3) is g  # chained, as Transformers writes it
    assert copy.deepcopy(g).device.type == "tpu" and pickle.loads(pickle.dumps(g)).device.type == "tpu"


def test_seeded_draws_with_a_tpu_generator_are_reproducible(simulated_tpu):
    g = torch.Generator(device="tpu")
    draws = []
    for seed in (0, 0, 1):
        g.manual_seed(seed)
        x = torch.empty(8, device="tpu")
        draws.append([torch.randn(4, device="tpu", generator=g).cpu(), torch.randperm(16, device="tpu", generator=g).cpu(),
                      x.normal_(generator=g).cpu(), torch.multinomial(torch.ones(2, 10, device="tpu"), 3, generator=g).cpu()])
    assert all(torch.equal(a, b) for a, b in zip(draws[0], draws[1]))
    assert not torch.equal(draws[0][0], draws[2][0])
    # Its own stream: the TPU's default generator is left where it was.
    torch.tpu.manual_seed(5)
    first = torch.rand(3, device="tpu").cpu()
    torch.tpu.manual_seed(5)
    g.manual_seed(9)
    torch.randn(4, device="tpu", generator=g)
    assert torch.equal(torch.rand(3, device="tpu").cpu(), first)


def test_transformers_watermarking_runs_on_the_tpu(simulated_tpu):
    from transformers.generation.logits_process import SynthIDTextWatermarkLogitsProcessor, WatermarkLogitsProcessor

    ids = torch.randint(2, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    scores = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    outs = []
    for _ in range(2):
        processor = WatermarkLogitsProcessor(vocab_size=50, device="tpu", seeding_scheme="lefthash")
        outs.append(processor(ids.to("tpu"), scores.to("tpu")).cpu())
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], scores)
    synth = SynthIDTextWatermarkLogitsProcessor(ngram_len=3, keys=[1, 2, 3], sampling_table_size=2**8,
                                                sampling_table_seed=0, context_history_size=64, device="tpu")
    assert synth.sampling_table.device.type == "tpu"
