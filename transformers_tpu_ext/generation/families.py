"""docs/generation.md's table of vision-language, speech and encoder-decoder families: generate(), fine-tuning,
serving, each computed by the predicate that decides it (pure: plain data, no torch).

- ``generate()``: ``multimodal.media_plan`` (are the call's other inputs padded?), ``policy.plan_call`` and
  ``policy.decode_path`` over the facts the generation glue reads off such a model and call;
- fine-tuning: ``training.buckets.plan_batch`` over the batch a processor's collator makes (``ModelFacts.known``:
  the model is a causal LM of Transformers' task mappings);
- serving: ``serving.policy.paged_path`` (continuous batching takes text only).

Each family's facts are written here as the glue reads them off the tiny models of ``testing.tiny_vlm`` and
``testing.tiny_media``; ``tests/generation/test_families_table.py`` reads them off those models and checks
they are these. ``python scripts/gen_docs_tables.py`` rewrites the docs from :func:`family_table`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import multimodal, policy

__all__ = ["BEGIN", "END", "FAMILY_CASES", "FamilyCase", "family_table", "generate_cell", "serve_cell", "train_cell"]

BEGIN = "<!-- generated: transformers_tpu_ext.generation.families.family_table() -->"
END = "<!-- end of generated family table -->"


@dataclass(frozen=True)
class FamilyCase:
    """A family as the glue sees it: the model's facts, a call's other inputs (per column, per image), a
    fine-tuning batch's shapes (4 rows, 44 tokens), whether the training facts know its task (``ModelFacts.known``:
    a causal or sequence-to-sequence LM of Transformers' mappings, or an image-text-to-text model of a family of
    ``multimodal.FAMILIES``), and what serving reads besides text."""

    name: str  # markdown
    family: str
    model: Mapping[str, Any] = field(default_factory=dict)  # policy.ModelKind fields
    per_column: frozenset[str] = frozenset()
    per_item: frozenset[str] = frozenset()
    batch: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    known: bool = True
    media: str | None = "images"


_TEXT = {"input_ids": (4, 44), "attention_mask": (4, 44), "labels": (4, 44)}
_QWEN_CALL = dict(per_column=frozenset({"mm_token_type_ids"}), per_item=frozenset({"pixel_values", "image_grid_thw"}))
_QWEN_BATCH = {**_TEXT, "mm_token_type_ids": (4, 44), "pixel_values": (96, 96), "image_grid_thw": (4, 3)}

FAMILY_CASES: tuple[FamilyCase, ...] = (
    FamilyCase("Llava (`llava`), one image a prompt", "llava", per_item=frozenset({"pixel_values"}),
               batch={**_TEXT, "pixel_values": (4, 3, 336, 336)}),
    FamilyCase("Gemma 3 (`gemma3`)", "gemma3", {"custom_mask_function": True}, frozenset({"token_type_ids"}),
               frozenset({"pixel_values"}), {**_TEXT, "token_type_ids": (4, 44), "pixel_values": (4, 3, 896, 896)}),
    FamilyCase("Qwen2-VL (`qwen2_vl`)", "qwen2_vl", batch=_QWEN_BATCH, **_QWEN_CALL),
    FamilyCase("Qwen2.5-VL (`qwen2_5_vl`)", "qwen2_5_vl", batch=_QWEN_BATCH, **_QWEN_CALL),
    FamilyCase("Qwen3-VL (`qwen3_vl`)", "qwen3_vl", batch=_QWEN_BATCH, **_QWEN_CALL),
    FamilyCase("Qwen2-VL with a video (`pixel_values_videos`, `video_grid_thw`)", "qwen2_vl",
               per_column=frozenset({"mm_token_type_ids"}), per_item=frozenset({"pixel_values_videos", "video_grid_thw"}),
               batch={**_TEXT, "mm_token_type_ids": (4, 44), "pixel_values_videos": (96, 96), "video_grid_thw": (4, 3)}),
    FamilyCase("LLaVA-NeXT and other image-text families (`image_sizes`, ...)", "llava_next",
               per_item=frozenset({"pixel_values", "image_sizes"}),
               batch={**_TEXT, "pixel_values": (4, 5, 3, 336, 336), "image_sizes": (4, 2)}, known=False),
    FamilyCase("Whisper (`whisper`)", "whisper", {"encoder_decoder": True, "accepts_position_ids": True},
               batch={"input_features": (4, 80, 3000), "labels": (4, 44)}, known=False, media=None),
    FamilyCase("T5, BART and the other encoder-decoder models", "t5", {"encoder_decoder": True},
               batch={**_TEXT, "decoder_attention_mask": (4, 12)}, media=None),
)


def generate_cell(case: FamilyCase) -> str:
    """What ``generate()`` does for the family (greedy, no cache argument): its path and why."""
    media = multimodal.media_plan(multimodal.MediaCall(case.family, case.per_column, case.per_item))
    encoder_decoder = bool(case.model.get("encoder_decoder"))
    other = bool(case.per_column or case.per_item) and not encoder_decoder and not media.pad
    shape = policy.CallShape(inputs="other" if encoder_decoder else "input_ids", ids_bucketable=not encoder_decoder,
                             other_batched_inputs=other, other_inputs_reason=media.reason if other else None)
    model = policy.ModelKind(**{"family": case.family, **case.model})
    plan = policy.plan_call(policy.call_facts({}, model, shape, device_decode=True), static_cache=True, bucketing=True)
    if plan.upstream:
        return f"Transformers', untouched, one WARNING: {plan.reason}"
    loop = policy.decode_path(policy.LoopFacts(
        mode="greedy_search", device_decode=True, processors=(), model_kwargs=("cache", "attention_mask"),
        custom_mask_function=model.custom_mask_function, encoder_decoder=encoder_decoder))
    if not plan.bucket:
        padded = f"not padded, one WARNING ({plan.reason})"
    elif not plan.pad_prompt:
        padded = "static cache, its length bucketed"
    else:
        padded = "static cache, prompt" + (" and images' inputs" if case.per_item else "") + " padded to buckets"
        padded += ", prefilled in one piece" if media.pad and (case.per_column or case.per_item) else ""
    decoding = "device loop" if loop.device else f"host loop, one WARNING ({loop.reason})"
    return f"{padded}; {decoding}"


def train_cell(case: FamilyCase) -> str:
    """What the Trainer does with the family's batches (a collator's batch of 4 rows, 48 tokens)."""
    from ..training import buckets

    family = multimodal.FAMILIES.get(case.family)
    media = family.per_image if family is not None and case.known and case.media else frozenset()
    facts = buckets.ModelFacts(known=case.known, encoder_decoder=bool(case.model.get("encoder_decoder")), pad_token_id=0,
                               media_keys=media)
    plan = buckets.plan_batch(case.batch, ladder=buckets.sequence_ladder(), batch_size=8, model=facts,
                              dtypes={k: "float" if "pixel" in k or k == "input_features" else "int" for k in case.batch})
    if isinstance(plan, str):
        return f"left as collated, one WARNING: {plan}"
    rows = f", completed to {plan.rows} rows" if plan.rows != 4 else ", no row added" if media & set(case.batch) else ""
    kept = f"; {', '.join(sorted(media & set(case.batch)))} as collated" if media & set(case.batch) else ""
    return f"text padded to {plan.sequence} tokens{rows}{kept}"


def serve_cell(case: FamilyCase) -> str:
    """What continuous batching does with the family."""
    from ..serving import policy as serving

    taken, why = serving.paged_path(serving.ServeFacts(encoder_decoder=bool(case.model.get("encoder_decoder")),
                                                       media=case.media))
    return "the TPU paged path" if taken else f"upstream's manager, one WARNING: {why}"


def family_table() -> str:
    """The markdown table of docs/generation.md's "Vision-language, speech and encoder-decoder models"."""
    lines = ["| family | `generate()` | fine-tuning (`Trainer`) | serving (continuous batching) |", "|---|---|---|---|"]
    for case in FAMILY_CASES:
        lines.append(f"| {case.name} | {generate_cell(case)} | {train_cell(case)} | {serve_cell(case)} |")
    return "\n".join(lines)
