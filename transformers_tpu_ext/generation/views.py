"""What the caller's callbacks see of a bucketed ``generate()``: their own rows and lengths.

The generation patch pads the prompt on the left (``pad`` columns) and may add dummy rows at the end
of the batch (copies of a real row). Everything the user can observe through a callback goes through
a view that removes both:

- logits processors (the user's, ``prefix_allowed_tokens_fn`` and the ones upstream builds from the
  generation config) get ``input_ids[:real, pad:]`` and ``scores[:real]``; the dummy rows keep their
  raw scores;
- stopping criteria get the same ``input_ids`` (and scores); a dummy row reports what the first row
  reports;
- a streamer gets the real rows, and the prompt without the padding columns.

Rows are grouped as upstream groups them (``num_return_sequences`` / beams after each batch entry,
the dummy entries last), so the real rows of a tensor with ``n`` rows are its first
``n * real_batch // padded_batch``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["CriteriaView", "OnDevice", "Padding", "ProcessorsView", "StreamerView", "ids_on", "on_device"]


@dataclass(frozen=True)
class Padding:
    """The padding a bucketed call added: ``pad`` left columns, ``padded_batch - real_batch`` dummy entries."""

    pad: int = 0
    real_batch: int = 1
    padded_batch: int = 1

    @property
    def dummy(self) -> bool:
        return self.padded_batch != self.real_batch

    def __bool__(self) -> bool:
        return bool(self.pad) or self.dummy

    def real_rows(self, rows: int) -> int:
        """How many of ``rows`` rows (batch entries times beams or returned sequences) are the user's."""
        return rows * self.real_batch // self.padded_batch

    def ids(self, input_ids: Any) -> Any:
        """The user's view of a ``[rows, length]`` tensor of token ids: real rows, no padding columns."""
        return input_ids[: self.real_rows(input_ids.shape[0]), self.pad :]

    def rows(self, tensor: Any) -> Any:
        return tensor[: self.real_rows(tensor.shape[0])]


def _to(value: Any, device: Any) -> Any:
    """``value`` (a tensor, a tuple of them, anything else) on ``device``."""
    if isinstance(value, tuple):
        return tuple(_to(item, device) for item in value)
    to = getattr(value, "to", None)
    if to is None or not hasattr(value, "device") or value.device == device:
        return value
    return to(device)


class OnDevice:
    """A user's logits processor or stopping criterion, called with its tensors on ``device`` (the
    call's input device, where upstream's loop hands them); what it returns goes back to the device
    the loop gave (the host). See ``policy.callback_device``."""

    def __init__(self, callback: Any, device: Any) -> None:
        self.callback = callback
        self.device = device

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        home = input_ids.device
        return _to(self.callback(_to(input_ids, self.device), _to(scores, self.device), **kwargs), home)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.callback, name)


@functools.lru_cache(maxsize=64)
def _on_device_class(kind: type) -> type:
    """:class:`OnDevice` whose ``__call__`` shows the signature of ``kind``'s: upstream's
    ``LogitsProcessorList`` reads it to decide which keyword arguments a processor takes."""

    class Wrapper(OnDevice):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return OnDevice.__call__(self, input_ids, scores, **kwargs)

    Wrapper.__call__.__wrapped__ = kind.__call__  # type: ignore[attr-defined]
    Wrapper.__name__ = Wrapper.__qualname__ = f"OnDevice[{kind.__name__}]"
    return Wrapper


def on_device(callbacks: Any, user: frozenset[int], device: Any) -> Any:
    """``callbacks`` (a ``LogitsProcessorList`` / ``StoppingCriteriaList``) with each of the user's own
    (by identity: ``user``) wrapped in :class:`OnDevice`; the ones upstream built stay on the host."""
    if not callbacks or not any(id(callback) in user for callback in callbacks):
        return callbacks
    return type(callbacks)(_on_device_class(type(c))(c, device) if id(c) in user else c for c in callbacks)


def ids_on(function: Any, device: Any) -> Any:
    """``prefix_allowed_tokens_fn`` called with its row of ids on ``device``, as upstream calls it."""

    def prefix_allowed_tokens_fn(batch_id: int, input_ids: Any) -> Any:
        return function(batch_id, _to(input_ids, device))

    return prefix_allowed_tokens_fn


class ProcessorsView:
    """A ``LogitsProcessorList`` called with the user's rows and lengths only."""

    def __init__(self, processors: Any, padding: Padding) -> None:
        self.processors = processors
        self.padding = padding

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        padding = self.padding
        real = padding.real_rows(scores.shape[0])
        processed = self.processors(padding.ids(input_ids), scores[:real], **kwargs)
        if real == scores.shape[0]:
            return processed
        return torch.cat([processed, scores[real:].to(processed.dtype)], dim=0)

    def __iter__(self) -> Any:
        return iter(self.processors)

    def __len__(self) -> int:
        return len(self.processors)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.processors, name)


class CriteriaView:
    """A ``StoppingCriteriaList`` called with the user's rows and lengths.

    A dummy row reports what the first row reports: it never keeps the loop running longer than a
    real row, and it is fed the pad token exactly when the first row is (upstream feeds finished rows
    ``pad_token_id``, which may be no valid token at all, e.g. ``-1``, when no row ever finishes).
    """

    def __init__(self, criteria: Any, padding: Padding) -> None:
        self.criteria = criteria
        self.padding = padding

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        padding = self.padding
        rows = input_ids.shape[0]
        real = padding.real_rows(rows)
        user_scores = scores
        if isinstance(scores, torch.Tensor):
            user_scores = scores[:real]
        elif isinstance(scores, tuple):  # beam search hands the tuple of all scores so far
            user_scores = tuple(s[: padding.real_rows(s.shape[0])] for s in scores)
        done = self.criteria(padding.ids(input_ids), user_scores, **kwargs)
        if real == rows:
            return done
        return torch.cat([done, done[:1].expand(rows - real)])

    def __iter__(self) -> Any:
        return iter(self.criteria)

    def __len__(self) -> int:
        return len(self.criteria)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.criteria, name)


class StreamerView:
    """What the caller's streamer sees: the real rows, without the prompt's left padding."""

    def __init__(self, streamer: Any, padding: Padding) -> None:
        self._streamer = streamer
        self._padding = padding
        self._prompt_sent = False

    def put(self, value: Any) -> None:
        padding = self._padding
        if value.dim():
            rows = padding.real_rows(value.shape[0])
            if not self._prompt_sent and value.dim() == 2:
                value = value[:rows, padding.pad :]
            else:
                value = value[:rows]
        self._prompt_sent = True
        self._streamer.put(value)

    def end(self) -> None:
        self._streamer.end()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._streamer, name)
