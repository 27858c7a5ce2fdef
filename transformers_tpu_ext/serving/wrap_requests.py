"""What a TPU continuous-batching manager accepts (glue of ``patch_continuous_batching``).

``add_request``: a request with no prompt token or ``max_new_tokens`` below 1, or longer than the serving max
length, the model's positions or the paged cache's whole pool (``serving.pool``), is refused with a
``ValueError`` naming the limit (``transformers serve`` answers it with a 400) before it can stop the
requests in flight (an empty prompt reached the scheduler and stopped the generation loop: every later
request and ``/health`` answered 503); a ``max_new_tokens`` that would
outgrow either is lowered, with one warning. Within ``add_requests`` (``generate_batch``) such a request
comes back failed, with the message, and the others are served.

``Scheduler.add_waiting_request``: the same pool check when a request reaches the scheduler, for the
requests added before the manager built its cache (before ``start()`` or a warm-up: the pool was not
known yet). Transformers fails that one request alone (``ContinuousBatchProcessor._update_tp_group_state``
delivers it failed, with the message); under tensor parallelism every rank checks the same request.
"""

from __future__ import annotations

import contextvars
from typing import Any

from . import policy as serving
from .plan import plan_of as _plan_of
from ..core.wrapping import logger, warn_once

__all__ = ["add_request", "add_requests", "add_waiting_request", "mark_cache"]

#: Set while ``add_requests`` (``generate_batch``) adds its requests.
_batch_add: contextvars.ContextVar[bool] = contextvars.ContextVar("tpu_ext_cb_batch_add", default=False)



def add_requests(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``add_requests`` (``generate_batch``): a request that cannot fit fails alone (see ``_add_request``)."""
    token = _batch_add.set(True)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _batch_add.reset(token)


def add_request(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    plan = _plan_of(instance.continuous_batching_config)
    if plan is None:
        return wrapped(*args, **kwargs)
    try:
        args, kwargs = _fitted_request(instance, plan, args, kwargs)
    except ValueError as error:  # our own checks only (upstream's add_request raises as it does)
        if not _batch_add.get() or not kwargs.get("request_id"):
            raise
        # Within add_requests (generate_batch) the others were added already: this one comes back failed,
        # with the message, as upstream delivers a request that fails; the others complete.
        from transformers.generation.continuous_batching.requests import RequestState

        warn_once(f"a request of generate_batch failed on TPU: {error}")
        prompt = args[0] if args else kwargs["input_ids"]
        state = RequestState(request_id=kwargs["request_id"], initial_tokens=list(prompt))
        instance.output_router.fail_and_deliver(state, error)
        return kwargs["request_id"]
    return wrapped(*args, **kwargs)


def mark_cache(cache: Any, plan: serving.ServingPlan) -> None:
    """Mark a paged cache built for a TPU plan (its scheduler checks the requests it receives)."""
    cache._tpu_ext_plan = plan


def add_waiting_request(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``Scheduler.add_waiting_request`` of a TPU cache: a request that can never fit the pool raises here
    (upstream fails it alone), one that would outgrow it gets a lower ``max_new_tokens``."""
    plan = getattr(instance.cache, "_tpu_ext_plan", None)
    if plan is None:
        return wrapped(*args, **kwargs)
    from . import pool

    state, cache = args[0] if args else kwargs["state"], instance.cache
    prompt = len(state.initial_tokens)
    within = pool.fit_to_pool(prompt, state.max_new_tokens, cache.max_tokens_read, num_blocks=cache.num_blocks,
                              page_size=plan.page_size)  # ValueError: the request fails alone, with the message
    if state.max_new_tokens is not None and within < state.max_new_tokens:
        _lowered(getattr(state, "request_id", None), state.max_new_tokens, within, cache.max_tokens_read)
        state.max_new_tokens = within
        state._new_tokens_limit = within  # what RequestState.__post_init__ derived from max_new_tokens
    return wrapped(*args, **kwargs)


def _lowered(request_id: Any, asked: int, granted: int, pool_tokens: int) -> None:
    """Say, for every request it happens to, that its ``max_new_tokens`` was lowered to fit the pool (a
    client sees only a length stop)."""
    logger.warning(
        "transformers-tpu-ext: request %s: max_new_tokens lowered from %d to %d to fit the TPU paged KV cache "
        "(%d tokens in all)", request_id if request_id is not None else "(no id yet)", asked, granted, pool_tokens,
    )


def _fitted_request(instance: Any, plan: serving.ServingPlan, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``add_request``'s arguments with ``max_new_tokens`` fitted to the max length and the pool (or ``ValueError``)."""
    input_ids = args[0] if args else kwargs["input_ids"]
    asked = kwargs.get("max_new_tokens", args[2] if len(args) > 2 else None)
    if asked is None:
        asked = instance.generation_config.max_new_tokens
    # an empty prompt, max_new_tokens < 1, a prompt too long raise here: the request fails alone (a 400)
    fitted = serving.fit_request(len(input_ids), asked, plan.max_len, plan.model_positions)
    if fitted != asked and asked is not None:
        warn_once(
            f"max_new_tokens lowered to fit the TPU serving max length ({plan.max_len} tokens; "
            f"{serving.ENV['max_len']} raises it)"
        )
    cache = getattr(instance.batch_processor, "cache", None)  # built by the warm-up: the pool is known
    if cache is not None:
        from . import pool

        within = pool.fit_to_pool(
            len(input_ids), fitted, cache.max_tokens_read, num_blocks=cache.num_blocks, page_size=plan.page_size
        )  # a prompt longer than the whole pool raises here, before it can stop the requests in flight
        if within != fitted:
            _lowered(kwargs.get("request_id", args[1] if len(args) > 1 else None), fitted, within, cache.max_tokens_read)
            fitted = within
    if fitted != asked:
        if len(args) > 2:
            args = (*args[:2], fitted, *args[3:])
        else:
            kwargs = {**kwargs, "max_new_tokens": fitted}
    return args, kwargs
