"""State-space and hybrid models: the "safe when" predicate of their generate() path (issue 39), in milliseconds.

``generation.recurrent.recurrent_path`` decides per family from plain facts: the static cache with its
recurrent states and a compiled decode step for the six families it knows; prompt padding only where the
family's mixer provably ignores it (no bias on its input projection); the prefill in one piece where its
scan cannot continue from a cache (Mamba, Jamba); anything else Transformers' own. The generation policy
and the serving predicate read it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from transformers_tpu_ext.serving import policy as serving
from transformers_tpu_ext.generation import policy, recurrent

ROOT = Path(__file__).resolve().parents[2]


def _facts(model_type: str, layer_types: tuple[str, ...] = ("linear_attention",), **changes) -> recurrent.RecurrentFacts:
    family = recurrent.FAMILIES.get(model_type)
    fields = dict(upstream_modules=(family.mixer,) if family else (), bias=False if family and family.bias else None)
    return recurrent.RecurrentFacts(model_type, layer_types, **{**fields, **changes})


@pytest.mark.parametrize("model_type", sorted(recurrent.FAMILIES))
def test_each_known_family_is_handled_with_its_prompt_padded(model_type):
    path = recurrent.recurrent_path(_facts(model_type))
    assert path.handled and path.pad_prompt, path.reason
    assert path.chunked_prefill is (model_type not in ("mamba", "jamba"))  # their scan restarts from zero
    assert path.positions is (model_type not in ("mamba", "mamba2"))


@pytest.mark.parametrize("model_type", [name for name, family in recurrent.FAMILIES.items() if family.bias])
def test_a_bias_on_the_input_projection_keeps_the_prompt_unpadded(model_type):
    family = recurrent.FAMILIES[model_type]
    for bias in (True, None):  # set, or not readable: not proven
        path = recurrent.recurrent_path(_facts(model_type, bias=bias))
        assert path.handled and not path.pad_prompt
        assert f"{family.bias}=True" in path.reason


def test_models_without_recurrent_layers_are_not_this_predicates():
    assert recurrent.recurrent_path(_facts("llama", ("full_attention", "sliding_attention"))) is None


def test_anything_unrecognised_is_left_to_upstream():
    cases = {
        "has recurrent layers of a family": _facts("zamba2"),
        "chunked_attention layers": _facts("lfm2", ("conv", "chunked_attention")),
        "without Transformers' own Lfm2ShortConv": _facts("lfm2", ("conv", "full_attention"), upstream_modules=("MyConv",)),
        "takes no attention mask": _facts("mamba", accepts_attention_mask=False),
        "takes no position ids": _facts("jamba", ("linear_attention", "full_attention"), accepts_position_ids=False),
    }
    for why, facts in cases.items():
        path = recurrent.recurrent_path(facts)
        assert not path.handled and why in path.reason, path.reason
    # Mamba reads no positions: a forward without position ids is expected there
    assert recurrent.recurrent_path(_facts("mamba", accepts_position_ids=False)).handled


def test_only_a_decode_step_takes_the_cache_long_device_mask():
    path = recurrent.recurrent_path(_facts("lfm2", ("conv", "full_attention")))
    assert path.attention and not recurrent.recurrent_path(_facts("mamba")).attention
    assert recurrent.device_mask_holds(None, 16)  # attention models: every forward
    assert recurrent.device_mask_holds(path, 1) and not recurrent.device_mask_holds(path, 16)


def _plan(recurrent_path, **options):
    model = policy.ModelKind(layer_types=("linear_attention",), accepts_position_ids=False, recurrent=recurrent_path)
    facts = policy.call_facts(options, model, policy.CallShape(), device_decode=True)
    return policy.plan_call(facts, static_cache=True, bucketing=True)


def test_the_generation_policy_takes_a_handled_family_and_leaves_the_others():
    plan = _plan(recurrent.recurrent_path(_facts("mamba")))
    assert not plan.upstream and plan.static_cache and plan.bucket and plan.pad_batch
    other = _plan(recurrent.recurrent_path(_facts("falcon_mamba")))
    assert other.upstream and "falcon_mamba has recurrent layers" in other.reason
    assert other.hint == recurrent.DOCS  # where its one WARNING points
    returned = _plan(recurrent.recurrent_path(_facts("mamba")), return_dict_in_generate=True)
    assert returned.upstream and "recurrent layers" in returned.reason
    # Without the predicate's word, the layers are not a static cache's (what the plugin did before issue 39)
    assert _plan(None).upstream


def test_a_whole_prompt_climbs_its_own_ladder():
    assert recurrent.whole_prompt_ladder()[:5] == (16, 32, 64, 128, 256)
    assert recurrent.whole_prompt_ladder(2)[:6] == (16, 32, 48, 64, 96, 128)


def test_continuous_batching_names_generate_for_the_layers_upstream_refuses():
    for layers in (("linear_attention",), ("conv", "full_attention"), ("hybrid",)):
        taken, why = serving.paged_path(serving.ServeFacts(layer_types=layers))
        assert not taken and "refuses" in why and "on every device" in why and "generate()" in why


def test_the_docs_table_is_the_predicates():
    text = (ROOT / "docs" / "generation.md").read_text()
    begin, end = recurrent.BEGIN, recurrent.END
    assert begin in text and end in text
    start = text.index(begin) + len(begin)
    assert text[start : text.index(end, start)].strip() == recurrent.family_table()
