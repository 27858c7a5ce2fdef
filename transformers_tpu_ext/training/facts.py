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

__all__ = ["POOLS_FIRST_TOKEN", "declared", "model_facts", "packs", "source_facts", "unwrap"]

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
    media = _media_keys(base, name, auto)
    per_token = bool(media) or name in (
        _names(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
        | _names(auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
        | _names(auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
        | _names(auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES)
    )
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    # A vision-language model's text decoder (its vision tower attends both ways, inside each image).
    causal = not encoder_decoder and _causal(base.get_decoder() if media else base)
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
        media_keys=media,
    )


def _media_keys(model: Any, name: str, auto: Any) -> frozenset[str]:
    """The per-image inputs of a vision-language model whose family's inputs were read (``ModelFacts.media_keys``)."""
    from ..generation.multimodal import FAMILIES

    family = FAMILIES.get(getattr(model.config, "model_type", None) or "")
    if family is None or name not in _names(auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES):
        return frozenset()
    return family.per_image


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
    loss_class, helper = _loss_class(trainer)
    if loss_class not in losses.KNOWN_LOSSES:
        if helper is not None and defined_by in losses.KNOWN_LOSSES:
            return f"{type(trainer).__name__} overrides {helper}: a loss of your own"
        return losses.library_loss(loss_class, version=None)
    try:
        from importlib.metadata import version

        found = version(loss_class.split(".", 1)[0])
    except Exception:  # noqa: BLE001 - not installed as a distribution: unknown
        found = None
    args = trainer.args
    options = {name: getattr(args, name, None) for name in ("loss_type", "use_liger_kernel", "use_weighting")}
    return losses.library_loss(
        loss_class, version=found, compute_loss_func=callable(getattr(trainer, "compute_loss_func", None)), options=options
    )


#: Words in the names of the methods a library trainer computes its loss with (DPO's ``dpo_loss``,
#: ``concatenated_forward``, ``get_batch_loss_metrics``; SFT's ``compute_loss``; a ``training_step``).
_LOSS_WORDS = ("loss", "forward", "logits", "training_step")


def _loss_class(trainer: Any) -> tuple[str, str | None]:
    """The class whose loss ``trainer`` computes, ``module.qualname``: the most derived class in its MRO that
    defines ``compute_loss`` or a loss helper, with that method (``Class.method``); the class defining
    ``compute_loss`` and ``None`` if no class does."""
    for cls in type(trainer).__mro__:
        for name, value in vars(cls).items():
            if callable(value) and any(word in name for word in _LOSS_WORDS):
                return f"{cls.__module__}.{cls.__qualname__}", f"{cls.__name__}.{name}"
    return _defined_by(trainer, "compute_loss"), None


def _loss_helpers_of_your_own(trainer: Any) -> str | None:
    """The loss helper (``Class.method``) a class that is not a known library loss defines, or ``None``."""
    from . import losses

    loss_class, helper = _loss_class(trainer)
    return None if loss_class in losses.KNOWN_LOSSES else helper


def declared(trainer: Any) -> Any:
    """The :class:`~transformers_tpu_ext.training.losses.PaddingDeclaration` of ``trainer``'s loss (its
    ``compute_loss_func``, its ``compute_loss`` or its class decorated with ``ignores_padding``), or ``None``."""
    from .losses import DECLARED

    func = getattr(trainer, "compute_loss_func", None)
    method = getattr(type(trainer), "compute_loss", None)
    for owner in (func if callable(func) else None, method, type(trainer)):
        found = getattr(owner, DECLARED, None) if owner is not None else None
        if found is not None:
            return found
    return None


def source_facts(trainer: Any, collate: Any, training: bool) -> batch_buckets.SourceFacts:
    """The :class:`~transformers_tpu_ext.training.buckets.SourceFacts` of a Trainer data loader."""
    from . import losses

    args = trainer.args
    defined_by = _defined_by(trainer, "compute_loss")
    upstream = defined_by in _UPSTREAM_COMPUTE_LOSS
    func = callable(getattr(trainer, "compute_loss_func", None))
    library = None if upstream else known_loss(trainer)
    known = library is not None and not isinstance(library, str)
    declaration = declared(trainer)
    if declaration is not None:  # the user's word, checked on the first batch (patch_trainer_losses)
        custom, own, keeps_rows = False, "", not declaration.rows
        entry = library if known else losses.KNOWN_LOSSES.get(_loss_class(trainer)[0]) or losses.KNOWN_LOSSES.get(defined_by)
        layout = getattr(entry, "layout", None)
    elif upstream:
        custom, own, keeps_rows, layout = func, "compute_loss_func, a loss of your own", False, None
    else:
        custom, keeps_rows, layout = not known, known, library.layout if known else None
        own = "" if known else _own_loss(trainer, library)
    return batch_buckets.SourceFacts(
        training=training,
        packed=packs(collate),
        generates=not training and bool(getattr(args, "predict_with_generate", False)),
        custom_loss=custom,
        own_loss=own,
        cuts_outputs=_defined_by(trainer, "prediction_step") in _UPSTREAM_PREDICTION_STEP,
        returns_inputs="inputs" in (getattr(args, "include_for_metrics", None) or ()),
        keeps_rows=keeps_rows,
        neftune=getattr(args, "neftune_noise_alpha", None) is not None,
        layout=layout,
    )


def _own_loss(trainer: Any, reason: str) -> str:
    """What the log calls a loss the plugin does not know: the library's reason, or the class and method."""
    from . import losses

    loss_class, helper = _loss_class(trainer)
    if loss_class in losses.KNOWN_LOSSES or _defined_by(trainer, "compute_loss") in losses.KNOWN_LOSSES:
        return f"{type(trainer).__name__}: {reason}"
    return f"{helper or type(trainer).__name__ + '.compute_loss'} ({loss_class}), a loss of your own"


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
