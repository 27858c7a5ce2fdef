"""``plan_media_call``: which image and audio classifier calls are padded, and why the others are not.

The predicate's tests are pure (plain shapes and facts); the last ones check the facts it relies on
against the models themselves, on the CPU: a padded call under a mask gives the unpadded logits for a
layer-norm wav2vec2 and HuBERT, and not for a group-norm one (the reason it is refused)."""

from __future__ import annotations

import dataclasses

import pytest

from transformers_tpu_ext.inference import media, paths, policy
from transformers_tpu_ext.inference.media import MediaFacts, plan_media_call
from transformers_tpu_ext.inference.policy import CallPlan

VIT = MediaFacts(task="image_classification", family="vit", accepts=frozenset({"pixel_values"}))
W2V = MediaFacts(task="audio_classification", family="wav2vec2", feat_extract_norm="layer", conv_kernel=(10, 3),
                 conv_stride=(5, 2), accepts=frozenset({"input_values", "attention_mask"}))


def _clips(rows: int, length: int, mask: bool = True) -> dict:
    return {"input_values": (rows, length), **({"attention_mask": (rows, length)} if mask else {})}


def test_images_pad_rows_only():
    plan = plan_media_call({"pixel_values": (3, 3, 32, 32)}, VIT)
    assert plan == CallPlan(rows=4, length=32, original_rows=3, original_length=32, keys=("pixel_values",), pad_token_id=0)
    assert plan_media_call({"pixel_values": (3, 3, 32, 32)}, VIT, used_rows={8}).rows == 8  # a partial batch
    assert "pixel_mask" in plan_media_call({"pixel_values": (3, 3, 32, 32), "pixel_mask": (3, 32, 32)}, VIT)
    assert "not a batch of 3-D float inputs" in plan_media_call({"pixel_values": (3, 32, 32)}, VIT)
    assert "not a batch of 3-D float inputs" in plan_media_call({"pixel_values": (3, 3, 32, 32)}, VIT, dtypes={"pixel_values": "int"})


def test_audio_pads_samples_under_a_mask_to_a_rung():
    plan = plan_media_call(_clips(3, 1500), W2V)
    assert (plan.rows, plan.length, plan.keys, plan.add_mask) == (4, 1536, ("input_values", "attention_mask"), False)
    no_mask = plan_media_call(_clips(3, 1500, mask=False), W2V)
    assert (no_mask.keys, no_mask.add_mask) == (("input_values",), True)
    assert plan_media_call(_clips(4, 1500), W2V, used={2048}).length == 2048  # a short batch reuses a longer rung
    assert media.audio_ladder()[:5] == (1024, 1536, 2048, 3072, 4096)


def test_whispers_fixed_length_features_pad_rows_only():
    whisper = dataclasses.replace(W2V, family="whisper", feat_extract_norm=None, conv_kernel=(), conv_stride=())
    plan = plan_media_call({"input_features": (3, 80, 3000)}, whisper)
    assert (plan.rows, plan.length, plan.keys, plan.add_mask) == (4, 3000, ("input_features",), False)


def test_frames_of_a_convolutional_feature_extractor():
    assert media.frames(400, (10, 3), (5, 2)) == 39
    assert media.frames(12, (10, 3), (5, 2)) == 0
    assert media.frames(400, (10, 3, 3, 3, 3, 2, 2), (5, 2, 2, 2, 2, 2, 2)) == 1  # wav2vec2's: 25 ms


@pytest.mark.parametrize(
    ("change", "shapes", "options", "reason"),
    [
        ({"feat_extract_norm": "group"}, None, {}, "GroupNorm over time"),
        ({"adapter": True}, None, {}, "adapter"),
        ({"family": "wavlm"}, None, {}, "family 'wavlm'"),
        ({"training": True}, None, {}, "training mode"),
        ({"experts": True}, None, {}, "mixture-of-experts"),
        ({"task": None}, None, {}, "not an image or audio classifier"),
        ({"accepts": frozenset({"input_values"})}, _clips(2, 900, mask=False), {}, "takes no attention_mask"),
        ({}, {"input_features": (2, 80, 3000)}, {}, "no input_values"),
        ({"family": "whisper"}, {"input_features": (2, 80, 3000), "attention_mask": (2, 3000)}, {}, "other than input_features"),
        ({}, {**_clips(2, 900), "labels": (2,)}, {}, "no known padding: labels"),
        ({}, {"input_values": (2, 900), "attention_mask": (2, 800)}, {}, "not both (batch, samples)"),
        ({}, _clips(2, 12), {}, "12 samples make no frame"),
        ({}, None, {"output_hidden_states": True}, "per frame"),
        ({}, None, {"output_attentions": True}, "per frame"),
    ],
)
def test_what_is_not_recognised_runs_unpadded(change, shapes, options, reason):
    result = plan_media_call(shapes or _clips(2, 900), dataclasses.replace(W2V, **change), options=options)
    assert isinstance(result, str) and reason in result


def test_positional_calls_and_float_masks_run_unpadded():
    assert "positional" in plan_media_call(_clips(2, 900), W2V, positional=1)
    assert "not integer" in plan_media_call(_clips(2, 900), W2V, dtypes={"attention_mask": "float"})


def test_the_pipelines_are_bucketed_and_the_docs_table_comes_from_the_predicate(monkeypatch):
    assert media.MEDIA_PIPELINES <= policy.PIPELINES
    cells = [row.split(" | ")[1] for row in paths.media_table().splitlines()[2:]]
    assert len(cells) == len(paths.MEDIA_CASES) and sum(cell != "as it is" for cell in cells) == 4
    before = paths.media_table()
    monkeypatch.setattr(media, "AUDIO_FAMILIES", frozenset({"hubert"}))
    assert paths.media_table() != before


# -- the facts the predicate relies on, checked on the models (CPU) ---------------------------------

torch = pytest.importorskip("torch")


def _audio_model(norm: str, family: str = "wav2vec2"):
    from transformers_tpu_ext.testing.tiny_media import tiny_audio_classifier

    return tiny_audio_classifier(family, norm)


def _padded_logits(model, clips: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, own = clips.shape
    with torch.no_grad():
        plain = model(input_values=clips).logits
        padded = torch.nn.functional.pad(clips, (0, length - own))
        mask = torch.zeros(rows, length, dtype=torch.long)
        mask[:, :own] = 1
        return plain, model(input_values=padded, attention_mask=mask).logits


@pytest.mark.parametrize("family", ["wav2vec2", "hubert"])
def test_a_layer_norm_model_under_a_mask_gives_the_unpadded_logits(family):
    clips = torch.randn(2, 1111, generator=torch.Generator().manual_seed(0))
    plain, padded = _padded_logits(_audio_model("layer", family), clips, 2048)
    assert float((plain - padded).abs().max()) < 1e-5
    assert float((plain[0] - plain[1]).abs().max()) > 1e-3, "two clips give different logits"


def test_a_group_norm_model_reads_the_padding():
    plain, padded = _padded_logits(_audio_model("group"), torch.randn(2, 1111, generator=torch.Generator().manual_seed(0)), 2048)
    assert float((plain - padded).abs().max()) > 1e-3


def test_the_facts_read_off_the_models():
    from transformers_tpu_ext.inference.media_calls import media_facts
    from transformers_tpu_ext.testing.tiny_media import tiny_vit

    facts = media_facts(_audio_model("layer"))
    assert (facts.task, facts.family, facts.feat_extract_norm, facts.conv_kernel, facts.conv_stride) == (
        "audio_classification", "wav2vec2", "layer", (10, 3), (5, 2))
    assert facts.accepts == frozenset({"input_values", "attention_mask"}) and not facts.adapter
    vit = tiny_vit()
    assert media_facts(vit).task == "image_classification" and "pixel_values" in media_facts(vit).accepts
    assert media_facts(torch.nn.Linear(2, 2)) == MediaFacts()
