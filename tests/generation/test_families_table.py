"""docs/generation.md's family table is ``generation.families.family_table()``, and its facts are the ones the
glue reads off real tiny models of each family (``testing.tiny_vlm``, ``testing.tiny_media``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformers_tpu_ext.generation import families

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_table_is_the_predicates():
    text = (ROOT / "docs" / "generation.md").read_text()
    generated = text[text.index(families.BEGIN) + len(families.BEGIN) : text.index(families.END)].strip()
    assert generated == families.family_table(), "run: python scripts/gen_docs_tables.py"


def _case(family: str) -> families.FamilyCase:
    return next(case for case in families.FAMILY_CASES if case.family == family and case.per_item != frozenset(
        {"pixel_values_videos", "video_grid_thw"}))


@pytest.mark.parametrize("family", ["llava", "gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "whisper"])
def test_the_facts_of_each_family_are_the_glues(family):
    pytest.importorskip("PIL")
    from transformers_tpu_ext.generation import multimodal, wrap_generate, wrap_media
    from transformers_tpu_ext.generation.call import model_kind
    from transformers_tpu_ext.serving.patch_continuous_batching import _media
    from transformers_tpu_ext.testing import tiny_media, tiny_vlm
    from transformers_tpu_ext.training.facts import model_facts

    case = _case(family)
    if family == "whisper":
        model, _ = tiny_media.tiny_whisper_generation()
    else:
        model, processor = tiny_vlm.tiny_vlm(family)
        request = next(r for r in tiny_vlm.vlm_requests(family, 3) if r.images)
        call = tiny_vlm.processed(processor, request)
        extras = wrap_generate._other_batched_inputs(call, "input_ids")
        read = wrap_media.media_facts(model, call, extras, call["input_ids"])
        assert (read.per_column, read.per_item) == (case.per_column, case.per_item)
        assert read.placeholder_ids and read.pre_encodes
    kind = model_kind(model)
    assert kind.family == case.family
    assert kind.encoder_decoder == bool(case.model.get("encoder_decoder"))
    assert kind.custom_mask_function == bool(case.model.get("custom_mask_function"))
    assert kind.accepts_position_ids
    facts = model_facts(model)
    assert facts.known == case.known
    assert facts.media_keys == (multimodal.FAMILIES[family].per_image if family in multimodal.FAMILIES else frozenset())
    assert _media(model.config) == case.media
