"""How ``generate()`` behaves on TPU: one dataclass, its environment variables, and ``configure()``.

Precedence: values given to :func:`configure` > environment variables > the dataclass defaults.
Environment variables are read when a ``generate()`` call starts (never cached at import), so a
launcher or a test may set them at any time. Plain data: no torch, no transformers.

See ``docs/generation.md``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import buckets
from ..ladders import geometric_ladder
from ..config import Overrides, check_variables, with_renamed
from ..settings.parser import parse
from .settings import SETTINGS
from ..quantization import kv_format as kv_cache_format

__all__ = ["ENV", "KV_CACHE_FORMATS", "TPUGenerationConfig", "check_environment", "configure", "current", "reset"]

#: Environment variable of each field, from :data:`generation.settings.SETTINGS` (booleans: the
#: settings layer's on/off words; lists: comma-separated).
ENV: dict[str, str] = {s.field: s.name for s in SETTINGS}
_BY_FIELD = {s.field: s for s in SETTINGS}

#: Values of ``kv_cache`` (``None``: the KV cache in the model's dtype, as upstream).
KV_CACHE_FORMATS = kv_cache_format.FORMATS

_PROMPT_MIN = 16
_MULTIPLE = 16  # bf16 sublane tile: padding the hardware does anyway
_CACHE_MIN = 64
_CACHE_MULTIPLE = 64
_LADDER_TOP = 1 << 20


@dataclass(frozen=True)
class TPUGenerationConfig:
    """Settings of ``generate()`` on TPU (ignored entirely off TPU).

    - ``static_cache``: use ``cache_implementation="static"`` when the caller asked for no cache, so
      the decode step compiles with the ``tpu`` backend.
    - ``bucketing``: round prompt length, batch size and cache length up to the buckets below.
    - ``compile_prefill``: run the (bucketed) prefill through the compiled forward too: one graph
      per bucket instead of ~80 eager per-shape programs.
    - ``device_decode``: greedy decoding and sampling choose tokens on the TPU, so only token ids
      cross the host link every step (calls whose options need the logits on the host run
      upstream's loop; see ``docs/generation.md``).
    - ``prompt_buckets``: explicit prompt lengths; ``None`` = a geometric ladder from 16 with
      ``steps_per_octave`` rungs per doubling, multiples of 16, up to ``prefill_chunk``.
    - ``prefill_chunk``: longer prompts are padded to a multiple of it and prefilled chunk by chunk
      through one graph (``None`` = never chunk).
    - ``batch_buckets``: batch sizes (past the last one: its multiples).
    - ``cache_buckets``: static-cache lengths; ``None`` = a ladder from 64, multiples of 64.
    - ``max_cache_len``: a floor for the cache length (e.g. the largest your service needs).
    - ``recompile_limit``: TorchDynamo's recompile limit is raised to at least this, and to what the
      buckets need (:meth:`dynamo_recompile_limit`), so every bucket gets its graph instead of
      silently falling back to eager after 8.
    - ``kv_cache``: ``"int8"`` stores the static cache the plugin makes as int8 keys and values with
      one float32 scale per position and key-value head (about half the bytes of bf16; lossy), where
      ``policy.kv_cache_choice`` allows it; ``None`` (default): the model's dtype, as upstream.
    """

    static_cache: bool = True
    bucketing: bool = True
    compile_prefill: bool = True
    device_decode: bool = True
    prompt_buckets: tuple[int, ...] | None = None
    steps_per_octave: int = 1
    prefill_chunk: int | None = 64
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    cache_buckets: tuple[int, ...] | None = None
    max_cache_len: int | None = None
    recompile_limit: int = 64
    kv_cache: str | None = None
    _ladders: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kv_cache is not None and self.kv_cache not in KV_CACHE_FORMATS:
            raise ValueError(
                f"TPUGenerationConfig.kv_cache must be None (the model's dtype) or one of {KV_CACHE_FORMATS}, got {self.kv_cache!r}"
            )
        for name in ("steps_per_octave", "recompile_limit"):
            _positive(name, getattr(self, name))
        for name in ("prefill_chunk", "max_cache_len"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        for name in ("prompt_buckets", "batch_buckets", "cache_buckets"):
            value = getattr(self, name)
            if value is not None:
                value = tuple(value)
                if not value:
                    raise ValueError(f"{name} must name at least one size (or be None for the default ladder)")
                for size in value:
                    _positive(name, size)
                object.__setattr__(self, name, tuple(sorted(set(value))))

    # -- the ladders the bucket functions use -------------------------------------------------
    def prompt_ladder(self) -> tuple[int, ...]:
        if "prompt" not in self._ladders:
            if self.prompt_buckets is not None:
                ladder = self.prompt_buckets
            else:
                top = self.prefill_chunk or _LADDER_TOP
                ladder = geometric_ladder(_PROMPT_MIN, top, self.steps_per_octave, _MULTIPLE)
            self._ladders["prompt"] = ladder
        return self._ladders["prompt"]

    def cache_ladder(self) -> tuple[int, ...]:
        if "cache" not in self._ladders:
            self._ladders["cache"] = (
                self.cache_buckets
                if self.cache_buckets is not None
                else geometric_ladder(_CACHE_MIN, _LADDER_TOP, self.steps_per_octave, _CACHE_MULTIPLE)
            )
        return self._ladders["cache"]

    def forward_graphs(self) -> int:
        """The forward graphs the buckets make for one static-cache length: per batch bucket, one
        prefill graph per prompt rung (up to the prefill chunk) and one decode step."""
        chunk = self.prefill_chunk
        rungs = {r for r in self.prompt_ladder() if chunk is None or r <= chunk} | ({chunk} if chunk else set())
        return len(self.batch_buckets) * (len(rungs) + 1)

    def dynamo_recompile_limit(self) -> int:
        """TorchDynamo's recompile limit the buckets need: ``recompile_limit``, raised to twice
        :meth:`forward_graphs` plus 8 (a second cache length before the warm-up fixed one, and the
        model's other compiled functions). Past the limit TorchDynamo stops compiling and the
        remaining buckets run op by op in every call, each op a program of its own on a chip."""
        from ..compilation.recompile_limit import needed

        return needed(self.forward_graphs(), floor=self.recompile_limit)

    def plan(self, batch_size: int, prompt_length: int, max_new_tokens: int, min_padding: int = 0) -> buckets.Plan:
        """The padded shapes of one call (see :func:`transformers_tpu_ext.generation.buckets.plan`)."""
        return buckets.plan(
            batch_size,
            prompt_length,
            max_new_tokens,
            prompt_ladder=self.prompt_ladder(),
            chunk=self.prefill_chunk,
            batch_ladder=self.batch_buckets,
            cache_ladder=self.cache_ladder(),
            cache_floor=self.max_cache_len,
            min_padding=min_padding,
        )


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"TPUGenerationConfig.{name} must be a positive integer, got {value!r}")


def _parse(name: str, raw: str) -> Any:
    value = parse(_BY_FIELD[name], raw)
    if name == "prefill_chunk" and value == 0:
        return None
    return value


_overrides = Overrides(TPUGenerationConfig, "generation", sequences=("prompt_buckets", "batch_buckets", "cache_buckets"))


def current(environ: Mapping[str, str] | None = None) -> TPUGenerationConfig:
    """The settings in force now: :func:`configure` overrides > environment > defaults."""
    environ = with_renamed(os.environ if environ is None else environ)
    values = {name: environ[var] for name, var in ENV.items() if environ.get(var, "").strip()}
    overrides = _overrides.values()
    return _build(tuple(sorted(values.items())), tuple(sorted(overrides.items(), key=lambda kv: kv[0])))


@functools.lru_cache(maxsize=32)
def _build(env_items: tuple, override_items: tuple) -> TPUGenerationConfig:
    problems = check_environment(dict((ENV[name], raw) for name, raw in env_items))
    if problems:  # name the variable, not the dataclass field
        raise ValueError("; ".join(problems))
    kwargs = {name: _parse(name, raw) for name, raw in env_items}
    kwargs.update(dict(override_items))
    return TPUGenerationConfig(**kwargs)


def configure(**changes: Any) -> TPUGenerationConfig:
    """Set settings for this process (they win over environment variables); returns the result.

    ``configure(prompt_buckets=(32, 128, 512), prefill_chunk=512)``; ``reset()`` undoes it.
    """
    _overrides.update(changes)
    return current()


def reset() -> None:
    """Forget every :func:`configure` call (environment variables and defaults apply again)."""
    _overrides.clear()


def check_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """One message per invalid generation variable, naming it (checked at activation, and by ``current()``)."""
    return check_variables(with_renamed(os.environ if environ is None else environ), ENV, _parse, TPUGenerationConfig)
