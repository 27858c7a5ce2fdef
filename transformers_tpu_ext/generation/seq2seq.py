"""Which encoder-decoder models ``generate()`` runs with the static cache on TPU (pure: plain data, no torch).

An encoder-decoder call is planned by ``policy.plan_call`` (``_encoder_decoder_plan``) for the families
below, whose generation code was read in Transformers 5.25; every other one (T5, BART, Marian, ...) is
upstream's, untouched, with one WARNING. For a family here:

- **the static cache**: upstream's own for encoder-decoder models (``_prepare_static_cache``: an
  ``EncoderDecoderCache`` of a ``StaticCache`` for the decoder's self-attention and one as long as the
  encoder's output for the cross-attention), where the caller asked for none; its length is rounded up to a
  bucket (and kept, as upstream keeps the longest), so every call of a batch size shares one compiled decode
  step;
- **what is not padded**: the encoder's input (Whisper's log-mel features are always 30 s, ``3000`` frames,
  which its encoder checks: there is no length to bucket, and its attention mask is not read), the decoder's
  prompt (the forced tokens Whisper's own ``generate()`` builds: start of transcript, language, task,
  timestamps) and the batch (Whisper's ``generate()`` reads every row it gets: no dummy rows);
- **the loop**: upstream's (the device loop is for decoder-only models), its growing tensors where upstream
  puts them;
- **long-form audio** (more than 30 s) is Whisper's own chunking: each 30-s segment is one such call.

Whisper's decoder takes its positions from the cache's length (``StaticLayer`` counts what it wrote), as
with the dynamic cache: the tokens are upstream's (checked against the CPU in ``tests/generation/test_seq2seq.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ENCODER_DECODER_FAMILIES", "why_upstream"]

#: ``config.model_type`` -> what makes the static-cache path exact for it.
ENCODER_DECODER_FAMILIES: Mapping[str, str] = {
    "whisper": "fixed-length (30 s) log-mel features, upstream's static EncoderDecoderCache, its cache length bucketed; "
               "decoder prompt and batch as given",
}


def why_upstream(facts: Any, kind: str | None) -> str | None:
    """Why an encoder-decoder call (``policy.CallFacts``; ``kind``: its ``policy.cache_choice``) is Transformers'
    own, or ``None``. The path returns its result on the host (Whisper's post-processing reads it there): Whisper's
    ``condition_on_prev_tokens`` feeds each segment's tokens into the next one's prompt beside tensors on the
    device, and the static cache it makes is not the dynamic one a caller continues from (``past_key_values=``)."""
    if facts.family not in ENCODER_DECODER_FAMILIES:
        return f"{facts.family}: not read"
    if facts.feeds_back:
        return "condition_on_prev_tokens: each segment's tokens start the next one's prompt, on the device"
    if kind == "default" and facts.returns_cache:
        return "return_dict_in_generate=True: the cache handed back would be the plugin's static one, not a dynamic one"
    return None
