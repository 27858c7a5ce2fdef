"""Patch of ``transformers.generation.utils``: plain ``generate()`` is correct and fast on TPU.

Thin wrappers around ``GenerationMixin`` methods; off TPU (and outside a handled call) each one
calls the original at once. What a call does is decided in :mod:`.policy` (pure), bucket shapes in
:mod:`.buckets` and :mod:`.config`, the device loop in :mod:`.device_decode`, the user's views of a
padded call in :mod:`.views`. The wrappers, by concern:

- :mod:`.wrap_generate`: ``generate`` itself (which calls are handled; padding on the way in,
  off on the way out);
- :mod:`.wrap_prepare`: upstream's preparation steps (lengths, logits processors, the static
  cache, the inputs of each forward, the mask builder ``create_masks_for_generate``);
- :mod:`.wrap_decoding`: the decoding loops ``_sample`` and ``_beam_search``;
- :mod:`.wrap_compile`: the ``CompileConfig`` the ``tpu`` backend takes.

They share the state of the call in flight through :mod:`.call`.
"""

from __future__ import annotations

from typing import Any

from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps
from . import wrap_compile, wrap_decoding, wrap_generate, wrap_media, wrap_prepare
from .call import record_signature

NAME = "generation"
TARGET = "transformers.generation.utils"
DISTRIBUTION = "transformers"
RELIES_ON = (
    # The wrapped GenerationMixin methods, with the parameters each wrapper reads by name (call.bind).
    Signature(
        "GenerationMixin.generate",
        ("generation_config", "logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "assistant_model",
         "streamer", "custom_generate"),
        positional=("inputs", "generation_config"),
    ),
    Signature("GenerationMixin._prepare_generated_length", ("input_ids_length",)),
    Signature("GenerationMixin._validate_generated_length", ("input_ids_length",)),
    Signature("GenerationMixin._get_logits_processor", ("input_ids_seq_length", "model_kwargs")),
    Signature("GenerationMixin._prepare_cache_for_generation", ("generation_config", "max_cache_length")),
    Signature("GenerationMixin._prepare_static_cache"),
    Signature("GenerationMixin._get_static_cache_init_shape"),
    Signature("GenerationMixin._valid_auto_compile_criteria", positional=("model_kwargs", "generation_config")),
    Signature("GenerationMixin.prepare_inputs_for_generation", ("position_ids",)),
    Signature(
        "GenerationMixin._sample",
        ("input_ids", "logits_processor", "stopping_criteria", "generation_config", "synced_gpus", "streamer"),
    ),
    Signature("GenerationMixin._beam_search", ("logits_processor", "stopping_criteria", "generation_config")),
    # What the wrappers call on the model and the call's generation config.
    Signature("GenerationMixin._prepare_generation_config", positional=("generation_config",)),
    Signature(
        "GenerationMixin._prepare_attention_mask_for_generation",
        positional=("inputs_tensor", "generation_config", "model_kwargs"),
    ),
    Signature("GenerationMixin._supports_default_dynamic_cache"),
    Signature("GenerationConfig.get_generation_mode", positional=("assistant_model",)),
    Attribute("transformers.generation.configuration_utils:CompileConfig.backend"),
    Attribute("transformers.generation.configuration_utils:CompileConfig.mode"),
    Attribute("transformers.generation.configuration_utils:CompileConfig.options"),
    Attribute("transformers.generation.configuration_utils:CompileConfig.dynamic"),
    # The mask builder bound here (read: args[1] / inputs_embeds=, and the cache, 4th: ``cache`` from 5.24 on,
    # ``past_key_values`` in 5.23, where the device-built masks never match and upstream's builder runs).
    Signature("create_masks_for_generate", positional=("config", "inputs_embeds", "attention_mask")),
    # The static cache's layers the plugin replaces and rebuilds (static_cache).
    Signature("transformers.cache_utils:get_layer_types_and_kwargs", positional=("config",)),
    Signature("transformers.cache_utils:StaticLayer", ("max_cache_len",)),
    Signature("transformers.cache_utils:StaticLayer.lazy_initialization", positional=("key_states", "value_states")),
    Attribute("transformers.cache_utils:StaticSlidingWindowLayer"),
    Signature("transformers.cache_utils:StaticCache", ("config", "max_cache_len")),
    Signature("transformers.cache_utils:DynamicCache", ("config",)),
    # State-space and hybrid models (recurrent): the fixed-shape recurrent states the static cache holds, and the
    # recurrent layers' 2D mask, sliced to a forward's last tokens (why the device mask holds for decode steps only).
    Attribute("transformers.cache_utils:LinearAttentionLayer"),
    Attribute("transformers.cache_utils:LinearAttentionAndStaticFullAttentionLayer"),
    Signature("transformers.masking_utils:create_recurrent_attention_mask", positional=("config", "inputs_embeds", "attention_mask")),
    # PreTrainedModel._default_compile_config (read by the device loop) is in transformers.modeling_utils, which
    # may still be importing when this target is: not checked here.
)

_wraps = Wraps()

#: ``GenerationMixin`` method -> its wrapper.
_WRAPPERS = {
    "generate": wrap_generate.generate,
    "_prepare_generated_length": wrap_prepare.prepare_generated_length,
    "_validate_generated_length": wrap_prepare.validate_generated_length,
    "_get_logits_processor": wrap_prepare.get_logits_processor,
    "_prepare_cache_for_generation": wrap_prepare.prepare_cache_for_generation,
    "_prepare_static_cache": wrap_prepare.prepare_static_cache,
    "_get_static_cache_init_shape": wrap_prepare.get_static_cache_init_shape,
    "_valid_auto_compile_criteria": wrap_compile.valid_auto_compile_criteria,
    "prepare_inputs_for_generation": wrap_prepare.prepare_inputs_for_generation,
    "_sample": wrap_decoding.sample,
    "_beam_search": wrap_decoding.beam_search,
}


#: Wrapped where the installed release has them (Transformers 5.25 encodes images before the prefill).
_OPTIONAL_WRAPPERS = {"_prepare_multimodal_encoder_kwargs_for_generation": wrap_media.prepare_multimodal_encoder}


def apply(module: Any) -> None:
    mixin = module.GenerationMixin
    for name, wrapper in _WRAPPERS.items():
        record_signature(name, getattr(mixin, name))
        _wraps.wrap(mixin, name, wrapper)
    for name, wrapper in _OPTIONAL_WRAPPERS.items():
        if hasattr(mixin, name):
            _wraps.wrap(mixin, name, wrapper)
    original = module.create_masks_for_generate
    _wraps.replace(module, "create_masks_for_generate", wrap_prepare.masks_for_generate(original))


def revert() -> None:
    _wraps.unwrap_all()
    wrap_compile.restore()
