"""Losses of your own that are known: the fine-tuning libraries' trainers whose loss ignores the padding.

A Trainer that overrides ``compute_loss`` is "a loss of your own" for the batch predicate
(:func:`transformers_tpu_ext.training.buckets.plan_batch`): whether it reads the padding is unknown,
so its batches are left as collated and every new length compiles a new program. TRL's trainers
override it, so fine-tuning with TRL would never reach a steady state. :func:`library_loss` names the
ones whose loss is read and proven to ignore right padding, from plain data (the class defining
``compute_loss``, the library's version, the options the loss depends on); everything else stays a
loss of your own. Plain data in, plain data out: no torch, no TRL.

What each known loss reads (TRL 1.16, read in its source and checked against the CPU by
``tests/training/test_trl.py``):

- ``SFTTrainer`` (``loss_type`` ``"nll"`` or ``"dft"``; completion-only and assistant-only loss, which
  the collator folds into ``labels``; ``packing=True``, whose padding-free rows the predicate pads as
  packed rows): the sum of ``-log p`` over the labels that are not ``-100`` (``-100`` on the padding),
  divided by their count (or the Trainer's ``num_items_in_batch``, counted from the labels); its
  entropy and token-accuracy metrics over the same labels. Its ``num_tokens`` metric counts
  ``attention_mask`` (0 on the padding; no row is added) or, for padding-free rows, the row's length:
  the padded length once the plugin pads such a row (the logged metric differs from a CPU run's; the
  loss and its gradients do not; docs/training.md says so).
- ``DPOTrainer`` (``loss_type`` ``"sigmoid"``, ``"hinge"``, ``"ipo"``, ``"sft"``, without
  ``use_weighting``): per-sequence sums of log-probabilities over ``completion_mask`` (0 on the
  padding), and their counts; the first half of the rows are the chosen answers, the second half the
  rejected ones, so no row is added.
- ``GRPOTrainer`` (every ``loss_type`` of TRL 1.16): per-token terms times ``completion_mask`` (0 on the
  padding), summed and divided by a count of that mask, a constant or ``num_items_in_batch``; its
  batches are built by the trainer, not a collator, so they are padded by the ``trl_grpo`` patch where
  :func:`transformers_tpu_ext.training.grpo.grpo_path` allows it (more in that module).

A ``compute_loss_func``, Liger kernels, or a version outside the range below is a loss of your own again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["KNOWN_LOSSES", "TRL_VERSIONS", "LibraryLoss", "library_loss"]

#: TRL releases whose losses were read: from 1.16 up to (not including) 2.0.
TRL_VERSIONS: tuple[tuple[int, ...], tuple[int, ...]] = ((1, 16), (2, 0))


@dataclass(frozen=True)
class LibraryLoss:
    """A library trainer's loss: the class defining ``compute_loss``, the option it depends on and the
    values of that option read and proven (``option_values``), and what it reads (the docs' words)."""

    trainer: str
    name: str
    option: str
    option_values: frozenset[str]
    reads: str
    versions: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # narrower than TRL_VERSIONS


KNOWN_LOSSES: dict[str, LibraryLoss] = {
    loss.trainer: loss
    for loss in (
        LibraryLoss(
            "trl.trainer.sft_trainer.SFTTrainer", "TRL's SFT loss", "loss_type", frozenset({"nll", "dft"}),
            "-log p over the labels that are not -100, divided by their count",
        ),
        LibraryLoss(
            "trl.trainer.dpo_trainer.DPOTrainer", "TRL's DPO loss", "loss_type", frozenset({"sigmoid", "hinge", "ipo", "sft"}),
            "log-probabilities summed over completion_mask; chosen and rejected answers are the two halves of the rows",
        ),
        LibraryLoss(
            "trl.trainer.grpo_trainer.GRPOTrainer", "TRL's GRPO loss", "loss_type",
            frozenset({"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"}),
            "per-token terms times completion_mask, divided by a count of that mask, a constant or num_items_in_batch",
            # the trl_grpo patch also wraps private methods of 1.16's GRPOTrainer: the next minor is read first
            versions=((1, 16), (1, 17)),
        ),
    )
}


def _version(text: str | None) -> tuple[int, ...] | None:
    parts = []
    for part in (text or "").split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts) if len(parts) == 2 else None


def library_loss(
    defined_by: str,
    *,
    version: str | None,
    compute_loss_func: bool = False,
    options: Mapping[str, Any] | None = None,
) -> LibraryLoss | str:
    """The known loss of a Trainer whose ``compute_loss`` is defined by ``defined_by`` (``module.qualname``),
    or why it stays a loss of your own.

    ``version``: the library's version; ``compute_loss_func``: a function of the user's replaces the
    loss; ``options``: the trainer's arguments the loss depends on (``loss_type`` as a string or a
    list of strings, ``use_liger_kernel``, ``use_weighting``).
    """
    loss = KNOWN_LOSSES.get(defined_by)
    if loss is None:
        return "a loss of your own (compute_loss or compute_loss_func): whether it ignores padding is unknown"
    found = _version(version)
    low, high = loss.versions or TRL_VERSIONS
    if found is None or not low <= found < high:
        return f"{loss.name} of TRL {version}: only TRL >= {'.'.join(map(str, low))}, < {'.'.join(map(str, high))} was read"
    if compute_loss_func:
        return f"{loss.name} with a compute_loss_func of your own: whether it ignores padding is unknown"
    options = options or {}
    if options.get("use_liger_kernel"):
        return f"{loss.name} with Liger kernels (use_liger_kernel=True): not read"
    if options.get("use_weighting"):
        return f"{loss.name} with use_weighting=True: not read"
    value = options.get(loss.option)
    values = [value] if isinstance(value, str) else list(value) if isinstance(value, Sequence) else [value]
    unknown = [v for v in values if v not in loss.option_values]
    if unknown or not values:
        return f"{loss.name} with {loss.option}={value!r}: only {', '.join(sorted(loss.option_values))} were read"
    return loss
