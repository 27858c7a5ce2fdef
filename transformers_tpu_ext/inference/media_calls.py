"""Image and audio classifiers' calls at a few static shapes: :class:`~.runtime.Bucketed` planned by
:func:`.media.plan_media_call`, from facts read off the model (:func:`media_facts`).

The ``pipeline_buckets`` patch puts it under the image- and audio-classification pipelines' forward
on TPU. Rows are padded with copies of the first row and an audio batch's samples with zeros under
an attention mask; every output field is cut back to the caller's rows (the fields of these tasks are
per row: logits, and pooled outputs; per-frame ones are never asked for on a padded call).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ..training.facts import unwrap
from . import media, policy
from .runtime import Bucketed, _cut

__all__ = ["MediaCalls", "media_facts"]

_MAPPINGS = (
    ("image_classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("audio_classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"),
)
_EXPERT_KEYS = ("num_experts", "num_local_experts", "moe_num_experts", "n_routed_experts")


def _task(name: str) -> str | None:
    from transformers.models.auto import modeling_auto as auto

    for task, mapping in _MAPPINGS:
        for value in getattr(auto, mapping, {}).values():
            if name in (value if isinstance(value, (tuple, list)) else [value]):
                return task
    return None


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, (tuple, list)) else ()


def media_facts(model: Any) -> media.MediaFacts:
    """The :class:`~.media.MediaFacts` of ``model`` (wrappers seen through); unknown models: all unknown."""
    from transformers import PreTrainedModel

    base = unwrap(model)
    if not isinstance(base, PreTrainedModel):
        return media.MediaFacts()
    config = base.config
    try:
        accepts = frozenset(k for k in media.MEDIA_PADDING if k in inspect.signature(base.forward).parameters)
    except (TypeError, ValueError):
        accepts = frozenset()
    return media.MediaFacts(
        task=_task(type(base).__name__),
        family=getattr(config, "model_type", None),
        feat_extract_norm=getattr(config, "feat_extract_norm", None),
        conv_kernel=_ints(getattr(config, "conv_kernel", ())),
        conv_stride=_ints(getattr(config, "conv_stride", ())),
        adapter=bool(getattr(config, "add_adapter", False)),
        accepts=accepts,
        experts=any(isinstance(getattr(config, k, None), int) and getattr(config, k) > 0 for k in _EXPERT_KEYS),
        training=bool(base.training),
    )


class MediaCalls(Bucketed):
    """:class:`~.runtime.Bucketed` for an image or audio classifier (``pixel_values`` / ``input_values``)."""

    padding = media.MEDIA_PADDING
    lead = "input_values"
    mask_dtype = "int32"  # as the feature extractors make it (half the bytes of a long mask)

    def __init__(self, model: Any, **options: Any) -> None:
        super().__init__(model, **options)
        self.facts = media_facts(model)
        self.ladder = tuple(options.get("ladder") or ()) or media.audio_ladder()

    def _decide(self, shapes: dict, dtypes: dict, options: dict, positional: int) -> policy.CallPlan | str:
        return media.plan_media_call(shapes, self.facts, ladder=self.ladder, used=self.used, used_rows=self.used_rows,
                                     reuse=self.reuse, dtypes=dtypes, options=options, positional=positional)

    def _after(self, module: Any, args: tuple, kwargs: dict, output: Any) -> Any:
        if not getattr(self._local, "active", 0):
            return output
        stack = self._stack()
        plan = stack.pop() if stack else None
        if plan is None or isinstance(plan, str) or not isinstance(output, Mapping):
            return output
        for key in list(output.keys()):
            output[key] = _cut(output[key], plan, positions=False)
        return output
