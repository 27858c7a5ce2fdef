"""Issue 27 ("three silent wrong results from padding") and 31: training batches of models that read the
length of the forward pass are padded only where that length keeps its meaning.

Right padding makes a Trainer batch longer, and without ``position_ids`` a model's positions run over the
padded length: a rotary embedding whose frequencies depend on ``max(position_ids) + 1`` sees the padding,
and NEFTune scales its noise by the padded length. Each test trains the same script on plain CPU (plugin
off) and on the simulated TPU (plugin on); the per-step losses must agree. Each failed before the fix.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import _paths  # noqa: E402
from _paths import TOLERANCE, both, losses, max_diff  # noqa: E402
from _training import requires_trainer  # noqa: E402

pytestmark = requires_trainer

ORIGINAL = 64  # the tiny models' original context: the rotary threshold


def _data(long: tuple[int, int], short: tuple[int, int]) -> list[dict[str, list[int]]]:
    """Batches of long sequences and short ones, as the sampler mixes them (labels: the collator's)."""
    rows = _paths.token_lists(8, *long, seed=3) + _paths.token_lists(16, *short, seed=4)
    return [{"input_ids": ids} for ids in rows]


def _run(tmp_path, model_factory, data, **overrides):
    from transformers import DataCollatorForLanguageModeling

    def run(cpu: bool):
        tok = _paths.tokenizer("right")
        trainer = _paths.trainer(
            tmp_path / ("cpu" if cpu else "tpu"), cpu=cpu, model=model_factory(), train=data,
            collator=DataCollatorForLanguageModeling(tok, mlm=False), **overrides,
        )
        trainer.train()
        return losses(trainer)

    return both(run)


def dynamic_llama():
    return _paths.causal_lm("llama", max_position_embeddings=ORIGINAL,
                            rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0})


def longrope_phi3():
    return _paths.causal_lm(
        "phi3", original_max_position_embeddings=ORIGINAL, max_position_embeddings=512,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": ORIGINAL,
                         "short_factor": [1.0, 1.0, 1.0, 1.0], "long_factor": [1.0, 3.0, 9.0, 27.0]},
    )


@pytest.mark.slow
def test_dynamic_rope_short_batches_stay_below_the_threshold(simulated_tpu, tmp_path):
    """Dynamic NTK resets its frequencies only on a forward shorter than max_position_embeddings (64). Before
    the fix, short batches were padded to exactly 64, so after one long batch the frequencies never reset."""
    cpu, tpu = _run(tmp_path, dynamic_llama, _data((70, 90), (45, 60)))
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)


def test_longrope_short_batches_are_not_padded_past_the_original_context(simulated_tpu, tmp_path):
    """LongRoPE picks its long factors when the batch is longer than original_max_position_embeddings (64).
    Before the fix, a short batch reused the 96 rung a long batch had compiled and switched to the long factors."""
    cpu, tpu = _run(tmp_path, longrope_phi3, _data((70, 90), (45, 60)))
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)


def test_neftune_sees_the_collated_length(simulated_tpu, tmp_path):
    """NEFTune's noise is alpha / sqrt(length * hidden), ``length`` the embeddings' ``size(1)``, drawn over every
    position. Before the fix, batches padded to their rung gave NEFTune the padded length (weaker noise than
    asked, up to 1.17x here). The noise itself comes from each device's generator (the CPU's and the TPU's
    streams differ), so the test compares what sets its scale: the shape of every embedding output in training."""
    from transformers import DataCollatorForLanguageModeling

    data = _data((20, 30), (33, 40))

    def run(cpu: bool):
        model = _paths.causal_lm("qwen3")
        shapes = []
        model.get_input_embeddings().register_forward_hook(
            lambda module, args, output: shapes.append(tuple(output.shape)) if module.training else None
        )
        trainer = _paths.trainer(
            tmp_path / ("cpu" if cpu else "tpu"), cpu=cpu, model=model, train=data, neftune_noise_alpha=5.0,
            collator=DataCollatorForLanguageModeling(_paths.tokenizer("right"), mlm=False),
        )
        trainer.train()
        return shapes

    cpu, tpu = both(run)
    assert len(cpu) == 6 and tpu == cpu, (tpu, cpu)
