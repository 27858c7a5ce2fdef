"""The device-resident decoding loop: only token ids cross between the host and the TPU.

Upstream's loop (``GenerationMixin._sample``) copies the last position's logits to the host every
step (``vocab_size x 4`` bytes a row), runs the logits processors and the token choice there, and,
with the growing tensors on the CPU as the Google guide recommends, rebuilds the 4D attention mask
on the host and sends it back. This loop, used by the generation patch for greedy decoding and
sampling whose processors need nothing but the scores (``policy.decode_path``), keeps
upstream's pieces (its prefill, ``prepare_inputs_for_generation``, the compiled forward, its
stopping criteria, its streamer protocol) and changes where three things happen:

- **Token choice on the TPU**, in a small compiled function: the minimum-length masks, temperature,
  top-k, top-p and min-p (the same operations as upstream's warpers, with their parameters as
  tensors: one graph for every value), then ``argmax`` or ``multinomial`` over the real rows,
  drawing from the TPU's default generator (seeded by ``torch.manual_seed``). Only the chosen ids
  come back: 8 bytes a row and step.
- **The attention mask stays on the TPU**: the call's 2D mask as long as the static cache, sent once
  before the prefill (:func:`call_mask`: padding columns 0, everything else 1; causality hides the
  positions not written yet). The model builds its 4D masks inside the compiled forward, for the
  prefill chunks and every step.
- **Positions stay on the TPU** and advance by one inside the compiled choice.

The ids the host appended (finished rows get the pad token, as upstream feeds them) go back as
the next step's input: 8 bytes a row. The host keeps the growing sequences for the result, the
stopping criteria and the streamer, exactly as upstream does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceSelector", "call_mask", "sample_on_device"]


def call_mask(mask: Any, cache: Any, rows: int, device: Any) -> Any:
    """The call's 2D mask on ``device`` (bool, ``[rows, cache length]``: ``mask``'s columns, then ones;
    all ones if upstream dropped an all-ones mask), or ``None`` where it does not apply (a cache of
    no single length, a mask that is not 2D or is longer than the cache). Sent once per call."""
    import torch

    length = _cache_length(cache)
    if length is None and mask is not None and mask.dim() == 2 and getattr(cache, "layers", None):
        length = mask.shape[1]  # recurrent states alone (Mamba): no decode step reads the mask
    if length is None or (mask is not None and (mask.dim() != 2 or mask.shape[0] != rows or mask.shape[1] > length)):
        return None
    full = torch.ones((rows, length), dtype=torch.bool)
    if mask is not None:
        full[:, : mask.shape[1]] = mask.cpu().bool()
    return full.to(device)


# -------------------------------------------------------------------------------------------------
# Token choice


@dataclass(frozen=True)
class _Op:
    """One step of the token choice: ``kind`` with its structural settings (guarded by the graph)."""

    kind: str  # "min_length", "temperature", "top_k", "top_p", "min_p"
    min_tokens_to_keep: int = 1
    filter_value: float = -math.inf


def _process(scores, params, eos_mask, ops, suppress):  # noqa: ANN001, ANN202
    """Process float ``scores`` ([rows, vocab]) like upstream's processors, operation for operation.

    ``params`` holds one tensor per op (temperature, k, 1 - top_p, min_p; unused for min_length),
    ``suppress`` one bool per op (whether a minimum-length op masks the end-of-sequence ids now).
    Mirrors ``transformers.generation.logits_process``: ``TemperatureLogitsWarper``,
    ``TopKLogitsWarper``, ``TopPLogitsWarper``, ``MinPLogitsWarper`` and the two minimum-length
    processors, so the scores are bitwise the ones upstream computes.
    """
    import torch

    for op, value, active in zip(ops, params, suppress):
        if op.kind == "min_length":
            if active:
                scores = torch.where(eos_mask, -math.inf, scores)
        elif op.kind == "temperature":
            scores = scores / value
        elif op.kind == "top_k":
            # upstream: scores < torch.topk(scores, k)[0][..., -1, None]; k as a tensor
            kth = torch.sort(scores, dim=-1, descending=True)[0].gather(-1, (value - 1).expand(scores.shape[0], 1))
            scores = scores.masked_fill(scores < kth, op.filter_value)
        elif op.kind == "top_p":
            sorted_logits, sorted_indices = torch.sort(scores, descending=False)
            cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            sorted_indices_to_remove = cumulative_probs <= value  # value = 1 - top_p, computed on the host
            sorted_indices_to_remove[..., -op.min_tokens_to_keep :] = 0
            indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
            scores = scores.masked_fill(indices_to_remove, op.filter_value)
        elif op.kind == "min_p":
            probs = torch.softmax(scores, dim=-1)
            top_probs = probs.amax(dim=-1, keepdim=True)
            tokens_to_remove = probs < value * top_probs
            k = min(op.min_tokens_to_keep, probs.shape[-1])
            tokens_to_remove.scatter_(-1, torch.topk(probs, k, dim=-1).indices, False)
            scores = scores.masked_fill(tokens_to_remove, op.filter_value)
    return scores


def _choose(logits, positions, params, eos_mask, ops, suppress, sample, real_rows):  # noqa: ANN001, ANN202
    """The token ids for ``logits`` ([rows, vocab]) and the next positions: compiled, on the TPU."""
    import torch

    scores = _process(logits.float(), params, eos_mask, ops, suppress)
    if sample:
        # Only the real rows draw random numbers, so the stream is the one the unpadded call draws.
        probs = torch.nn.functional.softmax(scores[:real_rows], dim=-1)
        chosen = probs.multinomial(num_samples=1).squeeze(1)  # the method: no guard on torch.multinomial
        if real_rows < scores.shape[0]:
            chosen = torch.cat([chosen, chosen.new_zeros(scores.shape[0] - real_rows)])
    else:
        chosen = torch.argmax(scores, dim=-1)
    return chosen, None if positions is None else positions + 1


@functools.lru_cache(maxsize=8)
def _compiled_choose(backend: Any, options: Any) -> Any:
    import torch

    return torch.compile(_choose, backend=backend, dynamic=False, options=dict(options) if options else None)


class DeviceSelector:
    """The token choice of one call, built from upstream's prepared logits processors."""

    def __init__(self, processors: Any, *, sample: bool, device: Any, real_rows: int, compile_backend: Any) -> None:
        import torch

        ops, params, length_rules = [], [], []
        eos = None
        for processor in processors:
            name = type(processor).__name__
            filter_value = float(getattr(processor, "filter_value", -math.inf))
            keep = int(getattr(processor, "min_tokens_to_keep", 1))
            if name == "TemperatureLogitsWarper":
                ops.append(_Op("temperature"))
                params.append(torch.tensor(float(processor.temperature), dtype=torch.float32))
            elif name == "TopKLogitsWarper":
                ops.append(_Op("top_k", keep, filter_value))
                params.append(torch.tensor([int(processor.top_k)], dtype=torch.long))  # min(k, vocab): see below
            elif name == "TopPLogitsWarper":
                ops.append(_Op("top_p", keep, filter_value))
                params.append(torch.tensor(1 - float(processor.top_p), dtype=torch.float32))
            elif name == "MinPLogitsWarper":
                ops.append(_Op("min_p", keep, filter_value))
                params.append(torch.tensor(float(processor.min_p), dtype=torch.float32))
            elif name == "MinLengthLogitsProcessor":
                ops.append(_Op("min_length"))
                params.append(torch.zeros((), dtype=torch.float32))
                length_rules.append((len(ops) - 1, lambda length, p=processor: length < p.min_length))
                eos = processor.eos_token_id
            elif name == "MinNewTokensLengthLogitsProcessor":
                ops.append(_Op("min_length"))
                params.append(torch.zeros((), dtype=torch.float32))
                length_rules.append(
                    (len(ops) - 1, lambda length, p=processor: length - p.prompt_length_to_skip < p.min_new_tokens)
                )
                eos = processor.eos_token_id
            else:  # generation_policy.decode_path only lets the processors above through
                raise ValueError(f"no device implementation of {name}")
        self.ops = tuple(ops)
        self._params_host = params
        self._length_rules = length_rules
        self._eos = eos
        self.sample = sample
        self.device = device
        self.real_rows = real_rows
        self._choose = _compiled_choose(compile_backend, None) if compile_backend is not None else _choose
        self._params = None
        self._eos_mask = None

    def _prepare(self, vocab: int) -> None:
        import torch

        params = []
        for op, value in zip(self.ops, self._params_host):
            if op.kind == "top_k":
                value = value.clamp(max=vocab)
            params.append(value.to(self.device))
        self._params = tuple(params)
        if self._eos is not None:
            eos = torch.as_tensor(self._eos).reshape(-1).cpu()
            self._eos_mask = torch.isin(torch.arange(vocab), eos).to(self.device)
        else:  # a placeholder, so the graph's inputs keep one signature
            self._eos_mask = torch.zeros(vocab, dtype=torch.bool).to(self.device)

    def _suppress(self, length: int) -> tuple[bool, ...]:
        suppress = [False] * len(self.ops)
        for index, rule in self._length_rules:
            suppress[index] = bool(rule(length))
        return tuple(suppress)

    def __call__(self, logits: Any, positions: Any, length: int) -> tuple[Any, Any]:
        """Token ids for ``logits`` ([rows, vocab], on the TPU); ``length`` is the user's current length."""
        if self._params is None:
            self._prepare(logits.shape[-1])
        # The real rows matter to sampling only; greedy passes the batch, so its graph is per bucket.
        real_rows = self.real_rows if self.sample else logits.shape[0]
        return self._choose(
            logits, positions, self._params, self._eos_mask, self.ops, self._suppress(length), self.sample, real_rows
        )

    def process(self, logits: Any, length: int) -> Any:
        """The processed scores (what the choice picks from), uncompiled: for tests and debugging."""
        if self._params is None:
            self._prepare(logits.shape[-1])
        return _process(logits.float(), self._params, self._eos_mask, self.ops, self._suppress(length))


# -------------------------------------------------------------------------------------------------
# The loop


def sample_on_device(
    model: Any,
    input_ids: Any,
    *,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    streamer: Any,
    padding: Any,
    compile_backend: Any,
    model_kwargs: dict,
    mask: Any,
) -> Any:
    """Greedy decoding or sampling with the choice on the TPU; returns what ``_sample`` returns.

    ``input_ids`` (padded, on the CPU) grow on the host; ``logits_processor`` is upstream's prepared
    list (only processors ``DeviceSelector`` implements); ``stopping_criteria`` and ``streamer`` are
    already the user's views; ``padding`` is the call's ``generation_views.Padding``; ``mask`` is the
    call's device mask (:func:`call_mask`), which the mask builder hands the model for this call.
    """
    import torch
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    from .call import cache_key

    device = model.device
    pad_token_id = generation_config._pad_token_tensor
    has_eos_stopping_criteria = any(hasattr(criteria, "eos_token_id") for criteria in stopping_criteria)
    rows = input_ids.shape[0]
    selector = DeviceSelector(
        logits_processor,
        sample=bool(generation_config.do_sample),
        device=device,
        real_rows=padding.real_rows(rows),
        compile_backend=compile_backend,
    )
    unfinished = torch.ones(rows, dtype=torch.long)
    model_forward = (
        model.get_compiled_call(generation_config.compile_config)
        if model._valid_auto_compile_criteria(model_kwargs, generation_config)
        else model.__call__
    )

    outputs = model._prefill(input_ids, generation_config, model_kwargs, is_first_iteration=True)
    model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder=False)
    key = cache_key()  # "cache" (Transformers 5.24+) or "past_key_values" (5.23)
    cache = model_kwargs.get(key)
    positions = model_kwargs.get("position_ids")
    if positions is not None:
        # The prefill's last position (every axis of a multimodal model's 3-D positions); the choice adds one.
        positions = (positions[..., -1:] - 1).to(device)
    step_kwargs = {
        name: value
        for name, value in model_kwargs.items()
        if name not in ("attention_mask", "position_ids", key, "inputs_embeds")
    }
    if isinstance(step_kwargs.get("mm_token_type_ids"), torch.Tensor):  # upstream appends text (0) every step
        step_kwargs["mm_token_type_ids"] = step_kwargs["mm_token_type_ids"].new_zeros((rows, 1)).to(device)

    chosen, positions = selector(outputs.logits[:, -1, :], positions, input_ids.shape[1] - padding.pad)
    del outputs
    with model._optimize_model_for_decode():
        while True:
            tokens = chosen.cpu()
            if has_eos_stopping_criteria:
                tokens = tokens * unfinished + pad_token_id * (1 - unfinished)
            input_ids = torch.cat([input_ids, tokens[:, None]], dim=-1)
            unfinished = unfinished & ~stopping_criteria(input_ids, None)
            if streamer is not None:
                streamer.put(tokens)
            if unfinished.max() == 0:
                break
            model_inputs = model.prepare_inputs_for_generation(
                tokens[:, None].to(device),
                next_sequence_length=1,
                attention_mask=mask,
                position_ids=positions,
                **{key: cache},
                **step_kwargs,
            )
            outputs = model_forward(**model_inputs, return_dict=True)
            cache = outputs.get(key, cache)
            chosen, positions = selector(outputs.logits[:, -1, :], positions, input_ids.shape[1] - padding.pad)
            del outputs

    if streamer is not None:
        streamer.end()
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=input_ids, **{key: cache})
    return input_ids


def _cache_length(cache: Any) -> int | None:
    lengths = [getattr(layer, "max_cache_len", None) for layer in getattr(cache, "layers", ())]
    lengths = [length for length in lengths if isinstance(length, int)]
    return max(lengths) if lengths else None
