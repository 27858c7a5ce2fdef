"""The plain facts :func:`.policy.plan_call` needs, read off a model.

The model's task comes from Transformers' own task mappings (the class name), its causality from
its attention layers' ``is_causal`` flags, its pooling from the task and the family, its position
table, RoPE type and router from the config. Anything not recognised reads as unknown, and the
predicate leaves such calls unpadded.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..training.facts import POOLS_FIRST_TOKEN, unwrap
from . import policy

__all__ = ["model_facts", "rope_types"]

_MAPPINGS = (
    ("sequence_classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    ("token_classification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    ("masked_lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("question_answering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    ("causal_lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("base", "MODEL_MAPPING_NAMES"),
)
_EXPERT_KEYS = ("num_experts", "num_local_experts", "moe_num_experts", "n_routed_experts")


def _names(mapping: Any) -> set[str]:
    names: set[str] = set()
    for value in mapping.values():
        names.update(value if isinstance(value, (tuple, list)) else [value])
    return names


def _task(name: str) -> str | None:
    from transformers.models.auto import modeling_auto as auto

    for task, mapping in _MAPPINGS:
        if name in _names(getattr(auto, mapping, {})):
            return task
    return None


def rope_types(config: Any) -> set[str | None]:
    """Every RoPE type of ``config`` (``rope_parameters``, per layer type or not; ``rope_scaling`` before)."""
    found: set[str | None] = set()
    for name in ("rope_parameters", "rope_scaling"):
        value = getattr(config, name, None)
        if not isinstance(value, dict):
            continue
        groups = [v for v in value.values() if isinstance(v, dict)] or [value]
        for group in groups:
            kind = group.get("rope_type", group.get("type"))
            found.add(kind if isinstance(kind, str) else None)
    return found or {None}


def _accepts(model: Any) -> frozenset[str]:
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return frozenset()
    return frozenset(k for k in policy.PADDING if k in parameters)


def _causal(model: Any) -> bool:
    flags = [m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)]
    return bool(flags) and all(flags)


def _positive(config: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_facts(model: Any) -> policy.ModelFacts:
    """The :class:`~.policy.ModelFacts` of ``model`` (DDP, ``torch.compile`` and PEFT wrappers seen through)."""
    from transformers import PreTrainedModel

    base = unwrap(model)
    if not isinstance(base, PreTrainedModel):
        return policy.ModelFacts()
    config = base.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    task = _task(type(base).__name__)
    causal = _causal(base)
    family = getattr(config, "model_type", None)
    if task == "sequence_classification":
        pooling = "last_non_pad" if causal else ("first" if family in POOLS_FIRST_TOKEN else "unknown")
    elif task == "base":
        pooling = "none" if causal or family in POOLS_FIRST_TOKEN else "unknown"  # BERT's pooler reads [CLS]
    else:
        pooling = "none"
    rope = sorted(rope_types(text), key=str)
    unsafe = [r for r in rope if r not in policy.SAFE_ROPE]
    pad = getattr(text, "pad_token_id", None)
    return policy.ModelFacts(
        task=task,
        causal=causal,
        encoder_decoder=bool(getattr(config, "is_encoder_decoder", False)),
        pooling=pooling,
        pad_token_id=pad if isinstance(pad, int) and not isinstance(pad, bool) else None,
        max_positions=_positive(text, ("n_positions", "max_position_embeddings")),
        rope_type=unsafe[0] if unsafe else None,
        accepts=_accepts(base),
        experts=any(_positive(text, (k,)) for k in _EXPERT_KEYS),
        training=bool(base.training),
        returns_cache=causal and bool(getattr(text, "use_cache", False)),
    )
