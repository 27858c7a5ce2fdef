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
    processor: Any = None,
    images: Any = None,
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

    A vision-language model also takes its ``processor`` and ``images``: one image of each size the
    service gets (the processor's output shapes depend on it); every bucket then runs once per sequence of
    0 to ``batch`` images of those sizes (``multimodal.warmup_image_sets``), its prompt counted with the
    images' tokens (``max_prompt_length`` too).
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
    if model.config.is_encoder_decoder:
        return _precompile_encoder_decoder(model, rows, max_new_tokens, cache, {"do_sample": sampling, **generate_kwargs})
    if processor is not None and images:
        return _precompile_media(model, processor, list(images), rows, prompts, cache, token,
                                 {"do_sample": sampling, **generate_kwargs}, settings)
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


def _media_row(processor: Any, image: Any, length: int, token: int) -> dict[str, Any] | None:
    """One prompt row of ``length`` columns: ``image``'s placeholder tokens as the processor expands them
    (none for ``None``) last, ``token`` before them, the per-column inputs the processor makes (0 on the
    filler); ``None`` if the image does not fit."""
    import torch

    if image is None:  # the per-column inputs the processor makes for text too (Gemma 3's token_type_ids)
        out = {k: v[:, :0] for k, v in processor(text=["a"], return_tensors="pt").items() if isinstance(v, torch.Tensor)}
    else:
        out = dict(processor(text=[processor.image_token], images=[[image]], return_tensors="pt"))
    columns = out["input_ids"].shape
    fill = length - columns[1]
    if fill < 1:
        return None
    row = {}
    for name, value in out.items():
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape == columns:
            filler = {"input_ids": token, "attention_mask": 1}.get(name, 0)
            value = torch.cat([value.new_full((1, fill), filler), value], dim=1)
        row[name] = value
    return row


def _precompile_media(
    model: Any, processor: Any, images: list, rows: list, prompts: list, cache: int, token: int, kwargs: dict, settings: Any
) -> list[buckets.Plan]:
    """:func:`precompile` for a vision-language model: every bucket once per sequence of images."""
    import torch

    from .multimodal import warmup_image_sets

    compiled = []
    runs = [(b, p, seq) for b in rows for p in prompts for seq in warmup_image_sets(b, len(images))]
    with Progress(len(runs), desc="warmup", unit="bucket") as progress:
        for batch, prompt, seq in runs:
            parts = [_media_row(processor, images[i] if i is not None else None, prompt, token)
                     for i in (*seq, *([None] * (batch - len(seq))))]
            if any(part is None for part in parts):
                progress.step(f"skipped batch {batch} x prompt {prompt} tokens: the images do not fit")
                continue
            call = {}
            for name in {key for part in parts for key in part}:  # rows stacked; per-image inputs in row order
                values = [part[name] for part in parts if name in part]
                call[name] = torch.cat(values, dim=0)
            call["attention_mask"][:, 0] = 0
            call = {name: value.to(model.device) for name, value in call.items()}
            model.generate(**call, max_new_tokens=2, max_cache_len=cache,
                           **{"eos_token_id": None, "cache_implementation": "static", **kwargs})
            compiled.append(buckets.Plan(batch, prompt, buckets.prefill_chunk(prompt, settings.prefill_chunk), cache))
            progress.step(f"compiled batch {batch} x prompt {prompt} tokens, {len(seq)} images (cache {cache})")
    return compiled


def _precompile_encoder_decoder(model: Any, rows: list, max_new_tokens: int, cache: int, kwargs: dict) -> list[buckets.Plan]:
    """:func:`precompile` for an encoder-decoder model (``seq2seq``: Whisper's fixed 30-s features): each batch
    size makes 1 to ``max_new_tokens`` tokens (end of sequence suppressed), so its decode step, the cache length
    and the post-processing of every transcript length (Whisper's ``generate()`` pads them on the device) exist."""
    import torch

    encoder = model.get_encoder()
    frames = model.config.max_source_positions * encoder.conv1.stride[0] * encoder.conv2.stride[0]
    eos = model.generation_config.eos_token_id
    suppress = [*(model.generation_config.suppress_tokens or ()), *(eos if isinstance(eos, (list, tuple)) else [eos])]
    compiled = []
    with Progress(len(rows) * max_new_tokens, desc="warmup", unit="call") as progress:
        for batch in rows:
            features = torch.zeros((batch, model.config.num_mel_bins, frames), dtype=model.dtype, device=model.device)
            for new in range(1, max_new_tokens + 1):
                model.generate(features, max_new_tokens=new, max_cache_len=cache,
                               **{"suppress_tokens": suppress, "cache_implementation": "static", **kwargs})
                progress.step(f"batch {batch}, {new} new tokens (cache {cache})")
            compiled.append(buckets.Plan(batch, 0, 0, cache))
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
    processor: Any = None,
    images: Any = None,
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
            processor=processor,
            images=images,
            **generate_kwargs,
        )
        covered["cache"] = max((plan.cache for plan in plans), default=None)
    return plans
