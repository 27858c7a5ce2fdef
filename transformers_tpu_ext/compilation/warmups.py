"""``warmup(target, work=...)``: compile, before the real work, every program that work will need.

One function, three works (``transformers_tpu_ext.warmup`` is :func:`warmup`):

- ``"generate"`` (the default for a model): every (batch bucket, prompt bucket) of ``generate()``
  calls within the limits given (:func:`transformers_tpu_ext.generation.precompile.warmup`);
- ``"serve"``: every step shape of a continuous-batching manager; returns the manager, warmed up,
  ready to ``start()``;
- ``"train"`` (the default for a ``Trainer``): one training step per sequence bucket when
  ``trainer.train()`` begins (:func:`transformers_tpu_ext.training.warmup`); returns the callback.

Each tells the recompile guard that its work is warmed up. With the persistent compile cache on, the
programs also land on disk: the next process loads them instead of compiling (``transformers-tpu
warmup`` does this ahead of time). See ``docs/compile-cache.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import recompile

__all__ = ["WORKS", "warmup", "warmup_generate", "warmup_serve", "warmup_train"]

WORKS = ("generate", "serve", "train")


def _is_trainer(target: Any) -> bool:
    return any(cls.__name__ == "Trainer" for cls in type(target).__mro__)


def warmup(target: Any, work: str | None = None, **options: Any) -> Any:
    """Precompile ``work`` for ``target`` (a model, or a ``Trainer`` for ``"train"``).

    ``warmup(model, max_prompt_length=512, max_new_tokens=128, max_batch_size=8)`` (generate),
    ``warmup(model, work="serve", generation_config=...)``, ``warmup(trainer, max_length=512)`` (train).
    """
    if work is None:
        work = "train" if _is_trainer(target) else "generate"
    if work not in WORKS:
        raise ValueError(f"warmup(work={work!r}): choose one of {', '.join(map(repr, WORKS))}")
    if work == "train":
        if not _is_trainer(target):
            raise TypeError("warmup(..., work='train') takes the Trainer (warmup(trainer, max_length=...))")
        return warmup_train(target, **options)
    if _is_trainer(target):
        raise TypeError(f"warmup(trainer, work={work!r}): pass the model (trainer.model) for {work!r}")
    if work == "serve":
        return warmup_serve(target, **options)
    return warmup_generate(target, **options)


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
    from ..generation.precompile import warmup as precompile

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


def warmup_serve(
    model: Any,
    *,
    generation_config: Any = None,
    continuous_batching_config: Any = None,
    workload_hints: Any = None,
) -> Any:
    """A continuous-batching manager for ``model`` with every step shape compiled (not started).

    Use it as the service's manager (``manager.start()``), so the programs are the ones it runs; the
    shapes come from the serving settings (``docs/serving.md#settings``).
    """
    manager = model.init_continuous_batching(
        generation_config=generation_config,
        continuous_batching_config=continuous_batching_config,
        workload_hints=workload_hints,
    )
    manager.warmup()  # the recompile guard's serve patch marks it
    return manager


def warmup_train(trainer: Any, max_length: int | None = None, lengths: Iterable[int] | None = None) -> Any:
    """One training step per bucket up to ``max_length`` when ``trainer.train()`` begins (see
    ``docs/training.md``); returns the callback."""
    from ..training.collator import warmup as training_warmup

    return training_warmup(trainer, max_length=max_length, lengths=lengths)
