"""``transformers_tpu_ext.core.length_readers``: what reads the length of a forward pass, and the predicates on it.

The table is checked against the installed Transformers: every entry of ``ROPE_INIT_FUNCTIONS`` is in it,
and a real rotary module of each type changes its frequencies with the length exactly where the table
says it does. The predicates are pure and tested on plain data.
"""

from __future__ import annotations

import pytest

from transformers_tpu_ext.core import length_readers as lr
from transformers_tpu_ext.core.length_readers import LengthPlan, ModelLengths, Rotary

LONGROPE = ModelLengths((Rotary("longrope", 64),))
PHI3 = ModelLengths((Rotary("longrope", 64),), resets_cache_at=64)
DYNAMIC = ModelLengths((Rotary("dynamic", 64),))
STATIC = ModelLengths((Rotary("default"), Rotary("yarn")))


def test_module_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, transformers_tpu_ext.core.length_readers; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"TRANSFORMERS_TPU_EXT_DISABLE": "1", "PYTHONPATH": ":".join(sys.path)})
    assert out.stdout.strip().endswith("False"), out


# -- the table against the installed Transformers -----------------------------------------------------


def test_every_rope_init_function_is_in_the_table():
    pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(ROPE_INIT_FUNCTIONS) <= set(lr.ROPE_TYPES), sorted(set(ROPE_INIT_FUNCTIONS) - set(lr.ROPE_TYPES))


def _types_models_accept() -> dict[str, set[str]]:
    """Every rotary type a model file of the installed Transformers accepts, from its source (no model imported):
    its ``compute_<type>_rope_parameters`` methods and its ``rope_type ==``/``!=`` checks, with the files."""
    import re
    from pathlib import Path

    import transformers

    found: dict[str, set[str]] = {}
    pattern = re.compile(r'def compute_([a-z0-9_]+)_rope_parameters|rope_type\s*[!=]=\s*"([a-z0-9_]+)"')
    for path in (Path(transformers.__file__).parent / "models").glob("*/modeling_*.py"):
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(match.group(1) or match.group(2), set()).add(path.parent.name)
    return found


def test_every_rotary_type_a_model_accepts_is_in_the_table():
    """A new rotary type in a Transformers release (5.25 added vision towers' ``axial``) fails here until the
    table says what it reads: until then the predicates hand every call of those models to upstream."""
    pytest.importorskip("transformers")
    found = _types_models_accept()
    assert {"default", "axial"} <= set(found)  # the scan sees the models (Qwen2.5-VL's vision tower: axial)
    unknown = {name: sorted(models)[:5] for name, models in found.items() if lr.rope_type(name) is None}
    assert not unknown, f"rotary types the table does not know (a few models each): {unknown}"


def test_a_vision_tower_with_axial_rotary_is_no_reader():
    """Qwen2.5-VL's vision rotary (``axial``) reads no length: the model is not left to upstream for it."""
    pytest.importorskip("transformers")
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionRotaryEmbedding

    rotary = Qwen2_5_VLVisionRotaryEmbedding(Qwen2_5_VLVisionConfig(hidden_size=32, num_heads=4))
    found = lr.model_lengths(type("Model", (), {"modules": lambda self: [rotary], "config": None})())
    assert found.rotary == (Rotary("axial"),) and not found
    plan = lr.generation_plan(found, columns=10, longest=10, new_tokens=4, padded=16, chunk=None)
    assert not plan.upstream and plan.pad


_PARAMS = {
    "default": {},
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 4.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 64},
    "longrope": {"short_factor": [1.0, 1.0, 1.0, 1.0], "long_factor": [1.0, 3.0, 9.0, 27.0],
                 "original_max_position_embeddings": 64},
    "llama3": {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "proportional": {},
}


@pytest.mark.parametrize("name", sorted(_PARAMS))
def test_the_table_says_what_a_rotary_module_does(name):
    """A Llama rotary module of each type, fed positions up to 20 then 200, then 20 again: its cosines at
    positions 0-7 change past the threshold (64 here: max_position_embeddings and the original context)
    exactly for the types the table says read the length."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    max_positions = 64 if name in ("dynamic", "default", "linear", "proportional") else 256
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, head_dim=8, max_position_embeddings=max_positions,
                         rope_parameters={"rope_type": name, "rope_theta": 10000.0, **_PARAMS[name]})
    rotary = LlamaRotaryEmbedding(config)
    x = torch.zeros(1, 1, 8)

    def cos(length):
        positions = torch.arange(length)[None]
        return rotary(x, positions)[0][0, :8].clone()

    short, long, again = cos(20), cos(200), cos(20)
    kind = lr.rope_type(name)
    assert kind is not None
    assert (not torch.allclose(short, long)) == (kind.threshold is not None), name
    assert torch.allclose(short, again), name  # a shorter forward gives the short frequencies back (dynamic resets)
    found = lr.model_lengths(type("Model", (), {"modules": lambda self: [rotary], "config": config})())
    assert bool(found) == (kind.threshold is not None)
    if kind.threshold is not None:
        assert found.readers == (Rotary(name, 64),)


def test_unknown_types_are_not_recognised():
    assert lr.rope_type("my_rope") is None and lr.rope_type("dynamic_v2") is None
    unknown = ModelLengths((Rotary("my_rope"),))
    assert unknown and unknown.unknown == ["my_rope"]
    assert lr.generation_plan(unknown, columns=10, longest=10, new_tokens=5, padded=16, chunk=None).upstream
    assert isinstance(lr.padding_limit(unknown, 10), str)


def test_tiny_phi3_and_llama_read_as_expected():
    pytest.importorskip("transformers")
    from transformers_tpu_ext.testing.tiny import tiny_model

    phi3 = tiny_model("phi3", original_max_position_embeddings=64, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5,
        "short_factor": [1.0, 1.0], "long_factor": [1.0, 3.0]})
    llama = tiny_model("llama", max_position_embeddings=64, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0})
    assert lr.model_lengths(phi3) == PHI3  # Phi-3's prepare_inputs_for_generation resets the cache at 64 columns
    assert lr.model_lengths(llama) == DYNAMIC
    assert not lr.model_lengths(tiny_model("qwen3"))


# -- chunks --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, longest, exact",
    [(LONGROPE, 64, True), (LONGROPE, 65, False), (DYNAMIC, 63, True), (DYNAMIC, 64, False), (STATIC, 10_000, True)],
)
def test_chunks_are_exact_only_on_the_near_side_of_the_threshold(model, longest, exact):
    assert lr.chunks_exact(model, longest) is exact


# -- generate() ------------------------------------------------------------------------------------------


def test_generation_prefills_in_one_piece_past_the_threshold():
    # 100 and 300 tokens past a 64-token threshold: the bucket's padding stays, the prompt is one chunk.
    for longest, padded in ((100, 128), (300, 320)):
        plan = lr.generation_plan(LONGROPE, columns=longest, longest=longest, new_tokens=30, padded=padded, chunk=64)
        assert plan == LengthPlan(False, plan.reason, pad=True, chunk=None), plan
        # dynamic NTK past its threshold: Transformers' call, said at WARNING (tests/generation/test_dynamic_ntk.py)
        plan = lr.generation_plan(DYNAMIC, columns=longest, longest=longest, new_tokens=30, padded=padded, chunk=64)
        assert plan.upstream and plan.warn, plan
    # 40 tokens and 5 more (under 64): chunks (and the plugin's chunk) are exact.
    plan = lr.generation_plan(DYNAMIC, columns=40, longest=40, new_tokens=5, padded=64, chunk=None)
    assert not plan.upstream and plan.pad and plan.chunk is None
    plan = lr.generation_plan(LONGROPE, columns=120, longest=60, new_tokens=5, padded=128, chunk=64)
    assert plan.pad and plan.chunk == 64  # ragged: the longest row is within the threshold


def test_generation_keeps_the_callers_chunks_where_padding_would_move_them():
    plan = lr.generation_plan(LONGROPE, columns=100, longest=100, new_tokens=5, padded=128, chunk=64, caller_chunk=32)
    assert not plan.upstream and not plan.pad
    plan = lr.generation_plan(LONGROPE, columns=40, longest=40, new_tokens=5, padded=64, chunk=None, caller_chunk=32)
    assert plan.pad


def test_phi3_cache_reset_goes_upstream_or_unpadded():
    # The sequence's columns pass 64 within the call: Phi-3 drops the cache there -> Transformers' call.
    assert lr.generation_plan(PHI3, columns=40, longest=40, new_tokens=30, padded=64, chunk=None).upstream
    assert lr.generation_plan(PHI3, columns=100, longest=100, new_tokens=1, padded=128, chunk=64).upstream
    # Real columns stay within 64 but the bucket's would not: handled, not padded.
    plan = lr.generation_plan(PHI3, columns=40, longest=40, new_tokens=10, padded=64, chunk=None)
    assert not plan.upstream and not plan.pad
    # Both stay within: padded as usual.
    plan = lr.generation_plan(PHI3, columns=20, longest=20, new_tokens=10, padded=32, chunk=None)
    assert not plan.upstream and plan.pad


# -- training ---------------------------------------------------------------------------------------------


def test_training_padding_limits():
    assert lr.padding_limit(STATIC, 5000) is None
    assert lr.padding_limit(LONGROPE, 50) == 64
    assert lr.padding_limit(LONGROPE, 65) is None
    assert lr.padding_limit(DYNAMIC, 50) == 63
    assert lr.padding_limit(DYNAMIC, 64) == 64 and lr.padding_limit(DYNAMIC, 80) == 80
    assert "NEFTune" in lr.padding_limit(STATIC, 10, neftune=True)


def test_plan_batch_applies_the_limits():
    from transformers_tpu_ext.training import buckets

    ladder = buckets.sequence_ladder()
    shapes = {"input_ids": (4, 50), "attention_mask": (4, 50), "labels": (4, 50)}
    longrope = buckets.ModelFacts(pad_token_id=0, lengths=LONGROPE)
    assert buckets.plan_batch(shapes, ladder=ladder, used=(96,), model=longrope).sequence == 64
    assert buckets.plan_batch(shapes, ladder=ladder, used=(96,), model=buckets.ModelFacts(pad_token_id=0)).sequence == 96
    dynamic = buckets.ModelFacts(pad_token_id=0, lengths=DYNAMIC)
    assert buckets.plan_batch(shapes, ladder=ladder, model=dynamic).sequence == 63
    neftune = buckets.plan_batch(shapes, ladder=ladder, source=buckets.SourceFacts(neftune=True))
    assert isinstance(neftune, str) and "NEFTune" in neftune
    # evaluation: NEFTune adds no noise there
    evaluation = buckets.SourceFacts(training=False, cuts_outputs=True, neftune=True)
    assert not isinstance(buckets.plan_batch(shapes, ladder=ladder, source=evaluation, pad_rows=False), str)


def test_the_docs_table_is_the_predicates():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "generation.md").read_text()
    begin, end = text.index(lr.BEGIN) + len(lr.BEGIN), text.index(lr.END)
    assert text[begin:end].strip() == lr.length_table(), "run: python scripts/gen_docs_tables.py"
