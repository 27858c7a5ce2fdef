"""Generation: plain ``generate()`` is correct and fast on TPU.

The decisions (pure modules, no torch, no Transformers):

- :mod:`.policy`: which path a call takes (left to upstream, or handled: static cache, buckets,
  the device loop, masks built on the device), one "safe when" predicate per path, with the reason;
- :mod:`.device_policy`: the KV cache's format (``kv_cache_choice``) and the compile settings
  (``tpu_compile_settings``), re-exported by :mod:`.policy`;
- :mod:`.paths`: the docs table of those paths (what you write -> the path), computed from them;
- :mod:`.buckets`: the padded shapes of a call (prompt, batch, cache) and what padding costs;
- :mod:`.config`: the settings (``TRANSFORMERS_TPU_EXT_*`` variables, :func:`configure`).

The runtime the wrappers use: :mod:`.views` (what callbacks see: the caller's rows and lengths),
:mod:`.device_decode` (token choice on the TPU: only token ids cross the host link),
:mod:`.static_cache` (cache shapes, the cache handed back), :mod:`.warm_up` (its warm-up:
``generation.warmup`` is :func:`~.warm_up.warmup_generate`, ``transformers_tpu_ext.warmup``'s generate work).

The glue: ``patch_generation`` (the patch) applies the wrappers of :mod:`.wrap_generate`,
:mod:`.wrap_prepare`, :mod:`.wrap_decoding` and :mod:`.wrap_compile`, which share the call in flight
through :mod:`.call`; ``patch_recompile_guard_generate`` runs each call on a TPU inside the recompile
guard (``compilation``). See ``docs/generation.md``.
"""

from __future__ import annotations

from .config import TPUGenerationConfig, configure, current, reset
from .warm_up import warmup_generate as warmup

__all__ = ["TPUGenerationConfig", "configure", "current", "reset", "warmup"]
