"""Ladders of shape buckets: plain functions over ints, shared by generation, serving and training.

A TPU compiles one program per input shape, so every capability that pads rounds a size up to a
rung of a small, fixed ladder. The ladders themselves (which rungs) are each capability's decision
(``generation.buckets``, ``serving.policy``, ``training.buckets``); building and climbing one is
here, once.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ceil_to", "check_positive", "geometric_ladder", "round_up"]


def check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def geometric_ladder(minimum: int, maximum: int, steps_per_octave: int = 2, multiple: int = 1) -> tuple[int, ...]:
    """Rungs ``minimum * 2**k * (1 + j / steps_per_octave)`` rounded up to ``multiple``, up to ``maximum``.

    Like a float with ``log2(steps_per_octave)`` mantissa bits: ``steps_per_octave`` evenly spaced
    rungs per doubling, so a length is padded by at most a factor ``1 + 1 / steps_per_octave``.
    The last rung is ``maximum`` itself (rounded up to ``multiple``), so every length up to
    ``maximum`` has a rung. ``geometric_ladder(16, 256, 1, 16)`` is the power-of-two ladder
    ``(16, 32, 64, 128, 256)``; with 2 steps per octave it is ``(16, 32, 48, 64, 96, 128, 192, 256)``.
    """
    check_positive(minimum=minimum, maximum=maximum, steps_per_octave=steps_per_octave, multiple=multiple)
    top = ceil_to(max(maximum, minimum), multiple)
    rungs: list[int] = []
    octave = minimum
    while True:
        for j in range(steps_per_octave):
            value = min(ceil_to(-(-octave * (steps_per_octave + j) // steps_per_octave), multiple), top)
            if not rungs or value > rungs[-1]:
                rungs.append(value)
            if value >= top:
                return tuple(rungs)
        octave *= 2


def ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def round_up(value: int, buckets: Sequence[int]) -> int:
    """The smallest bucket ``>= value``; past the largest bucket, the next multiple of it."""
    if value < 0:
        raise ValueError(f"cannot bucket a negative size ({value})")
    if not buckets:
        return value
    for bucket in buckets:
        if bucket >= value:
            return bucket
    return ceil_to(value, buckets[-1])
