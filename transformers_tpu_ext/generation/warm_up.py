"""Generation's warm-up: precompile the buckets a service uses (``transformers_tpu_ext.warmup(model, ...)``,
also ``transformers_tpu_ext.generation.warmup``: :func:`warmup_generate`).

Each (batch bucket, prompt bucket) pair gets one short ``generate()`` (per real batch size when
sampling: ``buckets.warmup_rows``) with the largest static-cache length the service needs, so its
prefill and decode graphs exist and the plugin keeps that cache length for every later call: after
warmup, a mixed workload within the limits compiles nothing new. See ``docs/generation.md``.
"""

from __future__ import annotations

from typing import Any

from . import buckets, recurrent_cache
from . import config as settings_module
from ..compilation import recompile
from ..core.progress import Progress

__all__ = ["precompile", "warmup_generate"]


def precompile(
    model: Any,
    *,
    max_prompt_length: int,
    max_new_tokens: int,
    max_batch_size: int = 1,
    batch_sizes: Any = None,
    **generate_kwargs: Any,
) -> list[buckets.Plan]:
    """Precompile the buckets of prompts up to ``max_prompt_length`` tokens, batches up to
    ``max_batch_size`` rows (or exactly the given ``batch_sizes``) and ``max_new_tokens``.

    Returns the shapes compiled. Extra ``generate_kwargs`` (e.g. ``compile_config``, or the
    service's sampling settings: ``do_sample=True, temperature=0.7, top_p=0.9``) are passed to
    every call; do the same in the service so the graphs match. Sampling chooses tokens over the
    real rows only (so the random stream is the unpadded call's): its small choice graph is per
    real batch size, so a sampling service passes the exact ``batch_sizes`` it serves, and a
    sampling warm-up runs one call per size given (``buckets.warmup_rows``). Off TPU it does nothing
    and returns ``[]``.
    """
    from ..backend import is_tpu

    if max_prompt_length < 1 or max_new_tokens < 1 or max_batch_size < 1:
        raise ValueError("warmup needs max_prompt_length, max_new_tokens and max_batch_size >= 1")
    if not is_tpu(getattr(model, "device", None)):
        return []
    import torch

    settings = settings_module.current()
    # min_padding=1: a prompt of the longest length with no padding gets a padding column (wrap_generate).
    largest = settings.plan(max(batch_sizes or [max_batch_size]), max_prompt_length, max_new_tokens, min_padding=1)
    cache = largest.cache
    # As the service's calls decode: the arguments given, else the model's generation config.
    sampling = bool(generate_kwargs.get("do_sample", model.generation_config.do_sample))
    rows = buckets.warmup_rows(batch_sizes, largest.batch, settings.batch_buckets, sampling=sampling)
    prompts = recurrent_cache.warmup_prompts(model, max_prompt_length, settings)  # a state-space model's own
    if prompts is None:
        prompts = buckets.warmup_prompts(max_prompt_length, settings.prompt_ladder(), settings.prefill_chunk)
    else:  # prefilled in one piece: its longest rung may need a longer cache
        cache = max(cache, buckets.cache_bucket(max(prompts) + max_new_tokens, settings.cache_ladder(), settings.max_cache_len))
    token = _token(model)
    compiled = []
    with Progress(len(rows) * len(prompts), desc="warmup", unit="bucket") as progress:
        for batch in rows:
            for prompt in prompts:
                # One masked (left-padding) column, like the padded calls the service will make.
                ids = torch.full((batch, prompt), token, dtype=torch.long)
                mask = torch.ones_like(ids)
                mask[:, 0] = 0
                # Two tokens: the prefill and one decode step. No end-of-sequence id, so the decode
                # step always runs (a minimum length would add a processor the service does not use).
                model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=2,
                    max_cache_len=cache,
                    **{"do_sample": sampling, "eos_token_id": None, "cache_implementation": "static", **generate_kwargs},
                )
                compiled.append(buckets.Plan(batch, prompt, buckets.prefill_chunk(prompt, settings.prefill_chunk), cache))
                progress.step(f"compiled batch {batch} x prompt {prompt} tokens (cache {cache})")
    return compiled


def _token(model: Any) -> int:
    """A token id that is neither padding nor end of sequence."""
    config = model.generation_config
    special = set()
    for value in (config.pad_token_id, config.eos_token_id, config.bos_token_id):
        special.update(value if isinstance(value, (list, tuple)) else [value])
    vocab = getattr(model.config.get_text_config(), "vocab_size", None) or 2
    return next(t for t in range(vocab) if t not in special) if vocab > len(special) else 0


def warmup_generate(
    model: Any,
    *,
    max_prompt_length: int,
    max_new_tokens: int,
    max_batch_size: int = 1,
    batch_sizes: Any = None,
    **generate_kwargs: Any,
) -> list[Any]:
    """The ``generate()`` buckets within these limits (see ``docs/generation.md#warm-up``); returns
    the shapes compiled. Also ``transformers_tpu_ext.generation.warmup``."""
    covered = {
        "max_prompt_length": max_prompt_length,
        "max_new_tokens": max_new_tokens,
        "max_batch_size": max_batch_size,
        "batch_sizes": sorted(int(b) for b in batch_sizes) if batch_sizes else None,
    }
    with recompile.warming_up("generate", model, covered):
        plans = precompile(
            model,
            max_prompt_length=max_prompt_length,
            max_new_tokens=max_new_tokens,
            max_batch_size=max_batch_size,
            batch_sizes=batch_sizes,
            **generate_kwargs,
        )
        covered["cache"] = max((plan.cache for plan in plans), default=None)
    return plans
