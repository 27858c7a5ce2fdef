"""Patch of ``transformers.generation.utils``: plain ``generate()`` is correct and fast on TPU.

Thin wrappers around ``GenerationMixin`` methods; off TPU (and outside a handled call) each one
calls the original at once. What a call does is decided in ``transformers_tpu_ext.generation_policy``
(pure), bucket shapes in ``buckets``/``generation_config``, the device loop in ``device_decode``, the
user's views of a padded call in ``generation_views``. Here is only the glue:

- ``generate``: greedy, sampling and beam search on decoder-only models are handled: the tensors
  that grow every step stay on the CPU and the result comes back on the input's device; the static
  cache is picked when the caller asked for none; batch size, prompt length and cache length are
  rounded up to buckets (left padding, dummy rows at the end) and the prefill is compiled chunk by
  chunk. Every other call (encoder-decoder models, assisted decoding, custom or Hub decoding
  methods, non-text inputs) is upstream's, untouched but for the ``CompileConfig`` adaptation.
- ``_prepare_generated_length``, ``_validate_generated_length``, ``_get_logits_processor``: lengths
  keep the caller's meaning (the padding is not counted), in the generation config and in errors.
- ``_sample``, ``_beam_search``: logits processors, stopping criteria, ``prefix_allowed_tokens_fn``
  and streamers see only the caller's rows and columns; greedy decoding and sampling run the device
  loop when nothing needs the logits on the host.
- ``_prepare_cache_for_generation`` / ``_prepare_static_cache`` / ``_get_static_cache_init_shape``:
  the static cache length is rounded up to a bucket; sliding-window layers become full-length
  layers (masked to the window), so a decode step has one graph however far it is; a cache
  initialised early takes its key-value head count from the attention modules when the config
  states it another way (Falcon).
- ``prepare_inputs_for_generation``: the chunked prefill's position-id slices are made dense, so
  every prompt length reuses the chunk's graph (graphs guard on strides).
- ``create_masks_for_generate`` (the name bound in this module): in a device-loop step, the 2D mask
  goes to the model, which builds its 4D masks inside the compiled forward.
- ``_valid_auto_compile_criteria``: a ``CompileConfig`` the ``tpu`` backend rejects
  (``mode="reduce-overhead"``, ``backend="inductor"``...) is adapted, with one warning; TorchDynamo's
  recompile limit is raised so each bucket gets its graph.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import inspect
import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from .. import generation_config as settings_module
from .. import generation_policy as policy
from .. import static_cache
from ..backend import is_tpu
from ..generation_views import CriteriaView, Padding, ProcessorsView, StreamerView
from ._wrap import Wraps, fail_safe

NAME = "generation"
TARGET = "transformers.generation.utils"
DISTRIBUTION = "transformers"

logger = logging.getLogger("transformers_tpu_ext")

_wraps = Wraps()

#: Tensors upstream grows every step (kept on CPU); everything else is left where it is.
_GROWING = ("input_ids", "attention_mask", "position_ids", "token_type_ids", "mm_token_type_ids")

#: Test-only switch (``tests/test_generation_mutation.py``): unmask the left-padding columns the
#: plugin adds, to prove the token comparisons can catch attention to padding. Never set it elsewhere.
_BREAK_PADDING_MASK = False


@dataclass
class _Call:
    """What the ``generate`` wrapper decided for the call in flight (read by the inner wrappers)."""

    settings: settings_module.TPUGenerationConfig
    plan: policy.CallPlan
    padding: Padding = field(default_factory=Padding)
    forced_chunk: bool = False  # the plugin chose prefill_chunk_size
    user_cache_kind: str | None = None  # what the caller will see in output.cache: "static", "dynamic"
    previous_cache_length: int = -1  # model._previous_max_cache_length before the call
    upstream_cache_length: int = 0  # the static-cache length upstream would have chosen


_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("transformers_tpu_ext_generate", default=None)
#: The state of a call left to upstream (every inner wrapper passes through).
_UPSTREAM = _Call(settings=settings_module.TPUGenerationConfig(), plan=policy.CallPlan(True, "upstream"))

#: Signatures of the wrapped originals (``self`` dropped), taken at ``apply``.
_signatures: dict[str, inspect.Signature] = {}

_warned_lock = threading.Lock()
_warned_configs: set[str] = set()
_saved_recompile_limit: int | None = None


_WRAPPERS = {
    "generate": lambda: _generate,
    "_prepare_generated_length": lambda: _prepare_generated_length,
    "_validate_generated_length": lambda: _validate_generated_length,
    "_get_logits_processor": lambda: _get_logits_processor,
    "_prepare_cache_for_generation": lambda: _prepare_cache_for_generation,
    "_prepare_static_cache": lambda: _prepare_static_cache,
    "_get_static_cache_init_shape": lambda: _get_static_cache_init_shape,
    "_valid_auto_compile_criteria": lambda: _valid_auto_compile_criteria,
    "prepare_inputs_for_generation": lambda: _prepare_inputs_for_generation,
    "_sample": lambda: _sample,
    "_beam_search": lambda: _beam_search,
}


def apply(module: Any) -> None:
    mixin = module.GenerationMixin
    for name, wrapper in _WRAPPERS.items():
        if name not in _signatures:
            signature = inspect.signature(inspect.unwrap(getattr(mixin, name)))
            _signatures[name] = signature.replace(parameters=list(signature.parameters.values())[1:])
        _wraps.wrap(mixin, name, wrapper())
    original = module.create_masks_for_generate
    _wraps.replace(module, "create_masks_for_generate", _masks_for_generate(original))


def revert() -> None:
    global _saved_recompile_limit
    _wraps.unwrap_all()
    if _saved_recompile_limit is not None:
        dynamo_config = _dynamo_config()
        if dynamo_config is not None:
            dynamo_config.recompile_limit = _saved_recompile_limit
        _saved_recompile_limit = None


# -------------------------------------------------------------------------------------------------
# generate()


def _generate(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _call.get() is not None or not is_tpu(getattr(instance, "device", None)):
        return wrapped(*args, **kwargs)
    # The user's mistakes surface here, once, exactly as upstream raises them: a bad setting, an
    # argument generate() does not take, an invalid generation option. Only our own planning below
    # is fail-safe (an error of ours there falls back to the unpatched call).
    settings = settings_module.current()
    if instance.config.is_encoder_decoder:
        # The encoder's inputs must stay on the model's device, and upstream creates the decoder's
        # growing tensors beside them: left to upstream (only the CompileConfig adaptation applies).
        return wrapped(*args, **kwargs)
    call = _bind("generate", args, kwargs)
    generation_config, _ = instance._prepare_generation_config(
        call.get("generation_config"), **{k: v for k, v in call.items() if k not in _GENERATE_PARAMETERS}
    )
    planned = _plan_safely(instance, call, generation_config, settings)
    if planned is None:
        # Upstream's call, whole: nested generate() calls (an assistant model's) are left alone too.
        token = _call.set(_UPSTREAM)
        try:
            return wrapped(*args, **kwargs)
        finally:
            _call.reset(token)
    call, state, out_device = planned
    token = _call.set(state)
    try:
        result = wrapped(**call)
        return _restore(result, state, out_device, instance)
    finally:
        _call.reset(token)


def _bind(name: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by name (``**kwargs`` flattened), per the original method's signature."""
    signature = _signatures[name]
    bound = signature.bind(*args, **kwargs)
    arguments = dict(bound.arguments)
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name, {}))
    return arguments


_plan_failures: set[str] = set()


def _plan_safely(model: Any, call: dict, generation_config: Any, settings: Any) -> Any:
    """``_plan(...)``, or ``None`` (call upstream unchanged) if it fails: a bug of ours never breaks generate()."""
    try:
        return _plan(model, call, generation_config, settings)
    except Exception as error:
        _report_failure("generate() planning", error)
        return None


def _facts(model: Any, call: dict, generation_config: Any, settings: Any) -> policy.CallFacts:
    import torch

    main_name = "inputs" if call.get("inputs") is not None else "input_ids"
    main = call.get(main_name)
    embeds = call.get("inputs_embeds")
    if isinstance(main, torch.Tensor):
        inputs = "input_ids" if not main.is_floating_point() else "other"
        bucketable = main.dim() == 2 and main.shape[1] > 0 and not main.is_floating_point()
    elif isinstance(embeds, torch.Tensor):
        inputs, bucketable = "inputs_embeds", False
    else:
        inputs, bucketable = "input_ids", False
    mode = "custom" if call.get("custom_generate") is not None else generation_config.get_generation_mode(
        call.get("assistant_model")
    ).value
    returns = bool(generation_config.return_dict_in_generate)
    options = {name: getattr(generation_config, name, None) for name in policy.HOST_OPTIONS}
    device_possible = (
        settings.device_decode
        and not policy.processors_needed(options)
        and not call.get("logits_processor")
        and call.get("prefix_allowed_tokens_fn") is None
        and not (returns and (generation_config.output_scores or generation_config.output_logits))
        and not _custom_masks(model)
    )
    return policy.CallFacts(
        mode=mode,
        encoder_decoder=bool(model.config.is_encoder_decoder),
        inputs=inputs,
        ids_bucketable=bucketable,
        other_batched_inputs=_has_other_batched_inputs(call, main_name),
        accepts_attention_mask="attention_mask" in inspect.signature(model.forward).parameters,
        user_cache=call.get("cache") is not None or call.get("past_key_values") is not None,
        cache_implementation=generation_config.cache_implementation,
        use_cache=generation_config.use_cache is not False,
        disable_compile=bool(generation_config.disable_compile),
        supports_default_cache=model._supports_default_dynamic_cache(),
        returns_cache=returns,
        outputs_attentions_or_states=returns
        and bool(generation_config.output_attentions or generation_config.output_hidden_states),
        guidance=generation_config.guidance_scale not in (None, 1, 1.0),
        do_sample=bool(generation_config.do_sample),
        device_decode_possible=device_possible,
    )


def _custom_masks(model: Any) -> bool:
    """Whether the model builds its own generation masks (multimodal models): no device loop then."""
    return getattr(type(model), "create_masks_for_generate", None) is not None


def _plan(model: Any, call: dict, generation_config: Any, settings: Any) -> tuple[dict, _Call, Any] | None:
    """How to run a ``generate()`` on TPU: the arguments to pass upstream, the state the inner
    wrappers read, and the device the result goes back to; ``None`` to leave the call to upstream."""
    import torch

    facts = _facts(model, call, generation_config, settings)
    plan = policy.plan_call(facts, static_cache=settings.static_cache, bucketing=settings.bucketing)
    if plan.upstream:
        logger.debug("transformers-tpu-ext: generate() left to upstream: %s", plan.reason)
        return None

    call = dict(call)
    main_name = "inputs" if call.get("inputs") is not None else "input_ids"
    main = call.get(main_name)
    embeds = call.get("inputs_embeds")
    if not isinstance(main, torch.Tensor) and isinstance(embeds, torch.Tensor):
        # Upstream would create the (empty) token tensor on the model's device; create it on the CPU,
        # with the embeddings, so the loop's tensors live together there.
        main_name, main = "input_ids", torch.ones((embeds.shape[0], 0), dtype=torch.long)
        call["input_ids"] = main
        out_device = embeds.device
    else:
        out_device = main.device if isinstance(main, torch.Tensor) else None

    # 1. The growing tensors live on the CPU during the loop; forward gets its inputs moved.
    cpu = torch.device("cpu")
    for name in ("inputs", "inputs_embeds", *_GROWING):
        value = call.get(name)
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            call[name] = value.to(cpu)

    state = _Call(settings=settings, plan=plan)
    user_config = call.get("generation_config")

    def set_option(name: str, value: Any) -> None:
        # Through kwargs, or on a private copy of the caller's GenerationConfig (never mutated).
        if user_config is not None:
            if call["generation_config"] is user_config:
                call["generation_config"] = copy.deepcopy(user_config)
            setattr(call["generation_config"], name, value)
        else:
            call[name] = value

    # 2. Static cache by default, so decode compiles with the tpu backend.
    if plan.static_cache:
        set_option("cache_implementation", "static")
    if facts.returns_cache:
        state.user_cache_kind = "static" if generation_config.cache_implementation == "static" else "dynamic"
        state.previous_cache_length = getattr(model, "_previous_max_cache_length", -1)

    # 3. Buckets: batch size, prompt length (left padding), cache length.
    if plan.bucket:
        ids = call[main_name]
        real_rows, length = ids.shape
        mask = call.get("attention_mask")
        if mask is None:
            mask = _infer_attention_mask(model, ids, generation_config)
        # Without any padding the prefill's mask is skipped (upstream drops an all-ones mask, and
        # SDPA's causal skip drops an unpadded first chunk's), a second, mask-less graph per rung,
        # even after warmup(): keep one padding column so every call takes the masked graph. (So a
        # prompt exactly a rung long moves to the next rung; measured: without the column, 16-,
        # 32- and 64-token prompts compile one more graph each after warmup.)
        shapes = settings.plan(real_rows, length, 1, min_padding=int(bool(mask.all())))
        pad = shapes.prompt - length
        padded_rows = shapes.batch if plan.pad_batch else real_rows
        if pad:
            pad_id = _pad_token_id(generation_config, model)
            ids = torch.cat([ids.new_full((real_rows, pad), pad_id), ids], dim=1)
            padding_columns = mask.new_ones if _BREAK_PADDING_MASK else mask.new_zeros
            mask = torch.cat([padding_columns((real_rows, pad)), mask], dim=1)
        if padded_rows != real_rows:
            ids = torch.cat([ids, ids[:1].expand(padded_rows - real_rows, -1)], dim=0)
            mask = torch.cat([mask, mask[:1].expand(padded_rows - real_rows, -1)], dim=0)
        call[main_name] = ids
        call["attention_mask"] = mask
        state.padding = Padding(pad=pad, real_batch=real_rows, padded_batch=padded_rows)
        if call.get("streamer") is not None and state.padding:
            call["streamer"] = StreamerView(call["streamer"], state.padding)
        if (
            settings.compile_prefill
            and generation_config.prefill_chunk_size is None
            and not generation_config.disable_compile
        ):
            set_option("prefill_chunk_size", shapes.chunk)
            state.forced_chunk = True
    return call, state, out_device


_GENERATE_PARAMETERS = {
    "inputs",
    "generation_config",
    "logits_processor",
    "stopping_criteria",
    "prefix_allowed_tokens_fn",
    "synced_gpus",
    "assistant_model",
    "streamer",
    "negative_prompt_ids",
    "negative_prompt_attention_mask",
    "custom_generate",
    "trust_remote_code",
    "tokenizer",
    "assistant_tokenizer",
}


def _has_other_batched_inputs(call: dict, main_name: str) -> bool:
    """Tensors we would have to pad along with the prompt (pixel values, positions...): no buckets."""
    import torch

    allowed = {main_name, "input_ids", "attention_mask", "inputs_embeds"}
    return any(isinstance(value, torch.Tensor) and name not in allowed for name, value in call.items())


def _pad_token_id(generation_config: Any, model: Any) -> int:
    """A token id for the padding columns: masked out, but it must be a valid embedding index."""
    vocab = getattr(model.config.get_text_config(), "vocab_size", None)
    for candidate in (generation_config.pad_token_id, generation_config.eos_token_id, generation_config.bos_token_id):
        if isinstance(candidate, (list, tuple)):
            candidate = candidate[0] if candidate else None
        if candidate is not None and int(candidate) >= 0 and (vocab is None or int(candidate) < vocab):
            return int(candidate)
    return 0


def _infer_attention_mask(model: Any, ids: Any, generation_config: Any) -> Any:
    """The mask upstream would infer for ``ids`` (from the pad token), through upstream's own method."""
    import torch

    probe = copy.copy(generation_config)
    pad, eos = generation_config.pad_token_id, generation_config.eos_token_id
    probe._pad_token_tensor = None if pad is None else torch.tensor(pad)
    if eos is None:
        probe._eos_token_tensor = None
    else:
        probe._eos_token_tensor = torch.tensor(eos if isinstance(eos, (list, tuple)) else [eos])
    return model._prepare_attention_mask_for_generation(ids, probe, {}).to(torch.long)


def _restore(result: Any, state: _Call, device: Any, model: Any) -> Any:
    """Drop the padding we added, give back the cache the caller expects, move to the input's device."""
    import torch

    padding = state.padding

    def fix(tensor: Any, sequence: bool) -> Any:
        if not isinstance(tensor, torch.Tensor):
            return tensor
        if padding.dummy and tensor.dim() >= 1:
            tensor = padding.rows(tensor)
        if sequence and padding.pad and tensor.dim() == 2:
            tensor = tensor[:, padding.pad :]
        if device is not None and tensor.device != device:
            tensor = tensor.to(device)
        return tensor

    if isinstance(result, torch.Tensor):
        return fix(result, sequence=True)
    sequences = getattr(result, "sequences", None)
    if isinstance(sequences, torch.Tensor):
        if state.user_cache_kind is not None and getattr(result, "cache", None) is not None and (
            state.plan.bucket or state.plan.static_cache or static_cache.layers_replaced(result.cache)
        ):
            result.cache = static_cache.as_upstream_returns(
                model, result.cache, state.user_cache_kind, state.padding, state.upstream_cache_length
            )
        result.sequences = fix(sequences, sequence=True)
        for name in ("scores", "logits"):
            value = getattr(result, name, None)
            if isinstance(value, tuple):
                setattr(result, name, tuple(fix(item, sequence=False) for item in value))
        for name in ("sequences_scores", "beam_indices"):
            value = getattr(result, name, None)
            if isinstance(value, torch.Tensor):
                setattr(result, name, fix(value, sequence=False))
    return result


# -------------------------------------------------------------------------------------------------
# The inner wrappers: active only inside a handled TPU generate() call.


def _in_handled_call(body: Any) -> Any:
    """Run ``body`` (fail-safe) inside a handled TPU ``generate()``; elsewhere call the original at once."""
    guarded = fail_safe(body)

    @functools.wraps(body)
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = _call.get()
        if state is None or state.plan.upstream:
            return wrapped(*args, **kwargs)
        return guarded(wrapped, instance, args, kwargs)

    return wrapper


def _in_padded_call(body: Any) -> Any:
    """Like :func:`_in_handled_call`, only in calls where the plugin padded something."""
    guarded = fail_safe(body)

    @functools.wraps(body)
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = _call.get()
        if state is None or not state.padding:
            return wrapped(*args, **kwargs)
        return guarded(wrapped, instance, args, kwargs)

    return wrapper


@_in_padded_call
def _prepare_generated_length(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    arguments = _bind("_prepare_generated_length", args, kwargs)
    arguments["input_ids_length"] -= _call.get().padding.pad
    return wrapped(**arguments)


@_in_padded_call
def _validate_generated_length(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    arguments = _bind("_validate_generated_length", args, kwargs)
    arguments["input_ids_length"] -= _call.get().padding.pad
    return wrapped(**arguments)


@_in_padded_call
def _get_logits_processor(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    # Upstream sizes some processors from the prompt (its length, its padding per row): give them the
    # caller's prompt, the one the processors will see through ProcessorsView.
    padding = _call.get().padding
    arguments = _bind("_get_logits_processor", args, kwargs)
    if arguments.get("input_ids_seq_length"):
        arguments["input_ids_seq_length"] -= padding.pad
    model_kwargs = arguments.get("model_kwargs")
    if model_kwargs and model_kwargs.get("attention_mask") is not None:
        arguments["model_kwargs"] = {**model_kwargs, "attention_mask": padding.ids(model_kwargs["attention_mask"])}
    return wrapped(**arguments)


@_in_handled_call
def _prepare_cache_for_generation(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    state = _call.get()
    arguments = _bind("_prepare_cache_for_generation", args, kwargs)
    generation_config = arguments["generation_config"]
    state.upstream_cache_length = max(
        arguments["max_cache_length"], generation_config.max_cache_len or 0, state.previous_cache_length
    )
    if state.plan.bucket and generation_config.cache_implementation == "static":
        needed = max(arguments["max_cache_length"] + state.padding.pad, generation_config.max_cache_len or 0, 1)
        generation_config.max_cache_len = _cache_length(state.settings, needed)
    return wrapped(**arguments)


def _cache_length(settings: Any, needed: int) -> int:
    from ..buckets import cache_bucket

    return cache_bucket(needed, settings.cache_ladder(), settings.max_cache_len)


@_in_handled_call
def _prepare_static_cache(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    cache = wrapped(*args, **kwargs)
    # A sliding-window layer keeps its length as a Python int and branches on it: a compiled decode
    # step is guarded on that int, so it compiles anew every step until the window is full, then on
    # every kv offset. A full-length layer masked to the window computes the same attention with a
    # length held in a tensor: one graph. (It holds the whole sequence: max_cache_len positions.)
    static_cache.full_length_layers(cache, getattr(instance, "_previous_max_cache_length", None))
    return cache


@_in_handled_call
def _get_static_cache_init_shape(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    # Upstream initialises a static cache early (for a compiled prefill) with head counts read from
    # the config, which some models state another way (Falcon's multi-query attention: one key-value
    # head, while the config says num_attention_heads). The attention modules know: when they say
    # otherwise, their count wins. (Initialising from the first chunk's states instead would give
    # the first chunk its own graph per rung: twice the prefill graphs.)
    shape = wrapped(*args, **kwargs)
    if shape is None or not _call.get().forced_chunk or (getattr(instance, "_tp_size", None) or 1) > 1:
        return shape
    heads, head_dim = shape
    seen = static_cache.attention_heads(instance)
    if seen is not None and isinstance(heads, int) and isinstance(head_dim, int) and seen != (heads, head_dim):
        return seen
    return shape


@_in_handled_call
def _prepare_inputs_for_generation(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    # The chunked prefill hands each chunk a slice of the full position ids: its stride is the
    # padded prompt length, and a compiled graph guards on strides. Dense copies let every prompt
    # length reuse the chunk's graph.
    position_ids = kwargs.get("position_ids")
    if position_ids is not None:
        if position_ids.stride() != _dense_strides(position_ids.shape):
            # (``is_contiguous()`` ignores the stride of size-1 dims; graph guards do not.)
            kwargs = {**kwargs, "position_ids": position_ids.clone(memory_format=_contiguous_format())}
    return wrapped(*args, **kwargs)


def _dense_strides(shape: Any) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(tuple(shape)):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _contiguous_format() -> Any:
    import torch

    return torch.contiguous_format


def _masks_for_generate(original: Any) -> Any:
    """``create_masks_for_generate`` as upstream's ``prepare_inputs_for_generation`` calls it."""

    @functools.wraps(original)
    def create_masks_for_generate(*args: Any, **kwargs: Any) -> Any:
        from ..device_decode import device_masks_active

        if device_masks_active():
            return kwargs.get("attention_mask", args[2] if len(args) > 2 else None)
        return original(*args, **kwargs)

    return create_masks_for_generate


# -------------------------------------------------------------------------------------------------
# Decoding methods


def _sample(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    state = _call.get()
    if state is None or state.plan.upstream:
        return wrapped(*args, **kwargs)
    arguments = _bind("_sample", args, kwargs)
    try:
        path = _decode_path(instance, state, arguments)
    except Exception as error:  # a bug of ours: upstream's loop (with the caller's views)
        _report_failure("_sample", error)
        path = policy.DecodePath(False, "fallback")
    logger.debug("transformers-tpu-ext: decoding loop on the %s (%s)", "device" if path.device else "host", path.reason)
    padding = state.padding
    if padding:
        arguments["stopping_criteria"] = CriteriaView(arguments["stopping_criteria"], padding)
    if not path.device:
        if padding:
            arguments["logits_processor"] = ProcessorsView(arguments["logits_processor"], padding)
        return wrapped(**arguments)
    # Not fail-safe past this point: the loop consumes the cache, so a second run could not start
    # afresh; an error here (the model's, or ours) is the call's error.
    from ..device_decode import sample_on_device

    model_kwargs = {k: v for k, v in arguments.items() if k not in _SAMPLE_PARAMETERS}
    generation_config = arguments["generation_config"]
    return sample_on_device(
        instance,
        arguments["input_ids"],
        logits_processor=arguments["logits_processor"],  # read for their settings, never called
        stopping_criteria=arguments["stopping_criteria"],
        generation_config=generation_config,
        streamer=arguments.get("streamer"),
        padding=padding,
        compile_backend=_choice_backend(instance, model_kwargs, generation_config),
        model_kwargs=model_kwargs,
    )


def _decode_path(model: Any, state: _Call, arguments: dict) -> policy.DecodePath:
    """Which loop runs this ``_sample`` call (``generation_policy.decode_path`` over its facts)."""
    generation_config = arguments["generation_config"]
    returns = bool(generation_config.return_dict_in_generate)
    return policy.decode_path(
        policy.LoopFacts(
            mode=generation_config.get_generation_mode().value,
            device_decode=state.settings.device_decode,
            processors=tuple(type(p).__name__ for p in arguments["logits_processor"]),
            model_kwargs=tuple(k for k, v in arguments.items() if k not in _SAMPLE_PARAMETERS and v is not None),
            outputs_scores_or_logits=returns and bool(generation_config.output_scores or generation_config.output_logits),
            outputs_attentions_or_states=returns
            and bool(generation_config.output_attentions or generation_config.output_hidden_states),
            synced_gpus=bool(arguments.get("synced_gpus")),
            custom_mask_function=_custom_masks(model),
        )
    )


def _report_failure(where: str, error: Exception) -> None:
    key = f"{where}: {type(error).__name__}: {error}"
    with _warned_lock:
        first = key not in _plan_failures
        _plan_failures.add(key)
    if first:
        logger.warning(
            "transformers-tpu-ext: %s failed (%s: %s); falling back to the unpatched call", where, type(error).__name__, error
        )


_SAMPLE_PARAMETERS = {"input_ids", "logits_processor", "stopping_criteria", "generation_config", "synced_gpus", "streamer"}


def _choice_backend(model: Any, model_kwargs: dict, generation_config: Any) -> Any:
    """The compile backend of the decode step (``None``: not compiled), for the token choice too."""
    if not model._valid_auto_compile_criteria(model_kwargs, generation_config):
        return None
    config = generation_config.compile_config or model._default_compile_config()
    return config.backend


@_in_padded_call
def _beam_search(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    padding = _call.get().padding
    arguments = _bind("_beam_search", args, kwargs)
    arguments["logits_processor"] = ProcessorsView(arguments["logits_processor"], padding)
    arguments["stopping_criteria"] = CriteriaView(arguments["stopping_criteria"], padding)
    # Beam search sizes its buffers from max_length and counts the prompt from input_ids: both
    # include the padding columns inside the loop.
    generation_config = copy.copy(arguments["generation_config"])
    generation_config.max_length += padding.pad
    arguments["generation_config"] = generation_config
    return wrapped(**arguments)


# -------------------------------------------------------------------------------------------------
# Compile configuration


def _valid_auto_compile_criteria(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not is_tpu(getattr(instance, "device", None)):
        return wrapped(*args, **kwargs)
    return _valid_auto_compile_criteria_on_tpu(wrapped, instance, args, kwargs)


@fail_safe
def _valid_auto_compile_criteria_on_tpu(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    arguments = _bind("_valid_auto_compile_criteria", args, kwargs)
    generation_config = arguments["generation_config"]
    adapted = _adapt_compile_config(generation_config.compile_config)
    if adapted is not None:
        generation_config.compile_config = adapted
    can_compile = wrapped(**arguments)
    if can_compile:
        state = _call.get()
        _raise_recompile_limit((state.settings if state else settings_module.current()).recompile_limit)
    return can_compile


def _adapt_compile_config(config: Any) -> Any:
    """A TPU-safe copy of ``config`` (``generation_policy.tpu_compile_settings``), or ``None`` if fine."""
    if config is None:
        return None
    settings, changes = policy.tpu_compile_settings(config.backend, config.mode, config.options, config.dynamic)
    if not changes:
        return None
    adapted = copy.copy(config)
    for name, value in settings.items():
        setattr(adapted, name, value)
    key = repr(sorted(changes))
    with _warned_lock:
        first = key not in _warned_configs
        _warned_configs.add(key)
    if first:
        from .. import log

        log.warn(
            "transformers-tpu-ext: the CompileConfig given to generate() cannot run on TPU; adapted it ("
            + ", ".join(changes)
            + "). Pass CompileConfig(backend='tpu', mode='default', dynamic=False) to silence this warning.",
            stacklevel=2,
        )
    return adapted


def _dynamo_config() -> Any:
    dynamo = sys.modules.get("torch._dynamo")
    return getattr(dynamo, "config", None)


def _raise_recompile_limit(limit: int) -> None:
    global _saved_recompile_limit
    dynamo_config = _dynamo_config()
    if dynamo_config is None:
        import torch._dynamo

        dynamo_config = torch._dynamo.config
    current = dynamo_config.recompile_limit
    if current < limit:
        if _saved_recompile_limit is None:
            _saved_recompile_limit = current
        dynamo_config.recompile_limit = limit
        logger.info("transformers-tpu-ext: TorchDynamo recompile_limit raised from %d to %d", current, limit)
