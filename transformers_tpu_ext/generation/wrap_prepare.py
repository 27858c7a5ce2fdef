"""Wrappers of upstream's preparation steps, active only inside a handled ``generate()`` call.

- ``prepare_generated_length``, ``validate_generated_length``, ``get_logits_processor``: lengths
  keep the caller's meaning (the padding is not counted), in the generation config and in errors.
- ``prepare_cache_for_generation`` / ``prepare_static_cache`` / ``get_static_cache_init_shape``:
  the static cache length is rounded up to a bucket; sliding-window layers become full-length
  layers (masked to the window), so a decode step has one graph however far it is; a cache
  initialised early takes its key-value head count from the attention modules when the config
  states it another way (Falcon).
- ``prepare_inputs_for_generation``: the chunked prefill's position-id slices are made dense, so
  every prompt length reuses the chunk's graph (graphs guard on strides).
- ``create_masks_for_generate`` (the name bound in ``transformers.generation.utils``): while the
  call's masks are built on the device (the prefill chunks and every step, on both loops), the
  call's 2D device mask goes to the model, which builds its 4D masks inside the compiled forward.
"""

from __future__ import annotations

import functools
from typing import Any

from . import recurrent, static_cache
from .call import CURRENT, bind, cache_key, in_handled_call, in_padded_call

@in_padded_call
def prepare_generated_length(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    arguments = bind("_prepare_generated_length", args, kwargs)
    arguments["input_ids_length"] -= CURRENT.get().padding.pad
    return wrapped(**arguments)


@in_padded_call
def validate_generated_length(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    arguments = bind("_validate_generated_length", args, kwargs)
    arguments["input_ids_length"] -= CURRENT.get().padding.pad
    return wrapped(**arguments)


@in_padded_call
def get_logits_processor(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    # Upstream sizes some processors from the prompt (its length, its padding per row): give them the
    # caller's prompt, the one the processors will see through ProcessorsView.
    padding = CURRENT.get().padding
    arguments = bind("_get_logits_processor", args, kwargs)
    if arguments.get("input_ids_seq_length"):
        arguments["input_ids_seq_length"] -= padding.pad
    model_kwargs = arguments.get("model_kwargs")
    if model_kwargs and model_kwargs.get("attention_mask") is not None:
        arguments["model_kwargs"] = {**model_kwargs, "attention_mask": padding.ids(model_kwargs["attention_mask"])}
    return wrapped(**arguments)


@in_handled_call
def prepare_cache_for_generation(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    state = CURRENT.get()
    arguments = bind("_prepare_cache_for_generation", args, kwargs)
    generation_config = arguments["generation_config"]
    # Transformers' attribute is its own (restored after every handled call): the length upstream
    # would give a static cache is computed from it, the plugin's from its own floor too.
    previous = static_cache.upstream_previous(instance)
    upstream_previous = previous if isinstance(previous, int) else -1
    state.upstream_cache_length = max(arguments["max_cache_length"], generation_config.max_cache_len or 0, upstream_previous)
    state.upstream_previous = previous
    if generation_config.cache_implementation == "static":
        if not state.plan.static_cache:
            # The caller asked for a static cache: upstream would have made one this long, and kept it.
            state.upstream_previous = state.upstream_cache_length
        needed = max(
            arguments["max_cache_length"] + state.padding.pad,
            generation_config.max_cache_len or 0,
            getattr(instance, static_cache.FLOOR, 0),
            upstream_previous,
            1,
        )
        generation_config.max_cache_len = _cache_length(state.settings, needed) if state.plan.bucket else needed
    return wrapped(**arguments)


def _cache_length(settings: Any, needed: int) -> int:
    from .buckets import cache_bucket

    return cache_bucket(needed, settings.cache_ladder(), settings.max_cache_len)


@in_handled_call
def prepare_static_cache(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    cache = wrapped(*args, **kwargs)
    # A sliding-window layer keeps its length as a Python int and branches on it: a compiled decode
    # step is guarded on that int, so it compiles anew every step until the window is full, then on
    # every kv offset. A full-length layer masked to the window computes the same attention with a
    # length held in a tensor: one graph. (It holds the whole sequence: max_cache_len positions.)
    static_cache.full_length_layers(cache, getattr(instance, "_previous_max_cache_length", None))
    state = CURRENT.get()
    if state.settings.kv_cache is not None:
        static_cache.int8_layers_if_chosen(instance, cache, state.plan, state.settings.kv_cache)
    return cache


@in_handled_call
def get_static_cache_init_shape(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    # Upstream initialises a static cache early (for a compiled prefill) with head counts read from
    # the config, which some models state another way (Falcon's multi-query attention: one key-value
    # head, while the config says num_attention_heads). The attention modules know: when they say
    # otherwise, their count wins. (Initialising from the first chunk's states instead would give
    # the first chunk its own graph per rung: twice the prefill graphs.)
    path = CURRENT.get().recurrent
    if path is not None and not path.attention:
        return None  # no attention layer to initialise (upstream reads head counts a Mamba config has not)
    shape = wrapped(*args, **kwargs)
    if shape is None or not CURRENT.get().forced_chunk or (getattr(instance, "_tp_size", None) or 1) > 1:
        return shape
    heads, head_dim = shape
    seen = static_cache.attention_heads(instance)
    if seen is not None and isinstance(heads, int) and isinstance(head_dim, int) and seen != (heads, head_dim):
        return seen
    return shape


@in_handled_call
def prepare_inputs_for_generation(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
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


def masks_for_generate(original: Any) -> Any:
    """``create_masks_for_generate`` as upstream's ``prepare_inputs_for_generation`` calls it.

    While a call's 4D masks are built on the device (``CallState.device_mask``, set by the decoding
    wrappers where ``policy.mask_path`` allows it), the model gets the call's 2D device mask for
    that call's cache and batch, and builds its 4D masks inside the (compiled) forward; anything
    else gets upstream's function. A plain function (it runs next to compiled code, never inside).
    """

    @functools.wraps(original)
    def create_masks_for_generate(*args: Any, **kwargs: Any) -> Any:
        state = CURRENT.get()
        if state is not None and state.device_mask is not None:
            cache, mask = state.device_mask
            embeds = kwargs.get("inputs_embeds", args[1] if len(args) > 1 else None)
            holds = recurrent.device_mask_holds(state.recurrent, getattr(embeds, "shape", (0, 0))[1])
            if kwargs.get(cache_key(), args[3] if len(args) > 3 else None) is cache and getattr(embeds, "shape", (0,))[0] == mask.shape[0] and holds:
                return mask
        return original(*args, **kwargs)

    return create_masks_for_generate
