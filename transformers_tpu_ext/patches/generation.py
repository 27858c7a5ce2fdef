"""Patch of ``transformers.generation.utils``: plain ``generate()`` is fast on TPU.

Thin wrappers around ``GenerationMixin`` methods; off TPU each one calls the original at once.

- ``generate`` (decoder-only models; encoder-decoder models are left to upstream, whose encoder
  needs its inputs on the model's device): keeps the tensors that grow every step (sequences,
  attention mask, positions; with ``inputs_embeds``, the embeddings and the token tensor upstream
  would create) on the CPU and returns the result on the input's device; picks the static cache
  when the caller asked for none; rounds batch size and prompt length up to buckets (left
  padding + attention mask; dummy rows copy a real row and are marked finished at once), and runs
  the bucketed prefill through the compiled forward (upstream's chunked prefill, one chunk up to
  ``prefill_chunk``). The padding is removed from the result (and from what a streamer sees).
  The user's own errors (settings, arguments, generation options) are raised before the
  fail-safe planning, as upstream raises them.
- ``_prepare_generated_length``: ``max_length``/``min_length`` keep their meaning for the
  unpadded prompt.
- ``_prepare_cache_for_generation``: the static cache length is rounded up to a bucket.
- ``prepare_inputs_for_generation``: the chunked prefill's position-id slices are made contiguous,
  so every prompt length reuses the chunk's graph (graphs guard on strides).
- ``_valid_auto_compile_criteria``: a ``CompileConfig`` the ``tpu`` backend rejects
  (``mode="reduce-overhead"``, ``backend="inductor"``...) is adapted, with one warning; TorchDynamo's
  recompile limit is raised so each bucket gets its graph.

The bucket policy and the settings are plain logic in ``transformers_tpu_ext.buckets`` and
``transformers_tpu_ext.generation_config``.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import inspect
import logging
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any

from .. import generation_config as settings_module
from ..backend import is_tpu
from ._wrap import Wraps, fail_safe

NAME = "generation"
TARGET = "transformers.generation.utils"
DISTRIBUTION = "transformers"

logger = logging.getLogger("transformers_tpu_ext")

_wraps = Wraps()

#: String backends that run on any device; any other string backend is replaced by ``tpu``.
_PORTABLE_BACKENDS = {"tpu", "eager", "aot_eager", "aot_eager_decomp_partition"}
#: Tensors upstream grows every step (kept on CPU); everything else is left where it is.
_GROWING = ("input_ids", "attention_mask", "position_ids", "token_type_ids", "mm_token_type_ids")


@dataclass
class _Call:
    """What the ``generate`` wrapper decided for the call in flight (read by the inner wrappers)."""

    settings: settings_module.TPUGenerationConfig
    pad: int = 0  # left-padding columns added to the prompt
    bucket_cache: bool = False


_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("transformers_tpu_ext_generate", default=None)

#: Signatures of the wrapped originals (``self`` dropped), taken at ``apply``.
_signatures: dict[str, inspect.Signature] = {}

_warned_lock = threading.Lock()
_warned_configs: set[str] = set()
_saved_recompile_limit: int | None = None


_WRAPPERS = {
    "generate": lambda: _generate,
    "_prepare_generated_length": lambda: _prepare_generated_length,
    "_prepare_cache_for_generation": lambda: _prepare_cache_for_generation,
    "_valid_auto_compile_criteria": lambda: _valid_auto_compile_criteria,
    "prepare_inputs_for_generation": lambda: _prepare_inputs_for_generation,
}


def apply(module: Any) -> None:
    mixin = module.GenerationMixin
    for name, wrapper in _WRAPPERS.items():
        if name not in _signatures:
            signature = inspect.signature(inspect.unwrap(getattr(mixin, name)))
            _signatures[name] = signature.replace(parameters=list(signature.parameters.values())[1:])
        _wraps.wrap(mixin, name, wrapper())


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
        return wrapped(*args, **kwargs)
    call, state, restore = planned
    token = _call.set(state)
    try:
        result = wrapped(**call)
    finally:
        _call.reset(token)
    return _restore(result, *restore)


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
        key = f"{type(error).__name__}: {error}"
        with _warned_lock:
            first = key not in _plan_failures
            _plan_failures.add(key)
        if first:
            logger.warning(
                "transformers-tpu-ext: generate() planning failed (%s); falling back to the unpatched call", key
            )
        return None


def _plan(model: Any, call: dict, generation_config: Any, settings: Any) -> tuple[dict, _Call, tuple]:
    """How to run a decoder-only ``generate()`` on TPU: the arguments to pass upstream, the state the
    inner wrappers read, and what ``_restore`` needs (padding, batch rows, output device)."""
    import torch

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

    state = _Call(settings=settings)
    greedy_or_sample = (
        call.get("custom_generate") is None
        and call.get("assistant_model") is None
        and generation_config.get_generation_mode(None).value in ("greedy_search", "sample")
    )
    user_cache = call.get("cache") is not None or call.get("past_key_values") is not None

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
    static = generation_config.cache_implementation == "static"
    if (
        settings.static_cache
        and generation_config.cache_implementation is None
        and not user_cache
        and generation_config.use_cache is not False
        and not generation_config.disable_compile
        and greedy_or_sample
        and model._supports_default_dynamic_cache()
    ):
        set_option("cache_implementation", "static")
        static = True

    # 3. Buckets: batch size, prompt length (left padding), cache length.
    pad = dummy_rows = real_rows = padded_rows = 0
    ids = call.get(main_name)
    if (
        settings.bucketing
        and static
        and greedy_or_sample
        and not user_cache
        and isinstance(ids, torch.Tensor)
        and ids.dim() == 2
        and ids.shape[1] > 0
        and not ids.is_floating_point()
        and call.get("inputs_embeds") is None
        and not _has_other_batched_inputs(call, main_name)
        and "attention_mask" in inspect.signature(model.forward).parameters
        and not (
            generation_config.return_dict_in_generate
            and (generation_config.output_attentions or generation_config.output_hidden_states)
        )
    ):
        real_rows, length = ids.shape
        mask = call.get("attention_mask")
        if mask is None:
            mask = _infer_attention_mask(model, ids, generation_config)
        # Without any padding the prefill's mask is skipped (upstream drops an all-ones mask, and
        # SDPA's causal skip drops an unpadded first chunk's), a second, mask-less graph per rung,
        # even after warmup(): keep one padding column so every call takes the masked graph. (So a
        # prompt exactly a rung long moves to the next rung; measured: without the column, 16-,
        # 32- and 64-token prompts compile one more graph each after warmup.)
        plan = settings.plan(real_rows, length, 1, min_padding=int(bool(mask.all())))
        pad, padded_rows = plan.prompt - length, plan.batch
        dummy_rows = padded_rows - real_rows
        if pad:
            pad_id = _pad_token_id(generation_config)
            ids = torch.cat([ids.new_full((real_rows, pad), pad_id), ids], dim=1)
            mask = torch.cat([mask.new_zeros((real_rows, pad)), mask], dim=1)
        if dummy_rows:
            ids = torch.cat([ids, ids[:1].expand(dummy_rows, -1)], dim=0)
            mask = torch.cat([mask, mask[:1].expand(dummy_rows, -1)], dim=0)
            call["stopping_criteria"] = _with_row_mask(call.get("stopping_criteria"), real_rows, plan.batch)
        call[main_name] = ids
        call["attention_mask"] = mask
        if call.get("streamer") is not None and (pad or dummy_rows):
            call["streamer"] = _StreamerView(call["streamer"], pad, real_rows, plan.batch)
        if (
            settings.compile_prefill
            and generation_config.prefill_chunk_size is None
            and not generation_config.disable_compile
        ):
            set_option("prefill_chunk_size", plan.chunk)
        state.pad = pad
        state.bucket_cache = True

    return call, state, (pad, (real_rows, padded_rows) if dummy_rows else None, out_device)


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

    allowed = {main_name, "input_ids", "attention_mask"}
    return any(isinstance(value, torch.Tensor) and name not in allowed for name, value in call.items())


def _pad_token_id(generation_config: Any) -> int:
    for candidate in (generation_config.pad_token_id, generation_config.eos_token_id, 0):
        if isinstance(candidate, (list, tuple)):
            candidate = candidate[0] if candidate else None
        if candidate is not None:
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


def _with_row_mask(stopping_criteria: Any, real_rows: int, padded_rows: int) -> Any:
    from transformers.generation.stopping_criteria import StoppingCriteriaList

    criteria = StoppingCriteriaList(list(stopping_criteria or []))
    criteria.append(_padding_rows_done_class()(real_rows, padded_rows))
    return criteria


@functools.cache
def _padding_rows_done_class() -> type:
    # Defined on first use: this module imports nothing from transformers at import time.
    from transformers.generation.stopping_criteria import StoppingCriteria

    class PaddingRowsDone(StoppingCriteria):
        """Reports the dummy (batch-padding) rows finished from the first step.

        So they never keep the loop running longer than the real rows would
        (``num_return_sequences`` rows stay grouped: the dummy ones are last).
        """

        def __init__(self, real_rows: int, padded_rows: int) -> None:
            self.real_rows = real_rows
            self.padded_rows = padded_rows

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            import torch

            rows = input_ids.shape[0]
            done = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
            done[rows * self.real_rows // self.padded_rows :] = True
            return done

    return PaddingRowsDone


class _StreamerView:
    """What the caller's streamer sees: the real rows, without the prompt's left padding."""

    def __init__(self, streamer: Any, pad: int, real_rows: int, padded_rows: int) -> None:
        self._streamer = streamer
        self._pad = pad
        self._real_rows = real_rows
        self._padded_rows = padded_rows
        self._prompt_sent = False

    def put(self, value: Any) -> None:
        rows = value.shape[0] * self._real_rows // self._padded_rows if value.dim() else None
        if not self._prompt_sent and value.dim() == 2:
            value = value[:rows, self._pad :]
        elif rows is not None:
            value = value[:rows]
        self._prompt_sent = True
        self._streamer.put(value)

    def end(self) -> None:
        self._streamer.end()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._streamer, name)


def _restore(result: Any, pad: int, rows: tuple[int, int] | None, device: Any) -> Any:
    """Drop the padding we added and move the result back to the input's device."""
    import torch

    def fix(tensor: Any, sequence: bool) -> Any:
        if not isinstance(tensor, torch.Tensor):
            return tensor
        if rows is not None and tensor.dim() >= 1:
            real_rows, padded_rows = rows
            tensor = tensor[: tensor.shape[0] * real_rows // padded_rows]
        if sequence and pad and tensor.dim() == 2:
            tensor = tensor[:, pad:]
        if device is not None and tensor.device != device:
            tensor = tensor.to(device)
        return tensor

    if isinstance(result, torch.Tensor):
        return fix(result, sequence=True)
    sequences = getattr(result, "sequences", None)
    if isinstance(sequences, torch.Tensor):
        result.sequences = fix(sequences, sequence=True)
        for name in ("scores", "logits"):
            value = getattr(result, name, None)
            if isinstance(value, tuple):
                setattr(result, name, tuple(fix(item, sequence=False) for item in value))
    return result


# -------------------------------------------------------------------------------------------------
# The inner wrappers: active only inside a bucketed TPU generate() call.


def _in_bucketed_call(body: Any) -> Any:
    """Run ``body`` (fail-safe) inside a bucketed TPU ``generate()``; elsewhere call the original at once."""
    guarded = fail_safe(body)

    @functools.wraps(body)
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = _call.get()
        if state is None or not state.bucket_cache:
            return wrapped(*args, **kwargs)
        return guarded(wrapped, instance, args, kwargs)

    return wrapper


@_in_bucketed_call
def _prepare_generated_length(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    state = _call.get()
    if not state.pad:
        return wrapped(*args, **kwargs)
    arguments = _bind("_prepare_generated_length", args, kwargs)
    arguments["input_ids_length"] -= state.pad
    generation_config = wrapped(**arguments)
    generation_config.max_length += state.pad
    if generation_config.min_length:
        generation_config.min_length += state.pad
    return generation_config


@_in_bucketed_call
def _prepare_cache_for_generation(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    state = _call.get()
    arguments = _bind("_prepare_cache_for_generation", args, kwargs)
    generation_config = arguments["generation_config"]
    if generation_config.cache_implementation == "static":
        needed = max(arguments["max_cache_length"], generation_config.max_cache_len or 0, 1)
        generation_config.max_cache_len = _cache_length(state.settings, needed)
    return wrapped(**arguments)


def _cache_length(settings: Any, needed: int) -> int:
    from ..buckets import cache_bucket

    return cache_bucket(needed, settings.cache_ladder(), settings.max_cache_len)


@_in_bucketed_call
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
    """A TPU-safe copy of ``config`` (backend ``tpu``, no ``mode``, static shapes), or ``None`` if fine."""
    if config is None:
        return None
    backend = config.backend
    changes = []
    if isinstance(backend, str) and backend not in _PORTABLE_BACKENDS:
        changes.append(f"backend={backend!r} -> 'tpu'")
        backend = "tpu"
    mode = config.mode
    if mode not in (None, "default"):
        changes.append(f"mode={mode!r} dropped")
        mode = "default"
    options = config.options
    if options and backend != config.backend:
        changes.append("inductor options dropped")
        options = None
    dynamic = config.dynamic
    if changes and dynamic is None:
        dynamic = False
        changes.append("dynamic=False")
    if not changes:
        return None
    adapted = copy.copy(config)
    adapted.backend, adapted.mode, adapted.options, adapted.dynamic = backend, mode, options, dynamic
    key = repr(sorted(changes))
    with _warned_lock:
        first = key not in _warned_configs
        _warned_configs.add(key)
    if first:
        from ..activation import TransformersTPUExtWarning

        warnings.warn(
            "transformers-tpu-ext: the CompileConfig given to generate() cannot run on TPU; adapted it ("
            + ", ".join(changes)
            + "). Pass CompileConfig(backend='tpu', mode='default', dynamic=False) to silence this warning.",
            TransformersTPUExtWarning,
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
