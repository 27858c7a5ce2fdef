"""Batch inference on TPU: pipelines and ``model(**batch)`` loops at a few static shapes (docs/inference.md).

- ``policy``: which calls may be padded to a bucket and cut back (``plan_call``, the "safe when"
  predicate over plain facts), which output fields are per position (``cut_fields``); pure.
- ``paths``: docs/inference.md's table, computed from the predicate.
- ``facts``: the predicate's facts read off a model (task, causality, pooling, positions, RoPE).
- ``runtime``: ``bucketed(model)``, the opt-in API for a user's own loop, and the object the
  ``pipeline_buckets`` patch puts under every pipeline's forward on TPU.
"""

from __future__ import annotations

from typing import Any

__all__ = ["bucketed"]


def bucketed(model: Any, **options: Any) -> Any:
    """See :func:`transformers_tpu_ext.inference.runtime.bucketed`."""
    from .runtime import bucketed as _bucketed

    return _bucketed(model, **options)
