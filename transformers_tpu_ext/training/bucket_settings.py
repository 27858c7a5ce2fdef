"""The bucketing settings of training batches: the sequence ladder and the environment variables (pure).

:func:`settings` reads ``TRANSFORMERS_TPU_EXT_TRAIN_*`` (declared in :mod:`.settings`); :func:`sequence_ladder`
is the default ladder. Both are also importable from :mod:`.buckets`, whose planner uses them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..ladders import geometric_ladder
from ..settings.parser import OFF_WORDS, ON_WORDS, near_word
from .settings import SETTINGS as _SETTINGS

__all__ = ["ENV", "Settings", "sequence_ladder", "settings", "settings_problems"]

_MINIMUM = 16
_MULTIPLE = 16  # bf16 sublane tile: the hardware pads that far anyway
_TOP = 1 << 20


def sequence_ladder(steps_per_octave: int = 2, minimum: int = _MINIMUM, multiple: int = _MULTIPLE) -> tuple[int, ...]:
    """Sequence-length rungs: ``(16, 32, 48, 64, 96, 128, 192, 256, ...)`` with 2 steps per octave."""
    return geometric_ladder(minimum, _TOP, steps_per_octave, multiple)


#: The environment variables of :func:`settings` (declared in ``training.settings``).
ENV = {s.field: s.name for s in _SETTINGS}


@dataclass(frozen=True)
class Settings:
    """Bucketing of training batches: on or off, the length ladder, the reuse factor."""

    enabled: bool = True
    ladder: tuple[int, ...] = sequence_ladder()
    reuse: float = 1.5


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings from the environment (read at each call; ``ValueError`` names a bad variable).

    - ``TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS``: ``1`` (default) buckets with the geometric ladder, ``0``
      turns bucketing off, a comma list (``128,256,512``) gives the ladder (past its last rung:
      multiples of it).
    - ``TRANSFORMERS_TPU_EXT_TRAIN_STEPS_PER_OCTAVE``: rungs per doubling of the default ladder (2).
    - ``TRANSFORMERS_TPU_EXT_TRAIN_REUSE``: how much longer a rung already used may be and still be
      reused for a shorter batch (1.5; 1 turns reuse off).
    """
    env = os.environ if environ is None else environ
    values, problems = _read(env)
    if problems:
        raise ValueError("; ".join(problems))
    buckets, steps, reuse = values
    if buckets is False:
        return Settings(enabled=False, ladder=(), reuse=reuse)
    if buckets is True:
        return Settings(enabled=True, ladder=sequence_ladder(steps), reuse=reuse)
    return Settings(enabled=True, ladder=buckets, reuse=reuse)


def settings_problems(environ: Mapping[str, str]) -> list[str]:
    """Every invalid training variable in ``environ``, one message each (all at once)."""
    return _read(environ)[1]


def _read(env: Mapping[str, str]) -> tuple[tuple[Any, int, float], list[str]]:
    problems: list[str] = []
    raw = env.get(ENV["buckets"], "").strip()
    steps_raw = env.get(ENV["steps_per_octave"], "").strip()
    reuse_raw = env.get(ENV["reuse"], "").strip()
    steps, reuse, buckets = 2, 1.5, True
    try:
        steps = int(steps_raw) if steps_raw else 2
        if steps < 1:
            raise ValueError
    except ValueError:
        problems.append(f"{ENV['steps_per_octave']}={steps_raw!r}: expected a positive integer")
    try:
        reuse = float(reuse_raw) if reuse_raw else 1.5
        if reuse < 1:
            raise ValueError
    except ValueError:
        problems.append(f"{ENV['reuse']}={reuse_raw!r}: expected a number >= 1 (1 turns reuse off)")
    if not raw or raw.lower() in ON_WORDS:
        buckets = True
    elif raw.lower() in OFF_WORDS:
        buckets = False
    else:
        try:
            buckets = tuple(sorted({int(part) for part in raw.split(",") if part.strip()}))
            if not buckets or buckets[0] < 1:
                raise ValueError
        except ValueError:
            meant = near_word(raw)
            hint = f" (did you mean {meant}?)" if meant else ""
            problems.append(f"{ENV['buckets']}={raw!r}{hint}: expected 1, 0 or a comma list of sequence lengths "
                            "(e.g. 128,256,512)")
    return (buckets, steps, reuse), problems
