"""Fine-tuning state-space and hybrid models with the Trainer on TPU (issue 39): the CPU's losses, steady state.

The plugin pads a causal language model's batches on the right to a length bucket (labels -100). For the
families ``generation.recurrent`` knows, the mixers run forward in time (causal scans and convolutions), so
the padding comes after every real token's state; a model with recurrent layers of another family keeps its
batches as collated. Two epochs over the same 16 ragged examples: the losses of plain CPU Transformers (plugin
off), the batches padded to buckets, and no program compiled in the second epoch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import _paths  # noqa: E402
from _paths import TOLERANCE, both, losses, max_diff  # noqa: E402
from _training import collator, requires_trainer, step_counter  # noqa: E402

from transformers_tpu_ext.testing.tiny import RECURRENT_ARCHITECTURES  # noqa: E402

pytestmark = [requires_trainer, pytest.mark.slow]

STEPS = 8  # two epochs of 4 batches


@pytest.mark.parametrize("arch", RECURRENT_ARCHITECTURES)
def test_two_epochs_give_the_cpu_losses_and_the_second_compiles_nothing(simulated_tpu, tmp_path, arch):
    data = [{"input_ids": ids} for ids in _paths.token_lists(16, 8, 70)]
    counter = step_counter(simulated_tpu)

    def run(cpu: bool):
        trainer = _paths.trainer(tmp_path / ("cpu" if cpu else "tpu"), cpu=cpu, model=_paths.causal_lm(arch), train=data,
                                 collator=collator(), max_steps=STEPS, callbacks=() if cpu else (counter,))
        trainer.train()
        return losses(trainer), trainer.__dict__.get("_tpu_ext_bucket_lengths")

    (cpu, _), (tpu, lengths) = both(run)
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)
    assert lengths, "the batches were not padded to buckets"
    programs = [c.programs for c in counter.steps]
    assert sum(programs[STEPS // 2 :]) == 0, programs


def test_recurrent_layers_of_an_unknown_family_keep_their_batches_as_collated(simulated_tpu, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    def falcon_mamba():
        torch.manual_seed(0)
        config = AutoConfig.for_model("falcon_mamba", vocab_size=_paths.VOCAB, hidden_size=32, num_hidden_layers=2,
                                      state_size=8, expand=2, conv_kernel=4, pad_token_id=0)
        return AutoModelForCausalLM.from_config(config)

    data = [{"input_ids": ids} for ids in _paths.token_lists(8, 8, 70)]

    def run(cpu: bool):
        trainer = _paths.trainer(tmp_path / ("cpu" if cpu else "tpu"), cpu=cpu, model=falcon_mamba(), train=data,
                                 collator=collator(), max_steps=2)
        trainer.train()
        return losses(trainer), trainer.__dict__.get("_tpu_ext_bucket_lengths")

    (cpu, _), (tpu, lengths) = both(run)
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)
    assert not lengths, lengths
