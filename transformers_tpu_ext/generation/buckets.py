"""Shape buckets for generation on TPU: plain functions over ints (no torch, no transformers).

A TPU compiles one program per input shape, so a service that sees every prompt length, batch size
and ``max_new_tokens`` compiles forever unless shapes are rounded up to a small, fixed set. This
module decides those shapes; ``patch_generation`` applies them (the ladders are ``transformers_tpu_ext.ladders``).

The policy, and why it pads less *and* compiles less than the usual ones:

- **Prompt lengths up to the prefill chunk** (64) go to a geometric ladder with
  ``steps_per_octave`` rungs per doubling (default 1: 16, 32, 64; 2 gives 16, 32, 48, 64), each
  rung a multiple of 16 (the bf16 sublane tile: the hardware pads that far anyway).
- **Longer prompts** are prefilled chunk by chunk (upstream's chunked prefill): whole chunks, then
  the remainder padded to a rung. Every piece has a shape the short prompts already compiled (the
  static cache takes its write position from a tensor, the positions come from the attention
  mask), so lengths past the chunk add no program at all and waste only what the ladder wastes on
  the remainder. Powers of two (vLLM TPU) add a program per octave and waste up to half of a long
  prompt; a linear ``bucket_size`` (optimum-habana) adds a program per bucket and wastes up to a
  bucket. Ours: ``len(ladder)`` prefill shapes per batch bucket, whatever the longest prompt.
- **Batch sizes** use powers of two (dummy rows are copies of a real row, dropped on return).
- **Cache lengths** use the same kind of ladder from 64; Transformers keeps the largest static
  cache it has made, so after the largest request (or ``warmup()``) every call reuses one cache
  length.

``padding_overhead`` measures the price in tokens computed / tokens needed, and
``attention_overhead`` its other half: the positions each decode step attends to (a static cache's
whole length, masked) / the positions it needs (the sequence so far).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..ladders import round_up

__all__ = [
    "attention_overhead",
    "batch_bucket",
    "cache_bucket",
    "padding_overhead",
    "plan",
    "prefill_chunk",
    "prompt_bucket",
    "Plan",
    "warmup_prompts",
]


def prompt_bucket(length: int, ladder: Sequence[int], chunk: int | None) -> int:
    """Padded prompt length: a rung of ``ladder`` up to ``chunk``; past it, whole chunks plus a rung.

    A prompt longer than ``chunk`` is prefilled as ``k`` full chunks and one last piece (upstream's
    chunked prefill splits from the left, so the last piece is the remainder): padding that
    remainder up to a rung reuses a shape the short prompts already compiled, and wastes at most
    what the ladder wastes on the remainder alone.
    """
    rungs = [r for r in ladder if chunk is None or r <= chunk]
    if chunk is not None and (not rungs or rungs[-1] < chunk):
        rungs.append(chunk)
    if chunk is not None and length > chunk:
        full = -(-length // chunk) - 1
        return full * chunk + round_up(length - full * chunk, rungs)
    return round_up(length, rungs)


def prefill_chunk(padded_length: int, chunk: int | None) -> int:
    """The chunk the prefill of a ``padded_length`` prompt runs in (one chunk up to ``chunk``)."""
    if chunk is None or padded_length <= chunk:
        return padded_length
    return chunk


def batch_bucket(batch_size: int, ladder: Sequence[int]) -> int:
    """Padded batch size."""
    return round_up(batch_size, ladder)


def cache_bucket(needed: int, ladder: Sequence[int], floor: int | None = None) -> int:
    """Static-cache length for ``needed`` positions; never below ``floor`` (e.g. a warmed-up length)."""
    size = round_up(needed, ladder)
    return max(size, floor) if floor is not None else size


class Plan(tuple):
    """``(batch, prompt, chunk, cache)``: the shapes one ``generate()`` call runs with."""

    __slots__ = ()

    def __new__(cls, batch: int, prompt: int, chunk: int, cache: int) -> Plan:
        return super().__new__(cls, (batch, prompt, chunk, cache))

    batch = property(lambda self: self[0])
    prompt = property(lambda self: self[1])
    chunk = property(lambda self: self[2])
    cache = property(lambda self: self[3])

    def __repr__(self) -> str:
        return f"Plan(batch={self.batch}, prompt={self.prompt}, chunk={self.chunk}, cache={self.cache})"


def plan(
    batch_size: int,
    prompt_length: int,
    max_new_tokens: int,
    *,
    prompt_ladder: Sequence[int],
    chunk: int | None,
    batch_ladder: Sequence[int],
    cache_ladder: Sequence[int],
    cache_floor: int | None = None,
    min_padding: int = 0,
) -> Plan:
    """Bucket one call: padded batch, padded prompt, prefill chunk, static-cache length.

    ``min_padding`` reserves that many padding columns (the generation patch reserves one for a
    prompt with no padding at all, so every call takes the same masked path through the graphs).
    """
    if batch_size < 1 or prompt_length < 1 or max_new_tokens < 0:
        raise ValueError(
            f"cannot bucket batch_size={batch_size}, prompt_length={prompt_length}, max_new_tokens={max_new_tokens}"
        )
    batch = batch_bucket(batch_size, batch_ladder)
    prompt = prompt_bucket(prompt_length + min_padding, prompt_ladder, chunk)
    return Plan(
        batch,
        prompt,
        prefill_chunk(prompt, chunk),
        cache_bucket(prompt + max_new_tokens, cache_ladder, cache_floor),
    )


def warmup_rows(batch_sizes: Sequence[int] | None, largest: int, ladder: Sequence[int], *, sampling: bool) -> list[int]:
    """The batch sizes ``warmup()`` runs one call with, so that every batch the service makes finds its graphs.

    ``largest`` is the largest batch bucket. Greedy decoding compiles per batch *bucket*: one call per
    bucket the sizes map to (every bucket up to ``largest`` without ``batch_sizes``). Sampling draws
    over the real rows only, so its token choice compiles per *real* batch size: one call per size
    given (each call pads itself to its bucket, so the bucket's other graphs are shared).
    """
    if batch_sizes is None:
        return sorted({b for b in ladder if b < largest} | {largest})
    if sampling:
        return sorted(set(batch_sizes))
    return sorted({batch_bucket(b, ladder) for b in batch_sizes})


def warmup_prompts(max_prompt_length: int, ladder: Sequence[int], chunk: int | None) -> list[int]:
    """Every padded prompt length a call of up to ``max_prompt_length`` tokens runs with: ``warmup()``
    runs one call per length (and batch), so each finds its programs.

    A prompt may get one padding column (``min_padding``), so lengths up to ``max_prompt_length + 1``
    count. Past ``chunk`` the prefill reuses the chunk's graphs, but the call itself is not the same
    work: upstream computes the tokens left to prefill from the padded length on the device (a small
    program keyed by that length, as torch_tpu keys a program by its Python numbers), so every padded
    length past the chunk is warmed up too: ``len(ladder)`` calls per chunk of ``max_prompt_length``.
    """
    if max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    return sorted({prompt_bucket(length, ladder, chunk) for length in range(1, max_prompt_length + 2)})


def padding_overhead(calls: Iterable[tuple[int, int, int, int, int]]) -> float:
    """Tokens computed / tokens needed over ``(batch, prompt, new, padded_batch, padded_prompt)`` calls.

    A call that makes ``new`` tokens runs the prompt once and ``new - 1`` one-token decode steps: it
    needs ``batch * (prompt + new - 1)`` token computations and runs
    ``padded_batch * (padded_prompt + new - 1)``. 1.0 means no padding at all.
    """
    needed = computed = 0
    for batch, prompt, new, padded_batch, padded_prompt in calls:
        steps = max(new - 1, 0)
        needed += batch * (prompt + steps)
        computed += padded_batch * (padded_prompt + steps)
    return computed / needed if needed else 1.0


def attention_overhead(calls: Iterable[tuple[int, int, int, int, int | None]]) -> float:
    """Positions attended / positions needed by the decode steps of ``(batch, prompt, new, padded_batch, attended)`` calls.

    Decode step ``j`` (``1 <= j < new``) of a call needs the ``prompt + j`` positions of its sequence;
    with a static cache it attends to the cache's ``attended`` positions (masked beyond the sequence),
    for every row of the padded batch. ``attended=None`` means exactly what is needed (a dynamic
    cache). Over a workload whose first call is long, every later call attends to that long cache:
    this is the cost the prompt padding ratio does not show. 1.0 means none.
    """
    needed = computed = 0
    for batch, prompt, new, padded_batch, attended in calls:
        steps = max(new - 1, 0)
        need = steps * prompt + steps * (steps + 1) // 2
        needed += batch * need
        computed += padded_batch * (need if attended is None else steps * attended)
    return computed / needed if needed else 1.0
