"""What one manager runs with: its :class:`ServingPlan` (shapes, page geometry, memory) and its :class:`StepStats`.

Plain data (no torch, no transformers); built by :func:`plan_for` from the settings, the workload hint and the chip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .memory import CachePlan, blocks_per_request, kv_budget, page_size_for
from .settings import DEFAULT_MAX_LEN, ServeSettings
from .shapes import capped_rungs, step_shapes

__all__ = ["ServingPlan", "StepStats", "plan_for", "plan_of"]


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
    #: the model's positions (``max_position_embeddings``): no request may reach them
    model_positions: int | None = None
    #: the registered kernel's variant on the kernel path (``kernel_path.KernelVariant``), else ``None``
    kernel_variant: Any = None
    #: on the kernel path, the working memory a step of the present path would need (``memory.step_bytes``):
    #: what a fallback (``wrap_fallback``) compares with what the cache left free
    present_step_bytes: int | None = None
    #: under tensor parallelism, what the paged cache divides the model's key-value heads by to hold one
    #: rank's (``tensor_parallel.kv_split``); ``None`` without tensor parallelism
    kv_head_split: int | None = None
    #: under tensor parallelism, the (query heads, key-value heads) one rank computes and caches
    #: (``tensor_parallel.local_heads``); ``None`` without tensor parallelism
    local_heads: tuple[int, int] | None = None
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
        model_positions=int(model_max_len) if model_max_len else None,
    )


def plan_of(config: Any) -> ServingPlan | None:
    """The plan a resolved continuous-batching config carries on the TPU path (``None``: upstream's path)."""
    return getattr(config, "tpu_plan", None)
