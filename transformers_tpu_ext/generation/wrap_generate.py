"""The ``generate`` wrapper: which calls the plugin handles on TPU, and how.

A handled call (the decision is ``policy.plan_call`` over the call's facts) keeps the tensors that
grow every step on the CPU and returns the result on the input's device; takes the static cache
when the caller asked for none; rounds batch size, prompt length and cache length up to buckets
(left padding, dummy rows at the end) and compiles the prefill chunk by chunk. Every other call
(encoder-decoder models, assisted decoding, custom or Hub decoding methods, non-text inputs) is
upstream's, untouched. The state of a handled call goes to ``call.CURRENT`` for the inner wrappers;
the padding is taken off the result before it is returned (:func:`_restore`).
"""

from __future__ import annotations

import copy
import logging
import sys
from typing import Any

from ..core import length_readers
from ..backend import is_tpu
from ..core.wrapping import warn_once
from . import config as settings_module
from . import multimodal, policy, recurrent_cache, sampling, static_cache, wrap_media
from .call import CURRENT, UPSTREAM, CallState, bind, cache_key, model_kind, report_failure, warn_unaccelerated
from .views import Padding, StreamerView, ids_on

logger = logging.getLogger("transformers_tpu_ext")

#: Tensors upstream grows every step (kept on CPU); everything else is left where it is.
_GROWING = ("input_ids", "attention_mask", "position_ids", "token_type_ids", "mm_token_type_ids")


#: Test-only switch (``tests/generation/test_generation_mutation.py``): unmask the left-padding columns the
#: plugin adds, to prove the token comparisons can catch attention to padding. Never set it elsewhere.
_BREAK_PADDING_MASK = False


def generate(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if CURRENT.get() is not None:
        # A generate() inside a call (token healing's, a callback's, an assistant's): its own call,
        # upstream's, with every inner wrapper passing through (the outer call's padding, cache and
        # device mask are not this call's).
        token = CURRENT.set(UPSTREAM)
        with sampling.draws_as_upstream():
            try:
                return wrapped(*args, **kwargs)
            finally:
                CURRENT.reset(token)
    if not is_tpu(getattr(instance, "device", None)):
        return wrapped(*args, **kwargs)
    # The user's mistakes surface here, once, exactly as upstream raises them: a bad setting, an
    # argument generate() does not take, an invalid generation option. Only our own planning below
    # is fail-safe (an error of ours there falls back to the unpatched call).
    settings = settings_module.current()
    call = bind("generate", args, kwargs)
    generation_config, _ = instance._prepare_generation_config(
        call.get("generation_config"), **{k: v for k, v in call.items() if k not in _GENERATE_PARAMETERS}
    )
    planned = _plan_safely(instance, call, generation_config, settings)
    if planned is None:
        # Upstream's call, whole: nested generate() calls (an assistant model's) are left alone too.
        token = CURRENT.set(UPSTREAM)
        try:
            return wrapped(*args, **kwargs)
        finally:
            CURRENT.reset(token)
    call, state, out_device = planned
    token = CURRENT.set(state)
    try:
        result = wrapped(**call)
        return _restore(result, state, out_device, instance)
    finally:
        CURRENT.reset(token)
        static_cache.keep_upstreams_cache_length(instance, state.upstream_previous)


def _plan_safely(model: Any, call: dict, generation_config: Any, settings: Any) -> Any:
    """``_plan(...)``, or ``None`` (call upstream unchanged) if it fails: a bug of ours never breaks generate()."""
    try:
        return _plan(model, call, generation_config, settings)
    except Exception as error:
        report_failure("generate() planning", error)
        return None


def _facts(model: Any, call: dict, generation_config: Any, settings: Any) -> tuple[policy.CallFacts, Any]:
    """``policy.call_facts`` over the call's resolved options, the model and the call's arguments, and the
    call's ``multimodal.media_plan`` (``None`` without other per-row inputs)."""
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
    extras = [] if model.config.is_encoder_decoder else _other_batched_inputs(call, main_name)
    # Other per-row inputs of a token-ids call to a model that reads images or audio: its family's plan; of a
    # text model or beside inputs_embeds, no plan (policy names the reason).
    media = (
        multimodal.media_plan(wrap_media.media_facts(model, call, extras, main))
        if extras and inputs == "input_ids" and wrap_media.reads_media(model) else None
    )
    shape = policy.CallShape(
        mode=mode,
        inputs=inputs,
        ids_bucketable=bucketable,
        other_batched_inputs=bool(extras) and not (media is not None and media.pad),
        other_inputs_reason=None if media is None or media.pad else media.reason,
        cache_object=call.get("cache") is not None or call.get("past_key_values") is not None,
        logits_callbacks=bool(call.get("logits_processor")) or call.get("prefix_allowed_tokens_fn") is not None,
        eager_stance=_eager_stance(),
    )
    options = {name: getattr(generation_config, name, None) for name in (*policy.OPTION_DEFAULTS, *policy.HOST_OPTIONS)}
    facts = policy.call_facts(options, model_kind(model), shape, device_decode=settings.device_decode)
    return facts, media if media is not None and media.pad else None


def _eager_stance() -> bool:
    """Whether the call runs under ``torch.compiler.set_stance("force_eager")`` (TorchDynamo's stance)."""
    frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(getattr(frame, "_stance", None), "stance", None) == "force_eager"


def _plan(model: Any, call: dict, generation_config: Any, settings: Any) -> tuple[dict, CallState, Any] | None:
    """How to run a ``generate()`` on TPU: the arguments to pass upstream, the state the inner
    wrappers read, and the device the result goes back to; ``None`` to leave the call to upstream."""
    import torch

    facts, media = _facts(model, call, generation_config, settings)
    plan = policy.plan_call(facts, static_cache=settings.static_cache, bucketing=settings.bucketing)
    if plan.upstream:
        logger.debug("transformers-tpu-ext: generate() left to upstream: %s", plan.reason)
        warn_unaccelerated(model, "upstream", plan.reason, plan.hint)
        if facts.cache_implementation == "quantized":
            warn_once(policy.kv_cache_choice(policy.KVFacts(None, "quantized"), settings.kv_cache)[1])
        return None
    if facts.encoder_decoder:
        return wrap_media.plan_encoder_decoder(model, call, settings, plan)
    lengths = _length_plan(model, call, generation_config, settings, plan)
    if lengths is not None and lengths.upstream:
        if lengths.warn:
            warn_once(f"generate() runs unpatched on TPU: {lengths.reason}")
        logger.debug("transformers-tpu-ext: generate() left to upstream: %s", lengths.reason)
        warn_unaccelerated(model, "upstream", lengths.reason, policy.LENGTH_DOCS)
        return None
    logger.debug(
        "transformers-tpu-ext: generate() handled: %s static cache; %s",
        "the plugin's default" if plan.static_cache else "the caller's",
        ("bucketed" if plan.pad_batch else "bucketed without dummy rows") if plan.bucket else f"not bucketed ({plan.reason})",
    )
    if not plan.bucket:
        warn_unaccelerated(model, "unbucketed", plan.reason, plan.hint)

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

    # 1. The growing tensors live on the CPU during the loop; forward gets its inputs moved. (So do the
    # per-image inputs a vision-language model's positions read with the ids: wrap_media.)
    cpu = torch.device("cpu")
    media = media if plan.bucket else None
    for name in ("inputs", "inputs_embeds", *_GROWING, *(media.host if media is not None else ())):
        value = call.get(name)
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            call[name] = value.to(cpu)

    state = CallState(settings=settings, plan=plan, input_device=out_device, media=media, recurrent=facts.recurrent)
    _callbacks_on_caller_device(call, state, out_device)
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
        prefill_chunk = shapes.chunk
        if lengths is not None:
            # A rotary embedding that reads the length: padding only where it moves no threshold,
            # and the prompt in one piece where chunks would see other frequencies (length_readers).
            lengths = _length_plan(model, call, generation_config, settings, plan, mask, shapes)
            logger.debug("transformers-tpu-ext: rotary embedding reads the length: %s", lengths.reason)
            if not lengths.pad:
                shapes = type(shapes)(shapes.batch, length, length, shapes.cache)
            prefill_chunk = lengths.chunk if lengths.chunk is not None else shapes.prompt
        if facts.recurrent is not None:  # a state-space or hybrid model: recurrent.recurrent_path decides
            shapes, prefill_chunk = recurrent_cache.shapes(
                facts.recurrent, settings, shapes, length, int(bool(mask.all())), generation_config.prefill_chunk_size
            )
        pad = shapes.prompt - length
        padded_rows = shapes.batch if plan.pad_batch else real_rows
        if pad:
            pad_id = _pad_token_id(generation_config, model)
            ids = torch.cat([ids.new_full((real_rows, pad), pad_id), ids], dim=1)
            padding_columns = mask.new_ones if _BREAK_PADDING_MASK else mask.new_zeros
            mask = torch.cat([padding_columns((real_rows, pad)), mask], dim=1)
        if media is not None:  # per-column inputs padded too; dummy rows hold no image
            ids, mask = wrap_media.pad_media(call, model, ids, mask, pad, real_rows, padded_rows)
        elif padded_rows != real_rows:
            ids = torch.cat([ids, ids[:1].expand(padded_rows - real_rows, -1)], dim=0)
            mask = torch.cat([mask, mask[:1].expand(padded_rows - real_rows, -1)], dim=0)
        call[main_name] = ids
        call["attention_mask"] = mask
        state.media_ids = ids if media is not None else None
        state.padding = Padding(pad=pad, real_batch=real_rows, padded_batch=padded_rows)
        if call.get("streamer") is not None and state.padding:
            call["streamer"] = StreamerView(call["streamer"], state.padding)
        if (
            settings.compile_prefill
            and prefill_chunk is not None
            and generation_config.prefill_chunk_size is None
            and not generation_config.disable_compile
        ):
            # A vision-language prompt is prefilled in one piece (multimodal.media_plan).
            set_option("prefill_chunk_size", shapes.prompt if media is not None and media.one_piece else prefill_chunk)
            state.forced_chunk = True
    return call, state, out_device


def _callbacks_on_caller_device(call: dict, state: CallState, device: Any) -> None:
    """The user's callbacks get their tensors where upstream hands them (``policy.callback_device``):
    their processors and criteria are remembered (wrapped in the decoding loop, once upstream merged them
    with its own), ``prefix_allowed_tokens_fn`` is wrapped here."""
    where, why = policy.callback_device(getattr(device, "type", None))
    if where != "caller":
        return
    user = [*(call.get("logits_processor") or ()), *(call.get("stopping_criteria") or ())]
    function = call.get("prefix_allowed_tokens_fn")
    if not user and function is None:
        return
    logger.debug("transformers-tpu-ext: callbacks: %s", why)
    state.callback_device = device
    state.user_callbacks = frozenset(id(callback) for callback in user)
    if function is not None:
        call["prefix_allowed_tokens_fn"] = ids_on(function, device)
def _length_plan(
    model: Any, call: dict, generation_config: Any, settings: Any, plan: Any, mask: Any = None, shapes: Any = None
) -> Any:
    """``length_readers.generation_plan`` for a model whose rotary embedding reads the length, else ``None``."""
    import torch

    readers = length_readers.model_lengths(model)
    if not readers:
        return None
    main = call.get("inputs") if call.get("inputs") is not None else call.get("input_ids")
    if not isinstance(main, torch.Tensor) or main.dim() < 2:
        main = call.get("inputs_embeds")
    columns = int(main.shape[1]) if isinstance(main, torch.Tensor) and main.dim() >= 2 else 0
    # Before the tensors reach the CPU only the columns count (whether the call is upstream's); the
    # mask (the longest row) is read for the bucket plan, on the CPU.
    longest = int(mask.sum(dim=-1).max()) if isinstance(mask, torch.Tensor) and mask.dim() == 2 else columns
    if generation_config.max_new_tokens is not None:
        new_tokens = int(generation_config.max_new_tokens)
    else:
        new_tokens = int(generation_config.max_length or 0) - columns
    bucketed = shapes is not None and plan.bucket
    return length_readers.generation_plan(
        readers,
        columns=columns,
        longest=longest,
        new_tokens=new_tokens,
        padded=shapes.prompt if bucketed else None,
        chunk=shapes.chunk if bucketed and shapes.chunk < shapes.prompt else None,
        caller_chunk=generation_config.prefill_chunk_size,
    )


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


def _other_batched_inputs(call: dict, main_name: str) -> list[str]:
    """Tensors we would have to pad along with the prompt (pixel values, positions...): ``multimodal.media_plan``."""
    import torch

    allowed = {main_name, "input_ids", "attention_mask", "inputs_embeds"}
    return sorted(name for name, value in call.items() if isinstance(value, torch.Tensor) and name not in allowed)


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


def _restore(result: Any, state: CallState, device: Any, model: Any) -> Any:
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
        key = cache_key()
        returned = getattr(result, key, None)
        if state.user_cache_kind is not None and returned is not None and (
            state.plan.bucket or state.plan.static_cache or static_cache.layers_replaced(returned)
        ):
            setattr(result, key, static_cache.as_upstream_returns(
                model, returned, state.user_cache_kind, state.padding, state.upstream_cache_length
            ))
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
