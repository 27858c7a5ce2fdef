"""Settings of continuous batching on TPU: declared once (:data:`SETTINGS`), parsed by the settings layer.

Precedence: :func:`configure` > environment variables > defaults (a ``ContinuousBatchingConfig``'s own
values win over all three). Plain data: no torch, no transformers. The variables are in the docs'
settings table (``docs/configuration.md``), generated from :data:`SETTINGS`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import Overrides, check_variables
from ..quantization import kv_format
from ..settings.parser import Setting, parse
from .kernel_path import ATTENTION_SETTINGS
from .shapes import _capped, _positive, request_ladder, token_ladder

__all__ = [
    "DEFAULT_MAX_BATCH_TOKENS",
    "DEFAULT_MAX_LEN",
    "DEFAULT_MAX_REQUESTS",
    "ENV",
    "SETTINGS",
    "ServeSettings",
    "check_environment",
    "configure",
    "current",
    "reset",
]

#: Defaults when neither the ContinuousBatchingConfig nor the environment says otherwise.
DEFAULT_MAX_BATCH_TOKENS = 256
DEFAULT_MAX_REQUESTS = 32
#: Max tokens per request (prompt + generated) when no workload hint gives it (``transformers serve``):
#: the model's ``max_position_embeddings``, capped at this.
DEFAULT_MAX_LEN = 2048

_NONE = ("", "none", "default")

#: Every serving variable, once: what :class:`ServeSettings` reads, and the docs' table.
SETTINGS: tuple[Setting, ...] = (
    Setting("TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS", "integer", str(DEFAULT_MAX_BATCH_TOKENS),
            "largest number of tokens in a step", field="max_batch_tokens"),
    Setting("TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS", "integer", str(DEFAULT_MAX_REQUESTS),
            "largest number of requests in a step", field="max_requests"),
    Setting("TRANSFORMERS_TPU_EXT_SERVE_TOKEN_BUCKETS", "integers", "doubling from 16",
            "explicit ladder of padded token counts (its rungs up to the largest step)", field="token_buckets"),
    Setting("TRANSFORMERS_TPU_EXT_SERVE_REQUEST_BUCKETS", "integers", "doubling from 8",
            "explicit ladder of padded request counts (its rungs up to the largest step)", field="request_buckets"),
    Setting("TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN", "integer", f"from the workload, else the model's, at most {DEFAULT_MAX_LEN}",
            "max tokens per request (prompt + generated)", field="max_len"),
    Setting("TRANSFORMERS_TPU_EXT_SERVE_PAGE_SIZE", "integer", "from the max length",
            "tokens per cache page", field="page_size"),
    Setting("TRANSFORMERS_TPU_EXT_SERVE_WARMUP", "switch", "`1`",
            "`start()` precompiles every step shape when nothing warmed the manager up", field="warmup"),
    Setting("TRANSFORMERS_TPU_EXT_SERVE_KV_CACHE", "choice", "unset (the model's dtype)",
            "int8 pages with a float32 scale per position and key-value head: the pool holds about twice the "
            "tokens (lossy; see [quantization.md](quantization.md#int8-kv-cache))",
            choices=tuple(kv_format.FORMATS), none_words=_NONE, field="kv_cache"),
    Setting("TRANSFORMERS_TPU_EXT_SERVE_ATTENTION", "choice", "`auto`",
            "`auto`: JAX's ragged paged attention kernel where it applies (see "
            "[serving.md](serving.md#the-attention-kernel)); `paged`: always the plain-PyTorch paged attention",
            choices=tuple(ATTENTION_SETTINGS), field="attention"),
)
BY_FIELD: dict[str, Setting] = {s.field: s for s in SETTINGS}
#: Field -> variable.
ENV: dict[str, str] = {s.field: s.name for s in SETTINGS}


@dataclass(frozen=True)
class ServeSettings:
    """Settings of continuous batching on TPU (ignored entirely off TPU).

    - ``max_batch_tokens`` / ``max_requests``: the largest step, used when the
      ``ContinuousBatchingConfig`` does not set ``max_batch_tokens`` / ``max_requests_per_batch``.
    - ``token_buckets`` / ``request_buckets``: explicit ladders (``None``: doubling from 16 / 8).
    - ``max_len``: max tokens per request (prompt + generated) when no workload hint gives it.
    - ``page_size``: ``None`` follows the max length (unless the ContinuousBatchingConfig sets a
      page size other than its default, 256).
    - ``warmup``: precompile every step shape when a manager starts without a warm-up.
    - ``kv_cache``: ``"int8"`` stores the pages as int8 with one float32 scale per position and
      key-value head (the pool holds about twice the tokens of bf16 pages; lossy), where
      :func:`kv_cache_path` allows it; ``None`` (default): the model's dtype.
    - ``attention``: ``"auto"`` runs JAX's ragged paged attention kernel where
      ``kernel_path.attention_path`` allows it; ``"paged"`` always the plain-PyTorch paged attention.
    """

    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_requests: int = DEFAULT_MAX_REQUESTS
    token_buckets: tuple[int, ...] | None = None
    request_buckets: tuple[int, ...] | None = None
    max_len: int | None = None
    page_size: int | None = None
    warmup: bool = True
    kv_cache: str | None = None
    attention: str = "auto"

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_SETTINGS:
            raise ValueError(f"attention must be one of {ATTENTION_SETTINGS}, got {self.attention!r}")
        if self.kv_cache is not None and self.kv_cache not in kv_format.FORMATS:
            raise ValueError(f"kv_cache must be None (the model's dtype) or one of {kv_format.FORMATS}, got {self.kv_cache!r}")
        _positive("max_batch_tokens", self.max_batch_tokens)
        _positive("max_requests", self.max_requests)
        for name in ("max_len", "page_size"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        for name in ("token_buckets", "request_buckets"):
            value = getattr(self, name)
            if value is not None:
                if not value:
                    raise ValueError(f"{name} must name at least one size (or be None for the default ladder)")
                for size in value:
                    _positive(name, size)
                object.__setattr__(self, name, tuple(sorted(set(value))))
        for name, top_name in (("token_buckets", "max_batch_tokens"), ("request_buckets", "max_requests")):
            value, top = getattr(self, name), getattr(self, top_name)
            if value is not None and value[-1] > top:
                # A rung past the largest step could never be used: say so rather than drop it silently.
                raise ValueError(
                    f"{name}={value} goes past {top_name}={top} (the largest step, whose rung is always the "
                    f"last): raise {top_name} to {value[-1]} ({ENV[top_name]}) or leave "
                    f"{', '.join(str(b) for b in value if b > top)} out"
                )

    def ladders(self, max_batch_tokens: int, max_requests: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The token and request ladders for a manager of these limits (explicit buckets are capped)."""
        tokens = _capped(self.token_buckets, max_batch_tokens) if self.token_buckets else token_ladder(max_batch_tokens)
        requests = _capped(self.request_buckets, max_requests) if self.request_buckets else request_ladder(max_requests)
        return tokens, requests


def _parse(name: str, raw: str) -> Any:
    return parse(BY_FIELD[name], raw)


_overrides = Overrides(ServeSettings, "serving", sequences=("token_buckets", "request_buckets"))


def current(environ: Mapping[str, str] | None = None) -> ServeSettings:
    """The settings in force: :func:`configure` > environment variables > defaults.

    Raises ``ValueError`` naming the variable when an environment value is invalid.
    """
    environ = os.environ if environ is None else environ
    problems = check_environment(environ)
    if problems:
        raise ValueError("; ".join(problems))
    values: dict[str, Any] = {}
    for name, var in ENV.items():
        raw = environ.get(var, "")
        if raw.strip():
            values[name] = _parse(name, raw)
    values.update(_overrides.values())
    try:
        return ServeSettings(**values)
    except ValueError as error:
        raise ValueError(f"invalid TPU serving settings: {error}") from None


def _alone(**values: Any) -> ServeSettings:
    """Settings with one variable's value, checked alone: not against a limit another variable may raise."""
    for name, top in (("token_buckets", "max_batch_tokens"), ("request_buckets", "max_requests")):
        if values.get(name):
            values.setdefault(top, max(values[name]))
    return ServeSettings(**values)


_alone.__name__ = ServeSettings.__name__


def check_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """One message per invalid serving variable, naming it (checked at activation, and by ``current()``).

    Each variable alone first; then each explicit ladder against its limit (rungs past the largest
    step), naming the ladder's variable, for the pairs whose values are valid alone.
    """
    environ = os.environ if environ is None else environ
    problems = check_variables(environ, ENV, _parse, _alone)
    wrong = {name for name, var in ENV.items() if any(var in problem for problem in problems)}
    for name, top_name in (("token_buckets", "max_batch_tokens"), ("request_buckets", "max_requests")):
        raw = environ.get(ENV[name], "").strip()
        if not raw or {name, top_name} & wrong:
            continue
        buckets = _parse(name, raw)
        top_raw = environ.get(ENV[top_name], "").strip()
        top = _parse(top_name, top_raw) if top_raw else getattr(ServeSettings, top_name)
        past = [b for b in buckets if b > top]
        if past:
            problems.append(
                f"{ENV[name]}={raw!r} goes past {top_name}={top} ({ENV[top_name]}, the largest step, whose rung "
                f"is always the last): leave {', '.join(map(str, past))} out, or raise {ENV[top_name]} to {max(past)}"
            )
    return problems


def configure(**changes: Any) -> ServeSettings:
    """Set serving settings for this process (they win over environment variables)."""
    _overrides.update(changes)
    return current()


def reset() -> None:
    """Forget every :func:`configure` call."""
    _overrides.clear()
