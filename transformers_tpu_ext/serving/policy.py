"""Continuous batching on TPU: the policy, as plain functions over ints (no torch, no transformers).

Transformers' continuous batching runs one forward per step over every token scheduled in it. On a
compile-per-shape backend each step's shapes must come from a small fixed set, known before serving
starts, so that a warm-up can compile them all. This module decides that set and sizes the paged KV
cache from the chip's HBM; ``patch_continuous_batching`` glues it into Transformers.

The shapes of one step (see ``docs/serving.md``):

- **Q**, the tokens scheduled, is rounded up to the *token ladder*: doubling from 16 up to
  ``max_batch_tokens`` (vLLM TPU's ``num_tokens`` paddings).
- **S**, the requests in the step, is rounded up to the *request ladder*: doubling from 8 up to
  ``max_requests`` (vLLM TPU's ``num_reqs`` paddings), and never above the padded Q.
- **K**, the cached tokens each request reads, is *data*: every request reads its pages through a
  block table of a fixed width (``blocks_per_request`` pages of ``page_size`` tokens, enough for
  ``max_len`` tokens) and a mask built from positions. K never appears in a shape, so the programs
  are the (Q, S) pairs of the two ladders, whatever the prompt lengths and however long requests run.
- The page size follows vLLM TPU: the max length split into about 16 pages, a power of two in
  [16, 256] (16 past 8192 tokens).

The cache budget: ``HBM - bytes already on the chip (weights) - headroom`` (the placement headroom,
``TRANSFORMERS_TPU_EXT_HBM_HEADROOM``), minus what one step needs on top of the cache at its largest
shape; the rest becomes cache pages.

Whether a manager takes this path at all is :func:`paged_path` (pure "safe when" over
:class:`ServeFacts`): a manager it does not recognise is Transformers' own, unpatched.

This module holds those decisions; the rest of the policy lives in named modules it re-exports:
``serving.shapes`` (the ladders and a step's shape), ``serving.memory`` (pages and the cache budget),
``serving.plan`` (a manager's plan and step statistics) and ``serving.settings`` (the settings).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..ladders import round_up  # noqa: F401 - re-exported (tests pad with it)
from ..quantization import kv_format
from .memory import CachePlan, blocks_per_request, cache_plan, fit_request, kv_budget, page_size_for, step_bytes
from .plan import ServingPlan, StepStats, plan_for
from .settings import (
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_LEN,
    DEFAULT_MAX_REQUESTS,
    ENV,
    ServeSettings,
    check_environment,
    configure,
    current,
    reset,
)
from .tensor_parallel import TPFacts, tp_path
from .shapes import MIN_REQUESTS, MIN_TOKENS, capped_rungs, request_ladder, step_shape, step_shapes, token_ladder

__all__ = [
    "PAGED_FALLBACKS",
    "PAGED_LATENT_MODELS",
    "PAGED_LAYER_TYPES",
    "ServeFacts",
    "TPFacts",
    "paged_path",
    "kv_cache_path",
    "kv_bytes_per_sector",
    "DEFAULT_MAX_BATCH_TOKENS",
    "DEFAULT_MAX_LEN",
    "DEFAULT_MAX_REQUESTS",
    "ENV",
    "MIN_REQUESTS",
    "MIN_TOKENS",
    "CachePlan",
    "ServeSettings",
    "ServingPlan",
    "StepStats",
    "blocks_per_request",
    "cache_plan",
    "capped_rungs",
    "check_environment",
    "fit_request",
    "configure",
    "current",
    "kv_budget",
    "page_size_for",
    "plan_for",
    "request_ladder",
    "reset",
    "step_bytes",
    "step_shape",
    "step_shapes",
    "token_ladder",
]


#: The attention implementations the TPU paged attention stands in for during the manager's steps,
#: each with the implementation a forward outside those steps keeps (``generate()``, a plain
#: forward, a ``pause()`` block, another route of ``transformers serve``).
PAGED_FALLBACKS: Mapping[str, str] = {"sdpa": "sdpa", "eager": "eager", "paged|eager": "eager"}
#: Text-layer types the paged attention computes as upstream does (full attention; a sliding window
#: applied by its mask over pages that keep the whole history).
PAGED_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
#: Text-layer types holding a recurrent state (state-space, convolution, linear attention), which upstream's
#: paged cache refuses on every device (``generation.recurrent.RECURRENT_LAYER_TYPES``).
RECURRENT_LAYER_TYPES = frozenset({"linear_attention", "conv", "hybrid", "hybrid_sliding"})
#: Models whose paged cache holds multi-head latent attention's compressed latents (a config with
#: ``kv_lora_rank``: Transformers' ``MLACacheAllocator``) and that the TPU paged cache serves: their attention
#: writes the two latents, reads them back and expands them to heads itself (``expand_kv``). Tested ones only.
PAGED_LATENT_MODELS = frozenset({"deepseek_v2", "deepseek_v3"})


@dataclass(frozen=True)
class ServeFacts:
    """What the manager's ``__init__`` wrapper reads off the model (plain data)."""

    tp: TPFacts = TPFacts()  # tensor parallelism (DistributedConfig(tp_size=N)): serving.tensor_parallel
    encoder_decoder: bool = False
    attention: str = "sdpa"  # config._attn_implementation
    layer_types: tuple[str, ...] = ("full_attention",)  # text layers, as the caches see them
    attention_sinks: bool = False  # an attention module with learned sinks (gpt-oss): the paged attention's, not the kernel's
    eager_function: bool = True  # the model's file defines eager_attention_forward (the "eager" fallback)
    latent_cache: str = ""  # the model type, when its config has kv_lora_rank (a paged cache of MLA latents)
    #: What else the model reads besides text ("images", "audio"...: a vision_config, an audio_config), or None.
    media: str | None = None


#: What to use instead of continuous batching for image, video or audio requests (the WARNING names it).
MEDIA_REQUESTS = (
    "Transformers' continuous batching takes text requests only (no images, video or audio); serve requests "
    "with {media} through generate(), padded to buckets and compiled on TPU "
    "(docs/generation.md#vision-language-speech-and-encoder-decoder-models)"
)


def paged_path(facts: ServeFacts) -> tuple[bool, str]:
    """``(True, why)`` if the TPU serving path (planned shapes, the paged attention, the HBM-sized
    cache) computes what upstream computes for this model; else ``(False, why not)``: the manager
    runs unpatched."""
    sharded, why = tp_path(facts.tp)
    if not sharded:
        return False, f"tensor parallelism: {why}"
    if facts.media is not None:
        return False, f"a model that reads {facts.media}: " + MEDIA_REQUESTS.format(media=facts.media)
    if facts.encoder_decoder:
        return False, "an encoder-decoder model"
    if facts.attention not in PAGED_FALLBACKS:
        return False, f"attn_implementation={facts.attention!r} is not one the TPU paged attention stands in for"
    unknown = sorted(set(facts.layer_types) - PAGED_LAYER_TYPES)
    recurrent = [layer for layer in unknown if layer in RECURRENT_LAYER_TYPES]
    if recurrent:
        return False, (
            f"Transformers' continuous batching refuses {', '.join(recurrent)} layers on every device (its paged cache "
            "holds no recurrent state); generate() runs this state-space or hybrid model on TPU instead "
            "(docs/generation.md, 'State-space and hybrid models')"
        )
    if unknown:
        return False, "layers the TPU paged attention does not compute: " + ", ".join(unknown)
    if facts.latent_cache and facts.latent_cache not in PAGED_LATENT_MODELS:
        return False, (
            f"multi-head latent attention ({facts.latent_cache}: its paged cache holds compressed latents, which the "
            "TPU paged cache does not serve for this model)"
        )
    if PAGED_FALLBACKS[facts.attention] == "eager" and not facts.eager_function:
        return False, "the model's eager attention is not the standard one (no eager_attention_forward)"
    return True, "paged attention on TPU (the model's own attention outside the manager's steps)"


def kv_cache_path(setting: str | None, *, paged: bool, dtype: str, latent: bool = False) -> tuple[str | None, str]:
    """``("int8", why)`` if the TPU paged cache stores int8 pages (and a parallel float32 scale per
    position and key-value head), else ``(None, why not)`` (``setting``: ``ServeSettings.kv_cache``).

    Safe when the manager takes the TPU path (:func:`paged_path`: its ``update`` is the one place
    pages are written and read, quantized on write, dequantized on gather) and the model computes in
    a float dtype. A manager left unpatched keeps upstream's cache in the model's dtype.
    """
    if setting != "int8":
        return None, f"the int8 KV cache is off ({ENV['kv_cache']}=int8 turns it on)"
    if not paged:
        return None, "the manager runs unpatched (upstream's paged cache keeps the model's dtype)"
    if dtype not in kv_format.FLOAT_DTYPES:
        return None, f"the model's dtype is {dtype} (int8 pages dequantize to a float dtype)"
    if latent:
        return None, "multi-head latent attention (int8 pages hold keys and values per head; its cache holds latents)"
    return "int8", "int8 pages, one float32 scale per position and key-value head"


def kv_bytes_per_sector(bytes_per_sector: int, head_dim: int, kv_cache: str | None) -> int:
    """Bytes a cache sector costs: its pages, plus (int8) its scales, one per ``head_dim`` int8 bytes."""
    if kv_cache != "int8":
        return bytes_per_sector
    return bytes_per_sector + bytes_per_sector // head_dim * kv_format.SCALE_BYTES
