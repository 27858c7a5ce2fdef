"""A request against the TPU paged cache's pool: what one request may hold (plain ints, no torch).

Transformers' scheduler gives a request the pages of its prompt and of every token it generates. A
request that needs more pages than the whole pool can never be scheduled: upstream's generation loop
then stops with "No requests can be scheduled and no requests can be offloaded." and fails *every*
request in flight with it (Transformers 5.24, ``ContinuousBatchProcessor.prepare_next_batch``). On the
TPU path the pool is known before the first request (``start()`` and ``generate_batch`` warm up, which
builds the cache), so ``add_request`` refuses such a prompt with a message naming the pool, and lowers
a ``max_new_tokens`` that would outgrow it; the requests in flight are untouched.
"""

from __future__ import annotations


def fit_to_pool(prompt_tokens: int, max_new_tokens: int | None, pool: int, *, num_blocks: int, page_size: int) -> int:
    """``max_new_tokens`` lowered so that the request fits the pool of ``pool`` tokens.

    Raises ``ValueError`` when the prompt alone leaves no room for a token (it could never be scheduled).
    """
    room = pool - prompt_tokens
    if room < 1:
        raise ValueError(
            f"this prompt has {prompt_tokens} tokens; the TPU paged KV cache holds {pool} tokens in all "
            f"({num_blocks} pages of {page_size} tokens), so the request could never be scheduled (Transformers "
            "would stop serving and fail every request in flight): shorten the prompt, or give the cache more "
            "pages (ContinuousBatchingConfig(num_blocks=...) within the chip's HBM, a smaller model or "
            "max_batch_tokens, TRANSFORMERS_TPU_EXT_HBM_HEADROOM)"
        )
    return room if max_new_tokens is None else min(max_new_tokens, room)
