"""State-space and hybrid models in a handled ``generate()``: the facts :mod:`.recurrent` decides from,
and the shapes it allows (glue, imported when a call needs it).

- :func:`model_path`: ``recurrent.recurrent_path`` over the facts read off a model (its config's
  ``model_type`` and layer types, Transformers' own mixer classes among its modules, the family's
  bias field, what its forward takes); a model with recurrent layers the predicate does not
  recognise is named once at WARNING by the call's plan (``policy.plan_call``).
- :func:`shapes`: a bucketed call's shapes for such a model: its prompt padded to a bucket only
  where the predicate proved the padding invisible, in one piece where its scan cannot continue a
  chunked prefill (a rung of ``recurrent.whole_prompt_ladder``).
- :func:`warmup_prompts`: the padded prompt lengths ``warmup()`` compiles for it.

The recurrent states themselves are Transformers' ``LinearAttentionLayer``s of the ``StaticCache``
generate() makes (fixed shapes, written in place): the plugin adds no cache class of its own.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from . import buckets, recurrent

__all__ = ["model_path", "shapes", "warmup_prompts"]

logger = logging.getLogger("transformers_tpu_ext")


def facts(model: Any, layer_types: tuple[str, ...]) -> recurrent.RecurrentFacts:
    """:class:`recurrent.RecurrentFacts` of ``model`` (``layer_types``: its text layers, as its caches read them)."""
    config = model.config.get_text_config(decoder=True)
    model_type = str(getattr(config, "model_type", ""))
    family = recurrent.FAMILIES.get(model_type)
    home = f"transformers.models.{model_type}."
    names = tuple(sorted({type(m).__name__ for m in model.modules() if type(m).__module__.startswith(home)}))
    bias = getattr(config, family.bias, None) if family is not None and family.bias else None
    parameters = inspect.signature(model.forward).parameters
    return recurrent.RecurrentFacts(
        model_type=model_type,
        layer_types=layer_types,
        upstream_modules=names,
        bias=bias if isinstance(bias, bool) else None if bias is None else True,
        accepts_position_ids="position_ids" in parameters,
        accepts_attention_mask="attention_mask" in parameters,
    )


def model_path(model: Any, layer_types: tuple[str, ...]) -> recurrent.RecurrentPath | None:
    """The model's ``recurrent.recurrent_path`` (``None``: no recurrent layers). A model left to upstream is named
    once at WARNING by the call's plan (``policy.plan_call``: its reason, ``call.warn_unaccelerated``)."""
    if not set(layer_types) & recurrent.RECURRENT_LAYER_TYPES:
        return None
    return recurrent.recurrent_path(facts(model, layer_types))


def shapes(path: recurrent.RecurrentPath, settings: Any, plan: buckets.Plan, length: int, min_padding: int,
           caller_chunk: int | None) -> tuple[buckets.Plan, int | None]:
    """The shapes of a bucketed call of a model with recurrent layers, and its prefill chunk (``None``:
    the prefill is Transformers', uncompiled). ``plan`` is the attention models' plan, ``length`` the
    prompt's columns, ``caller_chunk`` the caller's ``prefill_chunk_size``."""
    if not path.pad_prompt or (not path.chunked_prefill and caller_chunk is not None):
        # Batch and cache buckets only: the prompt as given, prefilled as Transformers does.
        return buckets.Plan(plan.batch, length, length, plan.cache), None
    if path.chunked_prefill:
        return plan, plan.chunk
    prompt = buckets.prompt_bucket(length + min_padding, recurrent.whole_prompt_ladder(settings.steps_per_octave), None)
    return buckets.Plan(plan.batch, prompt, prompt, plan.cache), prompt


def warmup_prompts(model: Any, max_prompt_length: int, settings: Any) -> list[int] | None:
    """The padded prompt lengths ``warmup()`` runs for ``model`` when it has recurrent layers (``None``: not such a model)."""
    from .static_cache import text_layer_types

    path = model_path(model, text_layer_types(model))
    if path is None or not path.handled or path.chunked_prefill or not path.pad_prompt:
        return None  # the attention models' lengths (an unpadded prompt's prefill is its own anyway)
    ladder = recurrent.whole_prompt_ladder(settings.steps_per_octave)
    return buckets.warmup_prompts(max_prompt_length, ladder, None)

