"""The variables of ``generate()`` on TPU, declared once (read by ``generation.config``, listed in the docs' table).

Pure data; see ``transformers_tpu_ext.settings`` for the layer that parses and checks them.
"""

from __future__ import annotations

from ..quantization.kv_format import FORMATS as _KV_FORMATS
from ..settings.parser import Setting

__all__ = ["SETTINGS"]

_NONE = ("", "none", "default")

#: One per field of ``TPUGenerationConfig`` (see ``docs/generation.md#configuration``).
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE", "switch", "`1`",
        "a static KV cache when the caller asked for none, so decoding compiles once",
        field="static_cache",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_BUCKETS", "switch", "`1`",
        "round prompt length, batch size and cache length up to the buckets",
        field="bucketing",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_COMPILE_PREFILL", "switch", "`1`",
        "the bucketed prefill runs through the compiled forward too",
        field="compile_prefill",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_DEVICE_DECODE", "switch", "`1`",
        "greedy decoding and sampling choose tokens on the TPU",
        field="device_decode",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS", "integers", "a ladder from 16",
        "explicit prompt lengths",
        none_words=_NONE, field="prompt_buckets",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_STEPS_PER_OCTAVE", "integer", "1",
        "rungs per doubling of the default ladders",
        field="steps_per_octave",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_PREFILL_CHUNK", "integer", "64",
        "longer prompts are prefilled chunk by chunk through one graph (`0`: never chunk)",
        none_words=_NONE, field="prefill_chunk",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_BATCH_BUCKETS", "integers", "1, 2, 4, ..., 256",
        "batch sizes (past the last one: its multiples)",
        field="batch_buckets",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_CACHE_BUCKETS", "integers", "a ladder from 64",
        "static-cache lengths",
        none_words=_NONE, field="cache_buckets",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_MAX_CACHE_LEN", "integer", "unset",
        "a floor for the cache length",
        none_words=_NONE, field="max_cache_len",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_RECOMPILE_LIMIT", "integer", "64",
        "TorchDynamo's recompile limit is raised to at least this (and to what the buckets need)",
        field="recompile_limit",
    ),
    Setting(
        "TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE", "choice", "unset (the model's dtype)",
        "int8 keys and values in the static cache the plugin makes (lossy; see "
        "[quantization.md](quantization.md#int8-kv-cache))",
        choices=tuple(_KV_FORMATS), none_words=_NONE, field="kv_cache",
    ),
)
