"""Continuous batching on TPU: the policy, as plain functions over ints (no torch, no transformers).

Transformers' continuous batching runs one forward per step over every token scheduled in it. On a
compile-per-shape backend each step's shapes must come from a small fixed set, known before serving
starts, so that a warm-up can compile them all. This module decides that set and sizes the paged KV
cache from the chip's HBM; ``patch_continuous_batching`` glues it into Transformers.

The shapes of one step (see ``docs/serving.md``):

- **Q**, the tokens scheduled, is rounded up to the *token ladder*: doubling from 16 up to
  ``max_batch_tokens`` (vLLM TPU's ``num_tokens`` paddings).
- **S**, the requests in the step, is rounded up to the *request ladder*: doubling from 8 up to
  ``max_requests`` (vLLM TPU's ``num_reqs`` paddings), and never above the padded Q.
- **K**, the cached tokens each request reads, is *data*: every request reads its pages through a
  block table of a fixed width (``blocks_per_request`` pages of ``page_size`` tokens, enough for
  ``max_len`` tokens) and a mask built from positions. K never appears in a shape, so the programs
  are the (Q, S) pairs of the two ladders, whatever the prompt lengths and however long requests run.
- The page size follows vLLM TPU: the max length split into about 16 pages, a power of two in
  [16, 256] (16 past 8192 tokens).

The cache budget: ``HBM - bytes already on the chip (weights) - headroom`` (the placement headroom,
``TRANSFORMERS_TPU_EXT_HBM_HEADROOM``), minus what one step needs on top of the cache at its largest
shape; the rest becomes cache pages.

Whether a manager takes this path at all is :func:`paged_path` (pure "safe when" over
:class:`ServeFacts`): a manager it does not recognise is Transformers' own, unpatched.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ladders import geometric_ladder, round_up
from ..config import Overrides, check_variables
from ..quantization import kv_cache as kv_format
from .kernel_path import ATTENTION_SETTINGS

__all__ = [
    "PAGED_FALLBACKS",
    "PAGED_LAYER_TYPES",
    "ServeFacts",
    "paged_path",
    "kv_cache_path",
    "kv_bytes_per_sector",
    "DEFAULT_MAX_BATCH_TOKENS",
    "DEFAULT_MAX_LEN",
    "DEFAULT_MAX_REQUESTS",
    "ENV",
    "CachePlan",
    "ServeSettings",
    "ServingPlan",
    "StepStats",
    "blocks_per_request",
    "cache_plan",
    "capped_rungs",
    "fit_request",
    "configure",
    "current",
    "kv_budget",
    "page_size_for",
    "plan_for",
    "request_ladder",
    "reset",
    "step_bytes",
    "step_shape",
    "step_shapes",
    "token_ladder",
]

#: Smallest padded token count (the bf16 sublane tile) and smallest padded request count (vLLM TPU).
MIN_TOKENS = 16
MIN_REQUESTS = 8
#: Defaults when neither the ContinuousBatchingConfig nor the environment says otherwise.
DEFAULT_MAX_BATCH_TOKENS = 256
DEFAULT_MAX_REQUESTS = 32
#: Max tokens per request (prompt + generated) when no workload hint gives it (``transformers serve``):
#: the model's ``max_position_embeddings``, capped at this.
DEFAULT_MAX_LEN = 2048

ENV: dict[str, str] = {
    "token_buckets": "TRANSFORMERS_TPU_EXT_SERVE_TOKEN_BUCKETS",
    "request_buckets": "TRANSFORMERS_TPU_EXT_SERVE_REQUEST_BUCKETS",
    "max_batch_tokens": "TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS",
    "max_requests": "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS",
    "max_len": "TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN",
    "page_size": "TRANSFORMERS_TPU_EXT_SERVE_PAGE_SIZE",
    "warmup": "TRANSFORMERS_TPU_EXT_SERVE_WARMUP",
    "kv_cache": "TRANSFORMERS_TPU_EXT_SERVE_KV_CACHE",
    "attention": "TRANSFORMERS_TPU_EXT_SERVE_ATTENTION",
}


#: The attention implementations the TPU paged attention stands in for during the manager's steps,
#: each with the implementation a forward outside those steps keeps (``generate()``, a plain
#: forward, a ``pause()`` block, another route of ``transformers serve``).
PAGED_FALLBACKS: Mapping[str, str] = {"sdpa": "sdpa", "eager": "eager", "paged|eager": "eager"}
#: Text-layer types the paged attention computes as upstream does (full attention; a sliding window
#: applied by its mask over pages that keep the whole history).
PAGED_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


@dataclass(frozen=True)
class ServeFacts:
    """What the manager's ``__init__`` wrapper reads off the model (plain data)."""

    tensor_parallel: bool = False  # a device mesh (DistributedConfig(tp_size=N))
    encoder_decoder: bool = False
    attention: str = "sdpa"  # config._attn_implementation
    layer_types: tuple[str, ...] = ("full_attention",)  # text layers, as the caches see them
    attention_sinks: bool = False  # an attention module with learned sinks (gpt-oss)
    eager_function: bool = True  # the model's file defines eager_attention_forward (the "eager" fallback)


def paged_path(facts: ServeFacts) -> tuple[bool, str]:
    """``(True, why)`` if the TPU serving path (planned shapes, the paged attention, the HBM-sized
    cache) computes what upstream computes for this model; else ``(False, why not)``: the manager
    runs unpatched."""
    if facts.tensor_parallel:
        return False, "tensor parallelism is not supported by TPU serving yet"
    if facts.encoder_decoder:
        return False, "an encoder-decoder model"
    if facts.attention not in PAGED_FALLBACKS:
        return False, f"attn_implementation={facts.attention!r} is not one the TPU paged attention stands in for"
    unknown = sorted(set(facts.layer_types) - PAGED_LAYER_TYPES)
    if unknown:
        return False, "layers the TPU paged attention does not compute: " + ", ".join(unknown)
    if facts.attention_sinks:
        return False, "attention sinks (the TPU paged attention has none)"
    if PAGED_FALLBACKS[facts.attention] == "eager" and not facts.eager_function:
        return False, "the model's eager attention is not the standard one (no eager_attention_forward)"
    return True, "paged attention on TPU (the model's own attention outside the manager's steps)"


def kv_cache_path(setting: str | None, *, paged: bool, dtype: str) -> tuple[str | None, str]:
    """``("int8", why)`` if the TPU paged cache stores int8 pages (and a parallel float32 scale per
    position and key-value head), else ``(None, why not)`` (``setting``: ``ServeSettings.kv_cache``).

    Safe when the manager takes the TPU path (:func:`paged_path`: its ``update`` is the one place
    pages are written and read, quantized on write, dequantized on gather) and the model computes in
    a float dtype. A manager left unpatched keeps upstream's cache in the model's dtype.
    """
    if setting != "int8":
        return None, f"the int8 KV cache is off ({ENV['kv_cache']}=int8 turns it on)"
    if not paged:
        return None, "the manager runs unpatched (upstream's paged cache keeps the model's dtype)"
    if dtype not in kv_format.FLOAT_DTYPES:
        return None, f"the model's dtype is {dtype} (int8 pages dequantize to a float dtype)"
    return "int8", "int8 pages, one float32 scale per position and key-value head"


def kv_bytes_per_sector(bytes_per_sector: int, head_dim: int, kv_cache: str | None) -> int:
    """Bytes a cache sector costs: its pages, plus (int8) its scales, one per ``head_dim`` int8 bytes."""
    if kv_cache != "int8":
        return bytes_per_sector
    return bytes_per_sector + bytes_per_sector // head_dim * kv_format.SCALE_BYTES


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


def page_size_for(max_len: int) -> int:
    """vLLM TPU's rule: about 16 pages per max-length request, a power of two in [16, 256]; 16 past 8192."""
    _positive("max_len", max_len)
    if max_len > 8192:
        return 16
    return min(max(1 << (max_len - 1).bit_length() >> 4, 16), 256)


def blocks_per_request(max_len: int, page_size: int) -> int:
    """Width of the block table: pages a request of ``max_len`` tokens needs."""
    _positive("max_len", max_len)
    _positive("page_size", page_size)
    return -(-max_len // page_size)


def kv_budget(total_memory: int, resident_bytes: int, headroom_bytes: int) -> int:
    """HBM the KV cache and the step's working memory may use: what weights and headroom leave."""
    return max(0, int(total_memory) - int(resident_bytes) - int(headroom_bytes))


@dataclass(frozen=True)
class CachePlan:
    """How the budget is spent: cache sectors, their bytes, and what one step keeps aside."""

    num_sectors: int
    cache_bytes: int
    step_bytes: int
    budget: int

    @property
    def usable_fraction(self) -> float:
        """Cache bytes / budget (the rest is the step's working memory and rounding)."""
        return self.cache_bytes / self.budget if self.budget else 0.0


def cache_plan(
    budget: int,
    bytes_per_sector: int,
    step_bytes: int,
    *,
    reserved_sectors: int = 2,
    requested_sectors: int | None = None,
) -> CachePlan:
    """Sectors that fit in ``budget`` once ``step_bytes`` are kept for one step's working memory.

    ``reserved_sectors`` (Transformers' two trash sectors) are allocated on top of the usable ones
    and count against the budget. ``requested_sectors`` (the user's ``num_blocks``) must fit.
    Raises ``MemoryError`` with what to change when not even one sector fits.
    """
    _positive("bytes_per_sector", bytes_per_sector)
    room = budget - step_bytes
    fitting = room // bytes_per_sector - reserved_sectors
    if requested_sectors is not None:
        if requested_sectors > fitting:
            raise MemoryError(
                f"num_blocks asks for {requested_sectors * bytes_per_sector} bytes of KV cache but the TPU has room for "
                f"{max(fitting, 0) * bytes_per_sector} (budget {budget} bytes, one step needs {step_bytes}); lower "
                "num_blocks, or leave it unset to size the cache from the chip's HBM"
            )
        fitting = requested_sectors
    if fitting < 1:
        raise MemoryError(
            f"no room for a KV cache on the TPU: the budget is {budget} bytes (HBM minus weights minus headroom) and "
            f"one step needs {step_bytes}; lower max_batch_tokens, the max length "
            f"({ENV['max_len']}) or the headroom (TRANSFORMERS_TPU_EXT_HBM_HEADROOM)"
        )
    return CachePlan(fitting, (fitting + reserved_sectors) * bytes_per_sector, step_bytes, budget)


def step_bytes(
    plan: ServingPlan,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    itemsize: int,
    vocab_size: int,
    activation_bytes_per_token: int,
) -> int:
    """Working memory of the largest step besides the cache.

    Activations (``activation_bytes_per_token`` per token, Transformers' own estimate), every token's
    gathered keys and values (``max_batch_tokens x max_len``), the float32 attention scores, and the
    float32 logits of ``max_requests`` rows.
    """
    tokens = plan.max_batch_tokens
    keys = plan.blocks_per_request * plan.page_size
    gathered = 2 * tokens * keys * kv_heads * head_dim * itemsize
    scores = tokens * heads * keys * 4
    logits = plan.max_requests * vocab_size * 4
    return tokens * activation_bytes_per_token + gathered + scores + logits


def fit_request(prompt_tokens: int, max_new_tokens: int | None, max_len: int) -> int:
    """``max_new_tokens`` for a request under ``max_len``: lowered to fit (or set, when ``None``).

    Raises ``ValueError`` when the prompt alone leaves no room for a token.
    """
    room = max_len - prompt_tokens
    if room < 1:
        raise ValueError(
            f"this prompt has {prompt_tokens} tokens; the TPU serving max length is {max_len} tokens (each request "
            f"reads its pages through a block table of fixed width): raise it with {ENV['max_len']} or shorten "
            "the prompt"
        )
    return room if max_new_tokens is None else min(max_new_tokens, room)


@dataclass
class StepStats:
    """What the steps cost: real vs scheduled (padded) tokens and requests, and the shapes used."""

    steps: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    requests: int = 0
    padded_requests: int = 0
    shapes: set = field(default_factory=set)
    #: K/V bytes per layer, summed over steps: what the attention read, what the requests held
    #: (``kernel_path``'s counts; ``decode_*`` over the steps that scheduled no prefill token, with
    #: what the kernel reads on those steps whichever attention ran)
    kv_bytes_read: int = 0
    kv_bytes_held: int = 0
    decode_steps: int = 0
    decode_tokens: int = 0
    decode_kv_bytes_read: int = 0
    decode_kv_bytes_held: int = 0
    decode_kernel_kv_bytes: int = 0

    def record_kv(self, read: int, held: int, kernel_read: int, decode_tokens: int) -> None:
        """One step's K/V bytes (per layer); ``decode_tokens``: its tokens if it is a decode step, else 0."""
        self.kv_bytes_read += read
        self.kv_bytes_held += held
        if decode_tokens:
            self.decode_steps += 1
            self.decode_tokens += decode_tokens
            self.decode_kv_bytes_read += read
            self.decode_kv_bytes_held += held
            self.decode_kernel_kv_bytes += kernel_read

    def record(self, tokens: int, requests: int, shape: tuple[int, int]) -> None:
        """One step (called by the generation loop's thread only)."""
        self.steps += 1
        self.tokens += tokens
        self.padded_tokens += shape[0]
        self.requests += requests
        self.padded_requests += shape[1]
        self.shapes.add(tuple(shape))

    @property
    def token_overhead(self) -> float:
        """Scheduled tokens / useful tokens (1.0: no padding)."""
        return self.padded_tokens / self.tokens if self.tokens else 1.0

    def asdict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "padded_tokens": self.padded_tokens,
            "requests": self.requests,
            "padded_requests": self.padded_requests,
            "token_overhead": round(self.token_overhead, 4),
            "shapes": sorted(self.shapes),
            "kv_bytes_read": self.kv_bytes_read,
            "kv_bytes_held": self.kv_bytes_held,
            "decode_steps": self.decode_steps,
            "decode_tokens": self.decode_tokens,
            "decode_kv_bytes_read": self.decode_kv_bytes_read,
            "decode_kv_bytes_held": self.decode_kv_bytes_held,
            "decode_kernel_kv_bytes": self.decode_kernel_kv_bytes,
            "decode_kv_read_over_held": _ratio(self.decode_kv_bytes_read, self.decode_kv_bytes_held),
            "decode_kernel_kv_read_over_held": _ratio(self.decode_kernel_kv_bytes, self.decode_kv_bytes_held),
        }


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


# -------------------------------------------------------------------------------------------------
# Settings: configure() > environment > defaults (ContinuousBatchingConfig values win over both).


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


def _capped(buckets: tuple[int, ...], top: int) -> tuple[int, ...]:
    kept = tuple(b for b in buckets if b < top)
    return (*kept, top)


def capped_rungs(settings: ServeSettings, max_batch_tokens: int, max_requests: int) -> list[str]:
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


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse(name: str, raw: str) -> Any:
    raw = raw.strip()
    where = f"{ENV[name]}={raw!r}"
    if name == "warmup":
        if raw.lower() in _TRUE | _FALSE:
            return raw.lower() in _TRUE
        raise ValueError(f"{where}: use 1 or 0")
    if name == "kv_cache":
        return None if raw.lower() in {"", "none", "default"} else raw.lower()
    if name == "attention":
        return raw.lower()
    try:
        if name.endswith("buckets"):
            return tuple(int(part) for part in raw.replace(" ", "").split(",") if part)
        return int(raw)
    except ValueError:
        kind = "a comma list of integers" if name.endswith("buckets") else "an integer"
        raise ValueError(f"{where}: expected {kind}") from None


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

    Each variable alone first; then, when each is valid, all of them together (explicit buckets past
    the largest step).
    """
    environ = os.environ if environ is None else environ
    problems = check_variables(environ, ENV, _parse, _alone)
    if problems:
        return problems
    values = {name: _parse(name, environ[var]) for name, var in ENV.items() if environ.get(var, "").strip()}
    try:
        ServeSettings(**values)
    except ValueError as error:
        return [f"TPU serving settings: {error}"]
    return []


def configure(**changes: Any) -> ServeSettings:
    """Set serving settings for this process (they win over environment variables)."""
    _overrides.update(changes)
    return current()


def reset() -> None:
    """Forget every :func:`configure` call."""
    _overrides.clear()


@dataclass
class ServingPlan:
    """What continuous batching runs with on this TPU: shapes, page geometry, memory. Plain data.

    Attached to a manager's resolved config as ``manager.continuous_batching_config.tpu_plan``;
    ``cache`` is filled when the paged cache is created and ``stats`` as steps run.
    """

    max_len: int
    page_size: int
    blocks_per_request: int
    max_batch_tokens: int
    max_requests: int
    token_buckets: tuple[int, ...]
    request_buckets: tuple[int, ...]
    hbm_bytes: int
    resident_bytes: int
    headroom_bytes: int
    warmup: bool = True
    #: the KV cache format (``kv_cache_path``): "int8", or None for the model's dtype
    kv_cache: str | None = None
    #: the attention of the steps (``kernel_path.attention_path``): "ragged" (the JAX kernel) or "paged"
    attention: str = "paged"
    #: what the user should know about this plan (explicit rungs a smaller limit cut), logged once
    notes: tuple[str, ...] = ()
    cache: CachePlan | None = None
    stats: StepStats = field(default_factory=StepStats)

    @property
    def budget(self) -> int:
        return kv_budget(self.hbm_bytes, self.resident_bytes, self.headroom_bytes)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        return step_shapes(self.token_buckets, self.request_buckets)

    def asdict(self) -> dict[str, Any]:
        cache = self.cache
        return {
            "max_len": self.max_len,
            "page_size": self.page_size,
            "blocks_per_request": self.blocks_per_request,
            "max_batch_tokens": self.max_batch_tokens,
            "max_requests": self.max_requests,
            "token_buckets": list(self.token_buckets),
            "request_buckets": list(self.request_buckets),
            "step_shapes": len(self.shapes),
            "hbm_bytes": self.hbm_bytes,
            "resident_bytes": self.resident_bytes,
            "headroom_bytes": self.headroom_bytes,
            "kv_budget_bytes": self.budget,
            "kv_cache_bytes": cache.cache_bytes if cache else None,
            "step_bytes": cache.step_bytes if cache else None,
            "kv_cache_fraction_of_budget": round(cache.usable_fraction, 4) if cache else None,
            "kv_cache_format": self.kv_cache,
            "attention": self.attention,
            "stats": self.stats.asdict(),
        }


def plan_for(
    settings: ServeSettings,
    *,
    hint_len: int | None,
    model_max_len: int | None,
    page_size: int | None,
    max_batch_tokens: int | None,
    max_requests: int | None,
    hbm_bytes: int,
    resident_bytes: int,
    headroom_bytes: int,
) -> ServingPlan:
    """The plan of one manager, from its settings, its workload hint and the chip.

    - max length: ``settings.max_len``; else the workload hint (``generate_batch``: longest prompt +
      ``max_new_tokens``) rounded up to a power of two, so similar workloads share programs; else the
      model's ``max_position_embeddings`` capped at :data:`DEFAULT_MAX_LEN`.
    - page size: ``settings.page_size``; else ``page_size`` (a ContinuousBatchingConfig value other
      than its default); else :func:`page_size_for`.
    - ``max_batch_tokens`` / ``max_requests``: the ContinuousBatchingConfig's, else the settings'.
    """
    if settings.max_len is not None:
        max_len = settings.max_len
    elif hint_len:
        max_len = 1 << (int(hint_len) - 1).bit_length()
        if model_max_len:
            max_len = max(min(max_len, int(model_max_len)), int(hint_len))
    else:
        max_len = min(int(model_max_len or DEFAULT_MAX_LEN), DEFAULT_MAX_LEN)
    page = settings.page_size or page_size or page_size_for(max_len)
    tokens_top = max_batch_tokens or settings.max_batch_tokens
    requests_top = min(max_requests or settings.max_requests, tokens_top)
    tokens, requests = settings.ladders(tokens_top, requests_top)
    notes = tuple(capped_rungs(settings, tokens_top, requests_top))
    return ServingPlan(
        max_len=max_len,
        page_size=page,
        blocks_per_request=blocks_per_request(max_len, page),
        max_batch_tokens=tokens_top,
        max_requests=requests_top,
        token_buckets=tokens,
        request_buckets=requests,
        hbm_bytes=int(hbm_bytes),
        resident_bytes=int(resident_bytes),
        headroom_bytes=int(headroom_bytes),
        warmup=settings.warmup,
        notes=notes,
    )
