"""Patch: the recompile guard around ``generate()`` on TPU (``GenerationMixin.generate``).

One thin wrapper, applied after the ``generation`` patch so that it sees the caller's arguments: a
call on a TPU model runs inside :func:`recompile.guarded` (``work="generate"``); any other call goes
straight to the original. The report names the call's batch, prompt length and ``max_new_tokens``,
the buckets they were padded to, and the ``warmup()`` that covers them (:func:`guard.generate_advice`).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..compilation import guard, recompile
from ..backend import is_tpu
from ..core.relies import Signature
from ..core.wrapping import Wraps, fail_safe

NAME = "recompile_guard_generate"
TARGET = "transformers.generation.utils"
DISTRIBUTION = "transformers"
RELIES_ON = (
    # The report reads args[0] / inputs= (or input_ids=) and generation_config=.
    Signature("GenerationMixin.generate", ("generation_config",), positional=("inputs",)),
)

_wraps = Wraps()


def apply(module: Any) -> None:
    _wraps.wrap(module.GenerationMixin, "generate", _generate)


def revert() -> None:
    _wraps.unwrap_all()


@fail_safe
def _generate(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not is_tpu(getattr(instance, "device", None)):
        return wrapped(*args, **kwargs)
    with recompile.guarded("generate", instance, lambda covered: _facts(instance, args, kwargs, covered)):
        return wrapped(*args, **kwargs)


def _option(instance: Any, kwargs: Mapping[str, Any], name: str) -> Any:
    if kwargs.get(name) is not None:
        return kwargs[name]
    config = kwargs.get("generation_config") or getattr(instance, "generation_config", None)
    return getattr(config, name, None)


def _facts(instance: Any, args: tuple, kwargs: Mapping[str, Any], covered: Mapping[str, Any]) -> recompile.CallFacts:
    ids = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids"))
    shape = tuple(getattr(ids, "shape", ()))
    batch, prompt = (int(shape[0]), int(shape[-1])) if len(shape) >= 2 else (1, int(shape[-1]) if shape else 0)
    new = _option(instance, kwargs, "max_new_tokens")
    if new is None and _option(instance, kwargs, "max_length") is not None:
        new = max(1, int(_option(instance, kwargs, "max_length")) - prompt)
    sampling = bool(_option(instance, kwargs, "do_sample"))
    call = f"a batch of {batch} prompt{'s' if batch != 1 else ''} of {prompt} tokens, max_new_tokens={new}"
    signature = cache = None
    try:
        from . import config as generation_config

        planned = generation_config.current().plan(batch, prompt, int(new or 1))
        # Transformers keeps the longest static cache it made (to avoid recompiling): the one this call ran with.
        cache = max(planned.cache, int(getattr(instance, "_previous_max_cache_length", 0) or 0))
        call += f" (padded to batch {planned.batch} x prompt {planned.prompt} tokens, cache {cache})"
        signature = (planned.batch, planned.prompt, cache, sampling)
    except Exception:  # noqa: BLE001 - settings the generation patch reports itself
        pass
    advice = guard.generate_advice(batch, prompt, new, covered, sampling=sampling, cache=cache)
    return recompile.CallFacts(call=call, advice=advice, signature=signature)
