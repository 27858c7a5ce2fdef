"""Batch inference on TPU: pipelines and ``model(**batch)`` loops at a few static shapes (docs/inference.md).

- ``policy``: which calls may be padded to a bucket and cut back (``plan_call``, the "safe when"
  predicate over plain facts), which output fields are per position (``cut_fields``); pure.
- ``paths``: docs/inference.md's table, computed from the predicate.
- ``facts``: the predicate's facts read off a model (task, causality, pooling, positions, RoPE).
- ``runtime``: ``bucketed(model)``, the opt-in API for a user's own loop, and the object the
  ``pipeline_buckets`` patch puts under every pipeline's forward on TPU.
- ``encoders``: the same around a sentence-transformers model's whole forward (``encode()``).
- ``media``: which image and audio classifier calls are padded (``plan_media_call``: image rows,
  wav2vec2/HuBERT samples under a mask, Whisper rows); pure. ``media_calls``: its facts and glue.
- patches: ``pipeline_buckets`` (every pipeline's forward), ``lm_eval_hf`` (lm-eval's ``HFLM``: its
  bookkeeping on the host, its forward passes bucketed), ``sentence_transformers_encode`` (``encode()``
  of a model on the TPU runs inside ``bucketed(model)``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["bucketed"]


def bucketed(model: Any, **options: Any) -> Any:
    """Run ``model(**batch)`` calls at a few static shapes on TPU, with the unpadded results (see
    :func:`transformers_tpu_ext.inference.runtime.bucketed`). A sentence-transformers
    ``SentenceTransformer`` is padded around its whole forward, pooling included (:mod:`.encoders`)."""
    from . import runtime

    if any(cls.__module__.startswith("sentence_transformers.") for cls in type(model).__mro__):
        from .encoders import SentenceTransformerCalls

        ladder = tuple(options.pop("ladder", ())) or runtime.policy.sequence_ladder()
        return runtime.for_model(model, ladder=ladder, kind=SentenceTransformerCalls, **options)
    return runtime.bucketed(model, **options)
