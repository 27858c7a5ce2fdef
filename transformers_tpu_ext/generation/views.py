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

from dataclasses import dataclass
from typing import Any

__all__ = ["CriteriaView", "Padding", "ProcessorsView", "StreamerView"]


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
