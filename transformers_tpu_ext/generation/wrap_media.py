"""Vision-language ``generate()`` calls padded to buckets (the glue of ``multimodal.media_plan``), and Whisper's.

- :func:`media_facts`: what ``multimodal.media_plan`` decides from, read off the model and the call;
- :func:`pad_media`: the call's per-column inputs padded on the left with text (0), and the dummy rows'
  placeholders (image tokens) replaced by the pad token and masked, so the dummy rows hold no image;
- :func:`prepare_multimodal_encoder` (wraps ``GenerationMixin._prepare_multimodal_encoder_kwargs_for_generation``
  in a handled call): upstream's image encoder gets its inputs on the model's device (the call keeps
  ``image_grid_thw`` beside the token ids, on the host, for the M-RoPE positions read before it); then, as the
  unpadded call's unchunked prefill would, the model's own ``get_placeholder_mask`` checks that the prompt holds
  as many placeholders as the images have features, so a prompt with more image tokens than images fails with
  the model's own error (the one-piece prefill would fail elsewhere, in upstream's chunk slicing);
- :func:`plan_encoder_decoder`: an encoder-decoder call (``seq2seq``: Whisper) with the static cache.
"""

from __future__ import annotations

import logging
from typing import Any

from . import multimodal
from .call import CURRENT, CallState, in_handled_call

_logger = logging.getLogger("transformers_tpu_ext")

__all__ = ["media_facts", "pad_media", "placeholder_ids", "plan_encoder_decoder", "prepare_multimodal_encoder"]

#: Config fields naming the placeholder tokens features are scattered onto.
_PLACEHOLDER_FIELDS = ("image_token_id", "image_token_index", "video_token_id", "audio_token_id")


def placeholder_ids(model: Any) -> tuple[int, ...]:
    """The token ids the model scatters media features onto (its config's ``image_token_id``...)."""
    found = []
    for name in _PLACEHOLDER_FIELDS:
        value = getattr(model.config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            found.append(value)
    return tuple(sorted(set(found)))


def reads_media(model: Any) -> bool:
    """Whether the model reads images, video or audio besides text (its config has a vision or audio sub-config)."""
    config = model.config
    return any(getattr(config, name, None) is not None for name in ("vision_config", "audio_config"))


def media_facts(model: Any, call: dict, extras: list[str], ids: Any) -> multimodal.MediaCall:
    """The :class:`~.multimodal.MediaCall` of a call whose tensors ``extras`` (by name) go beyond ids and mask."""
    import torch

    shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else None
    per_column = {name for name in extras if tuple(call[name].shape) == shape}
    pre_encodes = bool(getattr(model, "_supports_mm_encoder_outputs", lambda: False)()) and hasattr(
        model, "_prepare_multimodal_encoder_kwargs_for_generation"
    )
    return multimodal.MediaCall(
        family=getattr(model.config, "model_type", None),
        per_column=frozenset(per_column),
        per_item=frozenset(set(extras) - per_column),
        placeholder_ids=bool(placeholder_ids(model)),
        pre_encodes=pre_encodes,
    )


def pad_media(call: dict, model: Any, ids: Any, mask: Any, pad: int, real_rows: int, padded_rows: int) -> tuple[Any, Any]:
    """Pad the call's per-column inputs (in ``call``) like ``ids``: ``pad`` columns of 0 on the left, and
    ``padded_rows - real_rows`` dummy rows; returns ``(ids, mask)``'s dummy rows with no placeholder left
    (``ids`` and ``mask`` already padded on the left, still ``real_rows`` rows)."""
    import torch

    columns = [name for name in multimodal.PER_ROW_PADDING if isinstance(call.get(name), torch.Tensor)]
    for name in columns:
        value = call[name]
        if pad:
            value = torch.cat([value.new_full((value.shape[0], pad), multimodal.PER_ROW_PADDING[name]), value], dim=1)
        call[name] = value
    if padded_rows == real_rows:
        return ids, mask
    extra = padded_rows - real_rows
    first = ids[:1]
    media = torch.isin(first, torch.tensor(placeholder_ids(model), dtype=first.dtype))
    for name in columns:
        media |= call[name][:1] != multimodal.PER_ROW_PADDING[name]
    dummy_ids = torch.where(media, torch.full_like(first, _pad_id(model)), first)
    dummy_mask = torch.where(media, torch.zeros_like(mask[:1]), mask[:1])
    for name in columns:
        value = call[name]
        dummy = torch.full_like(value[:1], multimodal.PER_ROW_PADDING[name])
        call[name] = torch.cat([value, dummy.expand(extra, -1)], dim=0)
    return (torch.cat([ids, dummy_ids.expand(extra, -1)], dim=0), torch.cat([mask, dummy_mask.expand(extra, -1)], dim=0))


def _pad_id(model: Any) -> int:
    pad = getattr(model.generation_config, "pad_token_id", None)
    if isinstance(pad, (list, tuple)):
        pad = pad[0] if pad else None
    return int(pad) if isinstance(pad, int) and pad >= 0 else 0


@in_handled_call
def prepare_multimodal_encoder(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    # Upstream encodes the images eagerly, before the prefill, with the model_kwargs as they are: the call
    # keeps image_grid_thw on the host (the positions read it with the ids); the encoder gets it, and the
    # pixels, on the model's device.
    state = CURRENT.get()
    if state.media is None:
        return wrapped(*args, **kwargs)
    model_kwargs = kwargs.get("model_kwargs", args[0] if args else None)
    device = instance.device
    for name in state.media.host:
        value = model_kwargs.get(name)
        if value is not None and value.device != device:
            model_kwargs[name] = value.to(device)
    result = wrapped(*args, **kwargs)
    check = _placeholder_check(instance, state.media_ids, result)
    if check is not None:
        check()  # the model's own error, as the unpadded call raises it
    return result


def _placeholder_check(model: Any, ids: Any, model_kwargs: Any) -> Any:
    """The model's ``get_placeholder_mask`` over the call's ids and its images' features (a callable), or ``None``
    where it cannot be called so (a family whose method takes other arguments: the call goes on)."""
    import inspect

    import torch

    outputs = (model_kwargs or {}).get("mm_encoder_outputs") or {}
    image = outputs.get("image")
    check = getattr(getattr(model, "model", None), "get_placeholder_mask", None)
    if image is None or ids is None or check is None or "image_features" not in inspect.signature(check).parameters:
        return None
    pooled = image["pooler_output"]  # as the model's forward takes it: a tensor, or pieces it concatenates
    features = torch.cat([p.detach().cpu() for p in pooled]) if isinstance(pooled, (list, tuple)) else pooled.detach().cpu()
    embeds = torch.empty((*ids.shape, features.shape[-1]), dtype=features.dtype)
    return lambda: check(ids.cpu(), inputs_embeds=embeds, image_features=features)


def plan_encoder_decoder(model: Any, call: dict, settings: Any, plan: Any) -> Any:
    """An encoder-decoder call (``policy._encoder_decoder_plan``): the static cache where the caller asked for
    none, its length bucketed (``wrap_prepare``); inputs, prompt and batch as given, on the devices given (the
    encoder runs before the loop, on the model's device; upstream grows the decoder's tensors beside them).

    The result comes back on the host: this ``generate()`` is the one Whisper's own ``generate()`` calls for
    each 30-s segment (``seq2seq``), whose post-processing reads every row's tokens one by one (a new program
    per transcript length on the device) before it puts its own result on the model's device."""
    import copy

    import torch

    which = "the plugin's default" if plan.static_cache else "the caller's"
    _logger.debug("transformers-tpu-ext: generate() handled: %s static cache; encoder-decoder, cache length bucketed", which)
    call = dict(call)
    main = call.get("inputs") if call.get("inputs") is not None else call.get(model.main_input_name)
    state = CallState(settings=settings, plan=plan, input_device=getattr(main, "device", None))
    if plan.static_cache:
        if call.get("generation_config") is not None:
            call["generation_config"] = copy.deepcopy(call["generation_config"])
            call["generation_config"].cache_implementation = "static"
        else:
            call["cache_implementation"] = "static"
    return call, state, torch.device("cpu")
