"""Page geometry and memory of continuous batching on TPU: page size, block table, the HBM budget of the KV cache.

Plain functions over ints (no torch, no transformers); see ``docs/serving.md`` and ``serving.policy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .settings import ENV
from .shapes import _positive

__all__ = ["CachePlan", "blocks_per_request", "cache_plan", "fit_request", "kv_budget", "page_size_for", "step_bytes"]


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
    plan: Any,  # a ServingPlan (serving.plan)
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    itemsize: int,
    vocab_size: int,
    activation_bytes_per_token: int,
) -> int:
    """Working memory of the largest step besides the cache.

    Activations (``activation_bytes_per_token`` per token, Transformers' own estimate) and the float32
    logits of ``max_requests`` rows, plus what the step's attention makes in HBM:

    - the present path (``plan.attention == "paged"``): every token's gathered keys and values
      (``max_batch_tokens x max_len``) and their float32 attention scores;
    - the kernel path (``"ragged"``): the kernel reads each request's pages where they are and keeps its
      blocks in on-chip memory (VMEM), so nothing of ``max_len`` size: only its query and output tensors,
      ``max_batch_tokens x heads`` rows of ``lanes x head_dim`` (lane-packed queries fill 128 lanes).
    """
    tokens = plan.max_batch_tokens
    logits = plan.max_requests * vocab_size * 4
    if getattr(plan, "attention", "paged") == "ragged":
        lanes = getattr(getattr(plan, "kernel_variant", None), "lanes", 1) or 1
        return tokens * activation_bytes_per_token + 2 * tokens * heads * lanes * head_dim * itemsize + logits
    keys = plan.blocks_per_request * plan.page_size
    gathered = 2 * tokens * keys * kv_heads * head_dim * itemsize
    scores = tokens * heads * keys * 4
    return tokens * activation_bytes_per_token + gathered + scores + logits


def fit_request(prompt_tokens: int, max_new_tokens: int | None, max_len: int, positions: int | None = None) -> int:
    """``max_new_tokens`` for a request under ``max_len``: lowered to fit (or set, when ``None``).

    Raises ``ValueError`` (a 400 from ``transformers serve``) for a request the TPU path cannot serve:
    no prompt token, ``max_new_tokens`` below 1, a prompt that leaves no room for a token under the
    serving max length or the model's ``positions`` (``max_position_embeddings``).
    """
    if prompt_tokens < 1:
        raise ValueError("this request has an empty prompt (no token): continuous batching needs at least one prompt token")
    if max_new_tokens is not None and (isinstance(max_new_tokens, bool) or int(max_new_tokens) < 1):
        raise ValueError(f"max_new_tokens (max_tokens) must be at least 1, got {max_new_tokens!r}")
    if positions and prompt_tokens >= positions:
        raise ValueError(
            f"this prompt has {prompt_tokens} tokens; the model has {positions} positions "
            "(max_position_embeddings), so no token can be generated: shorten the prompt"
        )
    room = max_len - prompt_tokens
    if room < 1:
        raise ValueError(
            f"this prompt has {prompt_tokens} tokens; the TPU serving max length is {max_len} tokens (each request "
            f"reads its pages through a block table of fixed width): raise it with {ENV['max_len']} or shorten "
            "the prompt"
        )
    return room if max_new_tokens is None else min(max_new_tokens, room)
