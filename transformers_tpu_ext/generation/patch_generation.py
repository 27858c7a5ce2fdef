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

from ..core.wrapping import Wraps
from . import wrap_compile, wrap_decoding, wrap_generate, wrap_prepare
from .call import record_signature

NAME = "generation"
TARGET = "transformers.generation.utils"
DISTRIBUTION = "transformers"

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


def apply(module: Any) -> None:
    mixin = module.GenerationMixin
    for name, wrapper in _WRAPPERS.items():
        record_signature(name, getattr(mixin, name))
        _wraps.wrap(mixin, name, wrapper)
    original = module.create_masks_for_generate
    _wraps.replace(module, "create_masks_for_generate", wrap_prepare.masks_for_generate(original))


def revert() -> None:
    _wraps.unwrap_all()
    wrap_compile.restore()
