"""The step shapes of continuous batching on TPU: the token and request ladders, and a step's padded (Q, S).

Plain functions over ints (no torch, no transformers); see ``docs/serving.md`` and ``serving.policy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..ladders import geometric_ladder, round_up

__all__ = ["MIN_REQUESTS", "MIN_TOKENS", "capped_rungs", "request_ladder", "step_shape", "step_shapes", "token_ladder"]

#: Smallest padded token count (the bf16 sublane tile) and smallest padded request count (vLLM TPU).
MIN_TOKENS = 16
MIN_REQUESTS = 8


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def token_ladder(max_batch_tokens: int) -> tuple[int, ...]:
    """Padded token counts: 16, 32, 64, ... doubling up to ``max_batch_tokens`` (its last rung)."""
    _positive("max_batch_tokens", max_batch_tokens)
    if max_batch_tokens <= MIN_TOKENS:
        return (max_batch_tokens,)
    return geometric_ladder(MIN_TOKENS, max_batch_tokens, 1, 1)


def request_ladder(max_requests: int) -> tuple[int, ...]:
    """Padded request counts: 8, 16, 32, ... doubling up to ``max_requests`` (its last rung)."""
    _positive("max_requests", max_requests)
    if max_requests <= MIN_REQUESTS:
        return (max_requests,)
    return geometric_ladder(MIN_REQUESTS, max_requests, 1, 1)


def step_shape(
    num_tokens: int, num_requests: int, tokens: Sequence[int], requests: Sequence[int]
) -> tuple[int, int]:
    """The padded ``(Q, S)`` of a step that schedules ``num_tokens`` tokens of ``num_requests`` requests.

    Raises ``ValueError`` past the largest rung: the scheduler never schedules more than
    ``max_batch_tokens`` tokens or ``max_requests`` requests.
    """
    if num_requests < 1 or num_tokens < num_requests:
        raise ValueError(f"a step has at least one token per request (got {num_tokens} tokens, {num_requests} requests)")
    if num_tokens > tokens[-1] or num_requests > requests[-1]:
        raise ValueError(
            f"a step of {num_tokens} tokens and {num_requests} requests is past the largest bucket "
            f"({tokens[-1]} tokens, {requests[-1]} requests)"
        )
    q = round_up(num_tokens, tokens)
    return q, min(round_up(num_requests, requests), q)


def step_shapes(tokens: Sequence[int], requests: Sequence[int]) -> list[tuple[int, int]]:
    """Every ``(Q, S)`` :func:`step_shape` can return: what a warm-up compiles, smallest first."""
    shapes = set()
    for q in tokens:
        for i, s in enumerate(requests):
            # S reaches rung s only if it exceeds the rung below, and S <= Q <= q.
            if i == 0 or requests[i - 1] < q:
                shapes.add((q, min(s, q)))
    return sorted(shapes)



def _capped(buckets: tuple[int, ...], top: int) -> tuple[int, ...]:
    kept = tuple(b for b in buckets if b < top)
    return (*kept, top)


def capped_rungs(settings: Any, max_batch_tokens: int, max_requests: int) -> list[str]:
    """One message per explicit ladder a manager's smaller limits cut (its rungs past the limit are unused).

    The settings refuse rungs past their own limits; a ``ContinuousBatchingConfig`` with a smaller
    ``max_batch_tokens`` / ``max_requests_per_batch`` still cuts them, and the user is told.
    """
    notes = []
    for name, top, field_name in (
        ("token_buckets", max_batch_tokens, "max_batch_tokens"),
        ("request_buckets", max_requests, "max_requests_per_batch"),
    ):
        value = getattr(settings, name)
        dropped = [b for b in value or () if b > top]
        if dropped:
            notes.append(
                f"the TPU serving {name} {', '.join(map(str, dropped))} go past this manager's {field_name}={top} "
                f"(its ContinuousBatchingConfig): they are not used; the ladder is {_capped(value, top)}"
            )
    return notes
