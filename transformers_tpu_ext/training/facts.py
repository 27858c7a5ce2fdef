"""The plain facts the batch predicate needs, read off a model, a collator and a Trainer.

:func:`transformers_tpu_ext.training.buckets.plan_batch` decides from plain data
(:class:`~transformers_tpu_ext.training.buckets.ModelFacts`, :class:`~transformers_tpu_ext.training.buckets.SourceFacts`);
this module reads them off the objects: the model's task (Transformers' own task mappings), whether
its attention is causal (its attention layers' ``is_causal``), its position tables, what its
forward takes; the collator and the Trainer's loss and evaluation hooks. Anything it does not
recognise reads as unknown, and the predicate leaves such batches alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.length_readers import model_lengths
from . import buckets as batch_buckets

__all__ = ["POOLS_FIRST_TOKEN", "model_facts", "packs", "source_facts", "unwrap"]

#: Encoder families whose sequence classifier pools the first token (or a mean under the mask):
#: padding on the right with a mask cannot reach what they pool. Other bidirectional classifiers
#: (XLNet pools the last position) are not known. Decoder-only classifiers pool the last token that
#: is not the config's pad token (``ModelFacts.pools_last_token``).
POOLS_FIRST_TOKEN: frozenset[str] = frozenset(
    {"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "albert", "electra", "deberta", "deberta-v2", "modernbert"}
)

#: The Trainer methods whose upstream version the predicate relies on, by the class defining them.
_UPSTREAM_PREDICTION_STEP = {"transformers.trainer.Trainer", "transformers.trainer_seq2seq.Seq2SeqTrainer"}
_UPSTREAM_COMPUTE_LOSS = {"transformers.trainer.Trainer"}


def unwrap(model: Any) -> Any:
    """The Transformers model under DDP, ``torch.compile`` and PEFT wrappers."""
    seen: set[int] = set()
    while id(model) not in seen:
        seen.add(id(model))
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None and hasattr(model, "get_base_model"):
            inner = model.get_base_model()
        if inner is None:
            break
        model = inner
    return model


def _names(mapping: Mapping[str, Any]) -> set[str]:
    names: set[str] = set()
    for value in mapping.values():
        names.update(value if isinstance(value, (tuple, list)) else [value])
    return names


def _causal(model: Any) -> bool:
    flags = [m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)]
    return bool(flags) and all(flags)


def _unknown_recurrent(model: Any) -> str | None:
    """``ModelFacts.unknown_recurrent``: the ``model_type`` of recurrent layers of a family not known, else ``None``."""
    from ..generation.recurrent import FAMILIES, RECURRENT_LAYER_TYPES
    from ..generation.static_cache import text_layer_types

    if not hasattr(getattr(model, "config", None), "get_text_config") or not set(text_layer_types(model)) & RECURRENT_LAYER_TYPES:
        return None
    model_type = str(getattr(model.config.get_text_config(decoder=True), "model_type", ""))
    family = FAMILIES.get(model_type)
    if family is not None and any(type(m).__name__ == family.mixer for m in model.modules()):
        return None
    return model_type or type(model).__name__


def _accepts(model: Any, name: str) -> bool:
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return name in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def _first_int(config: Any, names: Iterable[str]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_facts(model: Any) -> batch_buckets.ModelFacts:
    """The :class:`~transformers_tpu_ext.training.buckets.ModelFacts` of ``model`` (wrappers seen through)."""
    from transformers import PreTrainedModel
    from transformers.models.auto import modeling_auto as auto

    base = unwrap(model)
    if not isinstance(base, PreTrainedModel):
        return batch_buckets.ModelFacts(known=False)
    config = base.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    name = type(base).__name__
    per_token = name in (
        _names(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
        | _names(auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
        | _names(auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
        | _names(auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES)
    )
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    causal = not encoder_decoder and _causal(base)
    classifier = name in _names(auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)
    pools_last = classifier and causal
    known = per_token or pools_last or (classifier and getattr(config, "model_type", None) in POOLS_FIRST_TOKEN)
    positions = ("n_positions", "max_position_embeddings")
    pad = getattr(text, "pad_token_id", None)
    return batch_buckets.ModelFacts(
        known=known,
        causal=causal,
        encoder_decoder=encoder_decoder,
        per_token_labels=per_token,
        pools_last_token=pools_last,
        pad_token_id=pad if isinstance(pad, int) and not isinstance(pad, bool) else None,
        max_positions=_first_int(text, ("max_source_positions", *positions) if encoder_decoder else positions),
        max_decoder_positions=_first_int(text, ("max_target_positions", *positions)) if encoder_decoder else None,
        accepts_attention_mask=_accepts(model, "attention_mask"),
        unknown_recurrent=_unknown_recurrent(base),
        extra_outputs=any(bool(getattr(text, k, False)) for k in ("output_hidden_states", "output_attentions", "output_router_logits")),
        aux_loss=bool(getattr(text, "output_router_logits", False)),
        lengths=model_lengths(base),
    )


def _defined_by(instance: Any, method: str) -> str:
    for cls in type(instance).__mro__:
        if method in vars(cls):
            return f"{cls.__module__}.{cls.__qualname__}"
    return ""


def _inner_collator(collate: Any) -> Any:
    seen: set[int] = set()
    while id(collate) not in seen and hasattr(collate, "data_collator"):  # the Trainer's RemoveColumnsCollator
        seen.add(id(collate))
        collate = collate.data_collator
    return collate


def packs(collate: Any) -> bool:
    """Whether the collator packs sequences into rows told apart by ``position_ids``."""
    return any(cls.__name__ == "DataCollatorWithFlattening" for cls in type(_inner_collator(collate)).__mro__)


def known_loss(trainer: Any) -> Any:
    """:func:`transformers_tpu_ext.training.losses.library_loss` of ``trainer`` (TRL's trainers), read off it."""
    from . import losses

    defined_by = _defined_by(trainer, "compute_loss")
    if defined_by not in losses.KNOWN_LOSSES:
        return losses.library_loss(defined_by, version=None)
    changed = _loss_helpers_of_your_own(trainer)
    if changed:
        return f"{type(trainer).__name__} overrides {changed}: a loss of your own"
    try:
        from importlib.metadata import version

        found = version(defined_by.split(".", 1)[0])
    except Exception:  # noqa: BLE001 - not installed as a distribution: unknown
        found = None
    args = trainer.args
    options = {name: getattr(args, name, None) for name in ("loss_type", "use_liger_kernel", "use_weighting")}
    return losses.library_loss(
        defined_by, version=found, compute_loss_func=getattr(trainer, "compute_loss_func", None) is not None, options=options
    )


#: Words in the names of the methods a library trainer computes its loss with (DPO's ``dpo_loss``,
#: ``concatenated_forward``, ``get_batch_loss_metrics``; SFT's ``compute_loss``; a ``training_step``).
_LOSS_WORDS = ("loss", "forward", "logits", "training_step")


def _loss_helpers_of_your_own(trainer: Any) -> str | None:
    """The first loss helper a class of the user's (below the library's in the MRO) defines, or ``None``."""
    for cls in type(trainer).__mro__:
        if cls.__module__.split(".", 1)[0] == "trl":
            return None
        for name, value in vars(cls).items():
            if callable(value) and any(word in name for word in _LOSS_WORDS):
                return f"{cls.__name__}.{name}"
    return None


def _known_trainers() -> Any:
    from . import losses

    return losses.KNOWN_LOSSES


def source_facts(trainer: Any, collate: Any, training: bool) -> batch_buckets.SourceFacts:
    """The :class:`~transformers_tpu_ext.training.buckets.SourceFacts` of a Trainer data loader."""
    args = trainer.args
    upstream = _defined_by(trainer, "compute_loss") in _UPSTREAM_COMPUTE_LOSS
    library = None if upstream else known_loss(trainer)
    known = library is not None and not isinstance(library, str)
    if isinstance(library, str) and _defined_by(trainer, "compute_loss") in _known_trainers():
        from ..core.wrapping import warn_once

        warn_once(f"batches left as the collator made them: {library}")
    return batch_buckets.SourceFacts(
        training=training,
        packed=packs(collate),
        generates=not training and bool(getattr(args, "predict_with_generate", False)),
        custom_loss=(not upstream and not known) or (upstream and getattr(trainer, "compute_loss_func", None) is not None),
        cuts_outputs=_defined_by(trainer, "prediction_step") in _UPSTREAM_PREDICTION_STEP,
        returns_inputs="inputs" in (getattr(args, "include_for_metrics", None) or ()),
        keeps_rows=known,
        neftune=getattr(args, "neftune_noise_alpha", None) is not None,
    )


def grpo_facts(trainer: Any) -> Any:
    """The :class:`~transformers_tpu_ext.training.grpo.GRPOFacts` of a TRL ``GRPOTrainer``."""
    from . import grpo

    args = trainer.args
    if getattr(trainer, "use_vllm", False):
        generation = "vllm"
    elif getattr(trainer, "use_transformers_continuous_batching", False):
        generation = "continuous_batching"
    elif getattr(trainer, "rollout_func", None) is not None:
        generation = "rollout_func"
    else:
        generation = "generate"
    config = getattr(trainer, "generation_config", None)
    stops = getattr(config, "eos_token_id", None)
    stops = [] if stops is None else [stops] if isinstance(stops, int) else list(stops)
    other = tuple(name for name in ("stop_strings", "max_time") if getattr(config, name, None) is not None)
    base = unwrap(trainer.model)
    facts = model_facts(trainer.model)
    from transformers.models.auto import modeling_auto as auto

    causal_lm = facts.known and facts.causal and type(base).__name__ in _names(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    multiple = getattr(trainer, "pad_to_multiple_of", None)
    return grpo.GRPOFacts(
        loss=known_loss(trainer),
        # generate() makes at most the generation config's max_new_tokens (generation_kwargs may change it)
        max_completion_length=getattr(config, "max_new_tokens", None) or getattr(trainer, "max_completion_length", None),
        generation=generation,
        tools=bool(getattr(trainer, "tools", None)) or getattr(trainer, "environment_factories", None) is not None,
        vision=bool(getattr(trainer, "_is_vlm", False)),
        aux_loss=bool(getattr(trainer, "aux_loss_enabled", False)),
        top_entropy_quantile=float(getattr(trainer, "top_entropy_quantile", getattr(args, "top_entropy_quantile", 1.0))),
        stop_tokens=set(stops) <= set(getattr(trainer, "eos_token_ids", None) or ()),
        other_stops=other,
        pad_to_multiple_of=multiple if isinstance(multiple, int) and not isinstance(multiple, bool) else None,
        causal_lm=causal_lm,
        lengths=facts.lengths,
        cache_implementation=getattr(config, "cache_implementation", None),
        position_readers=_position_readers(getattr(base, "config", None)),
    )


def _position_readers(config: Any) -> tuple[str, ...]:
    """What in a model's config reads absolute positions besides its position embeddings."""
    configs = [config, getattr(config, "text_config", None)]
    if any(getattr(c, "attn_temperature_tuning", False) for c in configs if c is not None):
        return ("Llama 4's attn_temperature_tuning (queries scaled by the position in its layers without rotary embeddings)",)
    return ()
