"""Which path an inference call takes, as ``docs/inference.md`` shows it: a table rendered from the predicate.

Each case is plain data (a model's facts, a call's input shapes and options); its row runs
:func:`transformers_tpu_ext.inference.policy.plan_call` and says what happens on TPU and why.
``tests/inference/test_inference_paths.py`` re-renders the page's table and fails when the page and
the code disagree. To rewrite the page::

    python -m transformers_tpu_ext.inference.paths docs/inference.md
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..training.paths import render_blocks, update_page
from .compile_policy import CompileFacts, compile_path
from .media import MediaFacts, plan_media_call
from .policy import PATIENCE, CallPlan, ModelFacts, plan_call

__all__ = ["CASES", "COMPILE_CASES", "MEDIA_CASES", "CallCase", "call_table", "compile_table", "media_table", "render",
           "update"]

_BERT = ModelFacts(task="sequence_classification", pooling="first", pad_token_id=0, max_positions=512)
_DECODER = ModelFacts(task="sequence_classification", causal=True, pooling="last_non_pad", pad_token_id=0,
                      max_positions=40960, returns_cache=True)


def _text(rows: int = 3, length: int = 20, mask: bool = True, types: bool = False) -> dict[str, tuple[int, ...]]:
    shapes = {"input_ids": (rows, length)}
    if mask:
        shapes["attention_mask"] = (rows, length)
    if types:
        shapes["token_type_ids"] = (rows, length)
    return shapes


@dataclass(frozen=True)
class CallCase:
    """A model, a call and who reads its outputs (``pipeline``: a pipeline, which never reads a KV cache)."""

    what: str
    model: ModelFacts | MediaFacts
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=_text)
    options: Mapping[str, Any] = field(default_factory=dict)
    pipeline: bool = True
    used: tuple[int, ...] = ()


def _m(base: ModelFacts, **change: Any) -> ModelFacts:
    from dataclasses import replace

    return replace(base, **change)


CASES: tuple[CallCase, ...] = (
    CallCase("BERT-like classifier (text-classification, zero-shot): pools `[CLS]`", _BERT, _text(types=True)),
    CallCase("4 texts of 12 tokens after batches of 48 (zero-shot: a batch of a few short texts)", _BERT,
             _text(rows=4, length=12), used=(48,)),
    CallCase("token classification, fill-mask: per-position logits", _m(_BERT, task="token_classification", pooling="none")),
    CallCase("feature extraction, sentence embeddings: hidden states, pooled afterwards under the mask",
             _m(_BERT, task="base", pooling="none")),
    CallCase("decoder classifier (reward model): pools the last non-pad token", _DECODER),
    CallCase("decoder classifier, `model(**batch)` in your loop", _DECODER, pipeline=False),
    CallCase("decoder classifier, `model(**batch, use_cache=False)` in your loop", _DECODER,
             options={"use_cache": False}, pipeline=False),
    CallCase("causal LM log-likelihoods, `model(input_ids, use_cache=False)` by name", _m(_DECODER, task="causal_lm", pooling="none"),
             _text(mask=False), {"use_cache": False}, pipeline=False),
    CallCase("decoder classifier without a pad token", _m(_DECODER, pad_token_id=None)),
    CallCase("BERT, a batch without `attention_mask`", _BERT, _text(mask=False)),
    CallCase("an encoder that takes no `attention_mask`", _m(_BERT, accepts=frozenset({"input_ids"})), _text(mask=False)),
    CallCase("texts longer than an absolute position table (512)", _BERT, _text(length=600)),
    CallCase("RoPE `dynamic`, `longrope`, `yarn`, `llama3`...", _m(_DECODER, rope_type="dynamic")),
    CallCase("a classifier whose pooling is not known (XLNet: the last position)", _m(_BERT, pooling="unknown")),
    CallCase("a mixture-of-experts model", _m(_DECODER, experts=True)),
    CallCase("an encoder-decoder (T5, BART)", _m(_BERT, encoder_decoder=True)),
    CallCase("a model in training mode", _m(_BERT, training=True)),
    CallCase("`inputs_embeds` instead of `input_ids`", _BERT, {"inputs_embeds": (3, 20, 32), "attention_mask": (3, 20)}),
    CallCase("an input with no known padding (`bbox`, `pixel_values`...)", _BERT, {**_text(), "bbox": (3, 20, 4)}),
    CallCase("`output_attentions=True`", _BERT, options={"output_attentions": True}),
    CallCase("not a model of a known task", ModelFacts()),
)


def _padded(plan: CallPlan) -> str:
    text = f"padded to {plan.rows} x {plan.length}, outputs cut back to {plan.original_rows} x {plan.original_length}"
    if plan.deferred is not None:
        times = "once" if PATIENCE == 1 else f"{PATIENCE} times"
        text += f", a length already run ({times} per length; then its own, {plan.deferred})"
    if plan.add_mask:
        text += "; a mask added"
    if plan.no_cache:
        text += "; `use_cache=False`"
    return text


def call_table(cases: Sequence[CallCase] = CASES) -> str:
    """The markdown table of what a call of 3 rows of 20 tokens becomes on TPU (default ladders)."""
    lines = ["| what you run | on TPU | why |", "|---|---|---|"]
    for case in cases:
        plan = plan_call(case.shapes, case.model, options=case.options, drop_cache=case.pipeline, used=case.used)
        if isinstance(plan, str):
            lines.append(f"| {case.what} | as it is | {plan} |")
        else:
            lines.append(f"| {case.what} | {_padded(plan)} | nothing reads the padding |")
    return "\n".join(lines)


_VIT = MediaFacts(task="image_classification", family="vit", accepts=frozenset({"pixel_values"}))
_WAV2VEC2 = MediaFacts(task="audio_classification", family="wav2vec2", feat_extract_norm="layer",
                       conv_kernel=(10, 3, 3, 3, 3, 2, 2), conv_stride=(5, 2, 2, 2, 2, 2, 2),
                       accepts=frozenset({"input_values", "attention_mask"}))
_IMAGES = {"pixel_values": (3, 3, 224, 224)}
_CLIPS = {"input_values": (3, 20000), "attention_mask": (3, 20000)}

#: Image and audio classifier calls (``media.plan_media_call``): 3 images of 224 x 224, or 3 clips of 20,000 samples.
MEDIA_CASES: tuple[CallCase, ...] = (
    CallCase("image classification (ViT, ConvNeXt, ResNet...): 3 images resized to 224 x 224", _VIT, _IMAGES),
    CallCase("image classification, another input (`bool_masked_pos`, `pixel_mask`...)", _VIT,
             {**_IMAGES, "pixel_mask": (3, 224, 224)}),
    CallCase("audio classification, wav2vec2 / HuBERT with `feat_extract_norm=\"layer\"` and a mask", _WAV2VEC2, _CLIPS),
    CallCase("the same without a mask (the feature extractor's default)", _WAV2VEC2, {"input_values": (3, 20000)}),
    CallCase("wav2vec2 / HuBERT with `feat_extract_norm=\"group\"` (wav2vec2-base)", _m(_WAV2VEC2, feat_extract_norm="group"),
             _CLIPS),
    CallCase("wav2vec2 with an adapter (`add_adapter=True`)", _m(_WAV2VEC2, adapter=True), _CLIPS),
    CallCase("a clip shorter than one frame (300 samples)", _WAV2VEC2, {"input_values": (3, 300)}),
    CallCase("`output_hidden_states=True` (per frame)", _WAV2VEC2, _CLIPS, {"output_hidden_states": True}),
    CallCase("Whisper's audio classifier: log-mel `input_features`, every clip padded to 30 s", _m(_WAV2VEC2, family="whisper"),
             {"input_features": (3, 80, 3000)}),
    CallCase("other audio families (WavLM, Data2VecAudio, AST...)", _m(_WAV2VEC2, family="wavlm"), _CLIPS),
    CallCase("an image classifier in training mode", _m(_VIT, training=True), _IMAGES),
)


def media_table(cases: Sequence[CallCase] = MEDIA_CASES) -> str:
    """The markdown table of what an image or audio classifier's call becomes on TPU (default ladders)."""
    lines = ["| what you run | on TPU | why |", "|---|---|---|"]
    for case in cases:
        plan = plan_media_call(case.shapes, case.model, options=case.options)  # type: ignore[arg-type]
        if isinstance(plan, str):
            lines.append(f"| {case.what} | as it is | {plan} |")
        elif plan.length == plan.original_length and not plan.add_mask:
            lines.append(f"| {case.what} | rows padded to {plan.rows}, outputs cut back to {plan.original_rows} | "
                         "rows are independent in evaluation |")
        else:
            mask = "; a mask added" if plan.add_mask else ""
            lines.append(f"| {case.what} | padded to {plan.rows} x {plan.length} samples, outputs cut back to "
                         f"{plan.original_rows}{mask} | the real samples' frames are unchanged, the padded ones masked |")
    return "\n".join(lines)


@dataclass(frozen=True)
class CompileCase:
    """A padded call and what :func:`.compile_policy.compile_path` reads off it."""

    what: str
    facts: CompileFacts


#: Padded calls and whether their forward runs as one compiled program (``compile_policy.compile_path``).
COMPILE_CASES: tuple[CompileCase, ...] = (
    CompileCase("a padded call of a pipeline, `bucketed(model)` under `torch.no_grad()`, `encode()`, lm-eval", CompileFacts()),
    CompileCase("the same with `output_hidden_states=True`", CompileFacts(options=frozenset({"output_hidden_states"}))),
    CompileCase("a call the predicate above does not pad (a new shape each time)", CompileFacts(padded=False)),
    CompileCase("`bucketed(model, compile=False)`", CompileFacts(enabled=False)),
    CompileCase('inside `torch.compiler.set_stance("force_eager")`', CompileFacts(eager_stance=True)),
    CompileCase("inside your own `torch.compile`'d function", CompileFacts(compiling=True)),
    CompileCase("a PEFT, DDP or `torch.compile` wrapper around the model", CompileFacts(wrapper="PeftModel")),
    CompileCase("a model offloaded by Accelerate (its forward replaced by hooks)", CompileFacts(forward_replaced=True)),
    CompileCase("a forward hook of yours on the model or a layer", CompileFacts(hooks=1)),
    CompileCase("`bucketed(model)` without `torch.no_grad()`, parameters requiring grad", CompileFacts(grad=True)),
    CompileCase("another option (`labels`, `head_mask`...) as a Python value", CompileFacts(options=frozenset({"head_mask"}))),
    CompileCase("a forward that breaks the graph (data-dependent Python control flow)",
                CompileFacts(graph_break="Unsupported: generic_jump: data-dependent branching")),
)


def compile_table(cases: Sequence[CompileCase] = COMPILE_CASES) -> str:
    """The markdown table of which padded calls run compiled (``compile_policy.compile_path``)."""
    lines = ["| padded call | forward | why |", "|---|---|---|"]
    for case in cases:
        reason = compile_path(case.facts)
        if reason is None:
            lines.append(f"| {case.what} | one compiled program per bucket | the model's own forward, no grad |")
        else:
            lines.append(f"| {case.what} | op by op (padded all the same) | {reason} |")
    return "\n".join(lines)


_TABLES = {"inference-calls": call_table, "media-calls": media_table, "compiled-calls": compile_table}


def render(text: str) -> str:
    """``text`` with the inference table re-rendered (``training.paths.render_blocks``)."""
    return render_blocks(text, _TABLES)


def update(path: str) -> bool:
    """Rewrite the generated table of the page at ``path``; returns whether it changed."""
    return update_page(path, render)


if __name__ == "__main__":  # pragma: no cover - a maintainer's command
    for page in sys.argv[1:] or ["docs/inference.md"]:
        print(f"{page}: {'updated' if update(page) else 'up to date'}")
