"""Wrappers of the decoding methods, ``sample`` and ``beam_search``, inside a handled call.

Logits processors, stopping criteria, ``prefix_allowed_tokens_fn`` and streamers see only the
caller's rows and columns (``views``); the call's 4D masks are built on the device from its 2D
mask, sent once (where ``policy.mask_path`` allows it); greedy decoding and sampling run the device
loop (``device_decode``) when ``policy.decode_path`` finds nothing that needs the logits on the host.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Any

from . import policy
from .call import CURRENT, CallState, bind, cache_key, custom_masks, in_handled_call, report_failure, warn_unaccelerated
from .sampling import draws_on_device
from .views import CriteriaView, ProcessorsView, on_device


logger = logging.getLogger("transformers_tpu_ext")


def sample(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    state = CURRENT.get()
    if state is None or state.plan.upstream:
        return wrapped(*args, **kwargs)
    arguments = bind("_sample", args, kwargs)
    try:
        facts = _loop_facts(instance, state, arguments)
        path, masks = policy.decode_path(facts), policy.mask_path(facts)
    except Exception as error:  # a bug of ours: upstream's loop (with the caller's views)
        report_failure("_sample", error)
        path = masks = policy.DecodePath(False, "fallback")
    logger.debug("transformers-tpu-ext: decoding loop on the %s (%s)", "device" if path.device else "host", path.reason)
    if not path.device:
        warn_unaccelerated(instance, "host", path.reason, path.hint)
    _user_callbacks_on_device(state, arguments)
    padding = state.padding
    if padding:
        arguments["stopping_criteria"] = CriteriaView(arguments["stopping_criteria"], padding)
    with _device_mask(instance, state, arguments, masks) as mask:
        if not path.device or mask is None:
            if padding:
                arguments["logits_processor"] = ProcessorsView(arguments["logits_processor"], padding)
            # Upstream's loop samples on the host here: its draws go to the TPU's generator, as unpatched.
            with draws_on_device(state.input_device, _draws_on_device(state, arguments)):
                return wrapped(**arguments)
        # Not fail-safe past this point: the loop consumes the cache, so a second run could not start
        # afresh; an error here (the model's, or ours) is the call's error.
        from .device_decode import sample_on_device

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
            mask=mask,
        )


def _user_callbacks_on_device(state: CallState, arguments: dict) -> None:
    """The user's own processors and criteria get tensors on the call's input device (``views.on_device``)."""
    if state.callback_device is None:
        return
    for name in ("logits_processor", "stopping_criteria"):
        arguments[name] = on_device(arguments[name], state.user_callbacks, state.callback_device)


def _draws_on_device(state: CallState, arguments: dict) -> bool:
    """Whether upstream's loop, sampling here over host probabilities, draws on the device: where the
    call's inputs are on the device, as upstream then samples there (with host inputs it samples on the host)."""
    return bool(arguments["generation_config"].do_sample) and getattr(state.input_device, "type", "cpu") != "cpu"


def _loop_facts(model: Any, state: CallState, arguments: dict) -> policy.LoopFacts:
    """The facts of this decoding loop (``policy.decode_path`` / ``policy.mask_path`` read them)."""
    from .static_cache import cache_kind

    generation_config = arguments["generation_config"]
    returns = bool(generation_config.return_dict_in_generate)
    return policy.LoopFacts(
        mode=generation_config.get_generation_mode().value,
        device_decode=state.settings.device_decode,
        processors=tuple(type(p).__name__ for p in arguments["logits_processor"]),
        model_kwargs=tuple(k for k, v in arguments.items() if k not in _SAMPLE_PARAMETERS and v is not None),
        outputs_scores_or_logits=returns and bool(generation_config.output_scores or generation_config.output_logits),
        outputs_attentions_or_states=returns
        and bool(generation_config.output_attentions or generation_config.output_hidden_states),
        synced_gpus=bool(arguments.get("synced_gpus")),
        custom_mask_function=custom_masks(model),
        cache=cache_kind(arguments.get(cache_key())),
        use_cache=arguments.get("use_cache") is not False,
        causal=getattr(model.config, "is_causal", True) is not False,
        prefill_only=_prefill_only(),
        encoder_decoder=bool(model.config.is_encoder_decoder),
    )


def _prefill_only() -> frozenset[str]:
    """Upstream's model inputs dropped after the prefill (``MULTIMODAL_INPUTS_TO_DROP_OUTSIDE_PREFILL``), if it names them."""
    import sys

    names = getattr(sys.modules.get("transformers.generation.utils"), "MULTIMODAL_INPUTS_TO_DROP_OUTSIDE_PREFILL", ())
    return frozenset(name for name in names if isinstance(name, str))


@contextlib.contextmanager
def _device_mask(model: Any, state: CallState, arguments: dict, masks: policy.DecodePath) -> Any:
    """Within the block, the call's 4D masks are built on the device from its 2D mask (sent once, as
    long as the static cache), where ``masks`` (``policy.mask_path``) says so; yields that mask or ``None``."""
    mask = None
    if masks.device:
        from .device_decode import call_mask

        cache = arguments.get(cache_key())
        try:
            mask = call_mask(arguments.get("attention_mask"), cache, arguments["input_ids"].shape[0], model.device)
        except Exception as error:  # a bug of ours: upstream builds the masks on the host
            report_failure("the call's device mask", error)
        if mask is not None:
            state.device_mask = (cache, mask)
    logger.debug(
        "transformers-tpu-ext: 4D masks built on the %s (%s)", "device" if mask is not None else "host", masks.reason
    )
    try:
        yield mask
    finally:
        state.device_mask = None


_SAMPLE_PARAMETERS = {"input_ids", "logits_processor", "stopping_criteria", "generation_config", "synced_gpus", "streamer"}


def _choice_backend(model: Any, model_kwargs: dict, generation_config: Any) -> Any:
    """The compile backend of the decode step (``None``: not compiled), for the token choice too."""
    if not model._valid_auto_compile_criteria(model_kwargs, generation_config):
        return None
    config = generation_config.compile_config or model._default_compile_config()
    return config.backend


@in_handled_call
def beam_search(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    state = CURRENT.get()
    padding = state.padding
    arguments = bind("_beam_search", args, kwargs)
    _user_callbacks_on_device(state, arguments)
    if padding:
        arguments["logits_processor"] = ProcessorsView(arguments["logits_processor"], padding)
        arguments["stopping_criteria"] = CriteriaView(arguments["stopping_criteria"], padding)
        # Beam search sizes its buffers from max_length and counts the prompt from input_ids: both
        # include the padding columns inside the loop.
        generation_config = copy.copy(arguments["generation_config"])
        generation_config.max_length += padding.pad
        arguments["generation_config"] = generation_config
    # Beams of one prompt share its mask, and upstream only appends ones: the call's mask holds.
    masks = policy.mask_path(_loop_facts(instance, state, {**arguments, "logits_processor": ()}))
    with _device_mask(instance, state, arguments, masks):
        with draws_on_device(state.input_device, _draws_on_device(state, arguments)):  # beam sampling
            return wrapped(**arguments)
