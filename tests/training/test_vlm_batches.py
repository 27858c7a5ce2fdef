"""Issue 38: which vision-language training batches are padded (``plan_batch`` with ``ModelFacts.media_keys``)."""

from __future__ import annotations

from transformers_tpu_ext.training import buckets
from transformers_tpu_ext.training.buckets import ModelFacts, SourceFacts

LADDER = buckets.sequence_ladder()
_TEXT = {"input_ids": (3, 40), "attention_mask": (3, 40), "labels": (3, 40)}
_QWEN = ModelFacts(pad_token_id=0, media_keys=frozenset({"pixel_values", "image_grid_thw"}))
_INT = {"input_ids": "int", "attention_mask": "int", "labels": "int", "mm_token_type_ids": "int", "image_grid_thw": "int"}


def test_the_text_is_padded_and_the_images_inputs_pass_through_without_added_rows():
    shapes = {**_TEXT, "mm_token_type_ids": (3, 40), "pixel_values": (3, 96), "image_grid_thw": (3, 3)}
    plan = buckets.plan_batch(shapes, ladder=LADDER, batch_size=4, model=_QWEN, dtypes={**_INT, "pixel_values": "float"},
                              source=SourceFacts(training=True))
    assert not isinstance(plan, str), plan
    assert plan.lengths == {"input_ids": 48, "attention_mask": 48, "labels": 48, "mm_token_type_ids": 48}
    assert plan.rows == 3  # a copied row would need its images too
    assert buckets.SEQUENCE_PADDING["mm_token_type_ids"] == 0


def test_without_media_inputs_rows_are_added_as_for_text():
    plan = buckets.plan_batch(_TEXT, ladder=LADDER, batch_size=4, model=_QWEN, dtypes=_INT, source=SourceFacts(training=True))
    assert not isinstance(plan, str) and plan.rows == 4


def test_inputs_of_a_vision_language_model_that_were_not_read_leave_the_batch_alone():
    shapes = {**_TEXT, "pixel_values_videos": (3, 96), "video_grid_thw": (3, 3)}
    plan = buckets.plan_batch(shapes, ladder=LADDER, batch_size=4, model=_QWEN, dtypes=_INT)
    assert isinstance(plan, str) and "pixel_values_videos" in plan


def test_gemma3_batches_with_images_no_longer_get_copied_rows():
    # Before issue 38 a Gemma 3 batch (a causal LM of Transformers' mappings) got rows copied from its first,
    # pixel_values included: wrong as soon as the first row's image count differs from the rows' average.
    model = ModelFacts(pad_token_id=0, media_keys=frozenset({"pixel_values"}))
    shapes = {**_TEXT, "token_type_ids": (3, 40), "pixel_values": (3, 3, 8, 8)}
    plan = buckets.plan_batch(shapes, ladder=LADDER, batch_size=4, model=model, dtypes={**_INT, "pixel_values": "float"})
    assert not isinstance(plan, str) and plan.rows == 3
