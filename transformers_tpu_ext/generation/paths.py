"""Which path a ``generate()`` call takes, for the docs: what a user writes -> the path, from the policy.

The table of ``docs/generation.md`` ("Which path a call takes") is :func:`path_table`, computed by
the very predicates the generation wrappers call (:mod:`.policy`) over the facts each example gives
(:func:`policy.call_facts`, as the wrappers build them). ``tests/generation/test_generation_paths_table.py``
keeps the docs equal to it, and runs every example through a real ``generate()`` on the simulated TPU
to check that the decisions the wrappers log are the table's. ``python scripts/gen_docs_tables.py``
rewrites the docs from it. Plain data: no torch, no Transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import policy, recurrent

__all__ = ["EXAMPLES", "Example", "Path", "cells", "mode_of", "path_of", "path_table"]

#: The names the docs' markers use around the generated table.
BEGIN = "<!-- generated: transformers_tpu_ext.generation.paths.path_table() -->"
END = "<!-- end of generated table -->"


@dataclass(frozen=True)
class Example:
    """One row: what the user writes, as facts."""

    writes: str  # markdown
    options: Mapping[str, Any] = field(default_factory=dict)  # generation options it sets
    call: Mapping[str, Any] = field(default_factory=dict)  # policy.CallShape fields it changes
    model: Mapping[str, Any] = field(default_factory=dict)  # policy.ModelKind fields it changes
    settings: Mapping[str, bool] = field(default_factory=dict)  # static_cache, bucketing, device_decode
    processors: tuple[str, ...] = ()  # logits processors of the caller's (class names)


@dataclass(frozen=True)
class Path:
    """One row's cells."""

    cache: str
    buckets: str
    loop: str
    masks: str
    why: str


UPSTREAM = "Transformers', untouched"

#: The logits processors upstream builds from the options the examples set (``_get_logits_processor``).
_PROCESSORS = {
    "repetition_penalty": "RepetitionPenaltyLogitsProcessor",
    "guidance_scale": "UnbatchedClassifierFreeGuidanceLogitsProcessor",
    "min_new_tokens": "MinNewTokensLengthLogitsProcessor",
}
_WARPERS = {"temperature": "TemperatureLogitsWarper", "top_k": "TopKLogitsWarper", "top_p": "TopPLogitsWarper", "min_p": "MinPLogitsWarper"}
#: The model inputs a plain call carries between steps.
_MODEL_KWARGS = ("cache", "attention_mask", "position_ids", "use_cache", "logits_to_keep")

_SETTINGS = {"static_cache": True, "bucketing": True, "device_decode": True}

EXAMPLES: tuple[Example, ...] = (
    Example("`generate(ids, attention_mask=mask)`: greedy, no cache argument"),
    Example("`do_sample=True, temperature=0.7, top_k=50, top_p=0.9, min_p=0.05`",
            {"do_sample": True, "temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_p": 0.05}),
    Example("`min_new_tokens=4`", {"min_new_tokens": 4}),
    Example('`cache_implementation="static"`', {"cache_implementation": "static"}),
    Example('`cache_implementation="static", disable_compile=True`', {"cache_implementation": "static", "disable_compile": True}),
    Example("`num_beams=2`", {"num_beams": 2}),
    Example("`num_beams=2, do_sample=True`", {"num_beams": 2, "do_sample": True}),
    Example("`repetition_penalty=1.3` (and the other options that read the sequences or need the host: `no_repeat_ngram_size`, "
            "`bad_words_ids`, `sequence_bias`, `forced_bos_token_id`, `suppress_tokens`, `typical_p`, `epsilon_cutoff`, ...)",
            {"repetition_penalty": 1.3}),
    Example("`do_sample=True, repetition_penalty=1.3`", {"do_sample": True, "repetition_penalty": 1.3}),
    Example("`logits_processor=LogitsProcessorList([MyProcessor()])`", call={"logits_callbacks": True}, processors=("MyProcessor",)),
    Example("`prefix_allowed_tokens_fn=allowed`", call={"logits_callbacks": True}, processors=("PrefixConstrainedLogitsProcessor",)),
    Example("`return_dict_in_generate=True, output_scores=True` (or `output_logits=True`)",
            {"return_dict_in_generate": True, "output_scores": True}),
    Example("`inputs_embeds=embeds`", call={"inputs": "inputs_embeds", "ids_bucketable": False}),
    Example("`position_ids=positions` (or another per-row tensor)", call={"other_batched_inputs": True}),
    Example("`guidance_scale=1.5`", {"guidance_scale": 1.5}),
    Example("`TRANSFORMERS_TPU_EXT_GENERATE_BUCKETS=0`", settings={"bucketing": False}),
    Example("`TRANSFORMERS_TPU_EXT_GENERATE_DEVICE_DECODE=0`", settings={"device_decode": False}),
    Example('`cache_implementation="dynamic"` (or `"offloaded"`, `"quantized"`, `"offloaded_static"`, `"sliding_window"`...)',
            {"cache_implementation": "dynamic"}),
    Example("`past_key_values=cache` (any cache object: one you made, one a previous call returned)", call={"cache_object": True}),
    Example("`use_cache=False`", {"use_cache": False}),
    Example("`disable_compile=True`", {"disable_compile": True}),
    Example('inside `torch.compiler.set_stance("force_eager")`', call={"eager_stance": True}),
    Example("`TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE=0`", settings={"static_cache": False}),
    Example("`token_healing=True`", {"token_healing": True}),
    Example("`return_dict_in_generate=True, output_attentions=True` (or `output_hidden_states=True`)",
            {"return_dict_in_generate": True, "output_attentions": True}),
    Example("`assistant_model=assistant`, `prompt_lookup_num_tokens=3`", call={"mode": "assisted_generation"}),
    Example("`custom_generate=...` (contrastive search, DoLa and the other Hub recipes)", call={"mode": "custom"}),
    Example("a non-text main input (`generate(features)`, floating point)", call={"inputs": "other", "ids_bucketable": False}),
    Example("an encoder-decoder model other than Whisper (T5, BART...; Whisper: the family table below)",
            model={"encoder_decoder": True, "family": "t5"}),
    Example("a model with chunked-attention or shared key/value layers (Llama 4, Gemma 3n...)",
            model={"layer_types": ("chunked_attention", "full_attention")}),
    Example("a state-space or hybrid model (Mamba, Mamba2, Jamba, Falcon-H1, LFM2, Qwen3-Next: see below)",
            model={"layer_types": ("linear_attention",), "accepts_position_ids": False, "recurrent": recurrent.recurrent_path(
                recurrent.RecurrentFacts("mamba", ("linear_attention",), ("MambaMixer",), bias=False, accepts_position_ids=False))}),
    Example("a state-space or hybrid model of another family (Falcon-Mamba, Zamba, Bamba...)",
            model={"layer_types": ("linear_attention",), "accepts_position_ids": False, "recurrent": recurrent.recurrent_path(
                recurrent.RecurrentFacts("falcon_mamba", ("linear_attention",), ("FalconMambaMixer",)))}),
    Example("a model that makes its own cache (RWKV, XLNet, Reformer...)", model={"supports_default_cache": False}),
    Example("a model whose forward takes no `position_ids` (BART's decoder, MPT, BLOOM...)", model={"accepts_position_ids": False}),
    Example("a model that builds its own generation masks (multimodal: Gemma 3, PaliGemma...)", model={"custom_mask_function": True}),
    Example("a model whose attention is not causal (`config.is_causal=False`)", model={"causal": False}),
)


def mode_of(options: Mapping[str, Any]) -> str:
    """The decoding mode Transformers' ``GenerationConfig.get_generation_mode`` gives these options (no assistant)."""
    sample = bool(options.get("do_sample"))
    if int(options.get("num_beams") or 1) > 1:
        return "beam_sample" if sample else "beam_search"
    return "sample" if sample else "greedy_search"


def cells(plan: policy.CallPlan, loop: policy.DecodePath | None, masks: policy.DecodePath | None, mode: str) -> Path:
    """The cells of a row from the decisions (``loop`` is ``None`` for beam search: upstream's loop)."""
    if plan.upstream:
        return Path(UPSTREAM, "—", "—", "—", plan.reason)
    why = []
    cache = "static (the plugin's default)" if plan.static_cache else "static (yours)"
    if plan.bucket:
        buckets = "yes" if plan.pad_batch else "yes, no dummy rows"
    else:
        buckets = "no"
        why.append(plan.reason)
    if mode in policy.DEVICE_MODES and loop is not None:
        decoding = "device" if loop.device else "host (Transformers' loop)"
        if not loop.device:
            why.append(loop.reason)
    else:
        decoding = "Transformers' beam search"
    on_device = masks is not None and masks.device
    if masks is not None and not on_device and masks.reason not in " ".join(why):
        why.append(masks.reason)
    return Path(cache, buckets, decoding, "device" if on_device else "host (Transformers')", "; ".join(why) or "—")


def path_of(example: Example) -> Path:
    """What the policy decides for ``example``."""
    settings = {**_SETTINGS, **example.settings}
    options = dict(example.options)
    shape = policy.CallShape(**{"mode": mode_of(options), **example.call})
    model = policy.ModelKind(**example.model)
    facts = policy.call_facts(options, model, shape, device_decode=settings["device_decode"])
    plan = policy.plan_call(facts, static_cache=settings["static_cache"], bucketing=settings["bucketing"])
    if plan.upstream:
        return cells(plan, None, None, shape.mode)
    processors = [name for option, name in _PROCESSORS.items() if options.get(option) is not None]
    if options.get("do_sample"):
        processors += [name for option, name in _WARPERS.items() if options.get(option) is not None]
    kwargs = _MODEL_KWARGS if model.accepts_position_ids else tuple(k for k in _MODEL_KWARGS if k != "position_ids")
    loop = policy.LoopFacts(
        mode=shape.mode,
        device_decode=settings["device_decode"],
        processors=(*processors, *example.processors),
        model_kwargs=kwargs + (("inputs_embeds",) if shape.inputs == "inputs_embeds" else ()),
        outputs_scores_or_logits=facts.returns_cache and bool(options.get("output_scores") or options.get("output_logits")),
        outputs_attentions_or_states=facts.outputs_attentions_or_states,
        custom_mask_function=model.custom_mask_function,
        causal=model.causal,
    )
    decoding = policy.decode_path(loop) if shape.mode in policy.DEVICE_MODES else None
    return cells(plan, decoding, policy.mask_path(loop), shape.mode)


def path_table() -> str:
    """The markdown table of docs/generation.md: one row per :data:`EXAMPLES` entry."""
    lines = [
        "| what you write | KV cache | padded to buckets | decoding loop | 4D attention masks | why |",
        "|---|---|---|---|---|---|",
    ]
    for example in EXAMPLES:
        path = path_of(example)
        lines.append(f"| {example.writes} | {path.cache} | {path.buckets} | {path.loop} | {path.masks} | {path.why} |")
    return "\n".join(lines)
