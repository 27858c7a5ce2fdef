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
  :func:`transformers_tpu_ext.training.grpo.grpo_path` allows it (more in that module). ``trl.experimental``'s
  ``GMPOTrainer`` (a ``GRPOTrainer`` with its own ``_compute_loss``: a geometric mean of the clipped
  token ratios) masks every term the same way.
- ``RewardTrainer``: one score per sequence, the sequence classifier's at the last token that is not the
  pad token (``model.config.pad_token_id``, which TRL sets, is what the padding uses), chosen and
  rejected answers the two halves of the rows, an optional per-pair ``margin``; its ``num_tokens``
  metric counts ``attention_mask``.
- ``KTOTrainer`` (``loss_type`` ``"kto"``, ``"apo_zero_unpaired"``; also ``trl.experimental.kto``'s):
  per-sequence sums of log-probabilities over ``completion_mask`` for the completions and, in a
  forward of their own, for the mismatched KL completions (``KL_*``, a second length); rows are split
  by their ``label`` (a count of rows: :mod:`.host_counts` keeps such tensors on the host); entropy
  and ``logits/*`` over the same mask.
- ``ORPOTrainer`` and ``CPOTrainer`` (``trl.experimental``; CPO's ``loss_type`` ``"sigmoid"``, ``"hinge"``,
  ``"ipo"``, ``"simpo"``): chosen and rejected answers (``chosen_*``, ``rejected_*``, concatenated to
  the longer of the two, so padded together) scored over their ``labels`` (-100 on the prompt and the
  padding: sums, or means over that count), the NLL term over the same labels (ORPO: over the
  attention mask). Their logged ``logits/chosen`` and ``logits/rejected`` are TRL's mean of the
  logits over every position of the batch, padding included: the padded batch averages over more
  positions (docs/training.md says so); the loss and the other metrics do not read it.

A ``compute_loss_func``, Liger kernels, a subclass that changes a loss helper, or a version outside the
range read is a loss of your own again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .batch_facts import BatchLayout

__all__ = [
    "DECLARED", "HOW_TO_DECLARE", "KNOWN_LOSSES", "TRL_VERSIONS", "LibraryLoss", "PaddingDeclaration", "declared_check",
    "ignores_padding", "library_loss", "own_loss_reason",
]

#: TRL releases whose losses were read: from 1.16 up to (not including) 2.0.
TRL_VERSIONS: tuple[tuple[int, ...], tuple[int, ...]] = ((1, 16), (2, 0))


@dataclass(frozen=True)
class LibraryLoss:
    """A library trainer's loss: the class defining it (the most derived one defining ``compute_loss`` or a
    loss helper), the option it depends on and the values of that option read and proven
    (``option_values``; ``option=None``: one loss), what it reads (the docs' words), the keys of its
    batches where they are not Transformers' own (``layout``), and whether its step makes tensors whose
    length is a count in the data (``counts``: selections by a mask or a label, kept on the host by
    :mod:`.host_counts`)."""

    trainer: str
    name: str
    option: str | None
    option_values: frozenset[str]
    reads: str
    versions: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # narrower than TRL_VERSIONS
    layout: BatchLayout | None = None
    counts: bool = False


#: TRL's ``DPODataCollatorWithPadding`` batches (ORPO, CPO): chosen and rejected answers, concatenated by the
#: trainer to the longer of the two (padded together); prompts padded on the left for generation in evaluation.
_PREFERENCE_PAIRS = BatchLayout(groups=(("chosen_", "rejected_"),), unread=("prompt_input_ids", "prompt_attention_mask"))

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
            counts=True,  # logits/* as x[completion_mask.bool()].sum(); loss_type="sft" as a mean of such a selection
        ),
        LibraryLoss(
            "trl.trainer.grpo_trainer.GRPOTrainer", "TRL's GRPO loss", "loss_type",
            frozenset({"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"}),
            "per-token terms times completion_mask, divided by a count of that mask, a constant or num_items_in_batch",
            # the trl_grpo patch also wraps private methods of 1.16's GRPOTrainer: the next minor is read first
            versions=((1, 16), (1, 17)),
            counts=True,  # eos_idx[is_eos.any(1)] = ..., completion lengths[~is_truncated]
        ),
        LibraryLoss(
            "trl.experimental.gmpo.gmpo_trainer.GMPOTrainer", "TRL's GMPO loss", None, frozenset(),
            "the geometric mean of clipped token ratios over completion_mask, KL and metrics over the same mask",
            versions=((1, 16), (1, 17)),  # trl.experimental, and GRPO's private methods
            counts=True,  # GRPO's completions, nanmin/nanmax of the clip ratios
        ),
        LibraryLoss(
            "trl.trainer.reward_trainer.RewardTrainer", "TRL's reward-model loss", None, frozenset(),
            "one score per sequence at its last non-pad token; chosen and rejected answers are the two halves of the rows",
        ),
        LibraryLoss(
            "trl.trainer.kto_trainer.KTOTrainer", "TRL's KTO loss", "loss_type", frozenset({"kto", "apo_zero_unpaired"}),
            "log-probabilities summed over completion_mask, for the completions and the KL completions (KL_*)",
            layout=BatchLayout(groups=(("",), ("KL_",)), per_row=("label", "ref_logps", "ref_KL_logps")),
            counts=True,  # nonzero(label) and index_select by it; logits/* as selections by the mask
        ),
        LibraryLoss(
            "trl.experimental.orpo.orpo_trainer.ORPOTrainer", "TRL's ORPO loss", None, frozenset(),
            "log-probabilities and the NLL term over labels that are not -100; chosen and rejected padded together "
            "(its logged logits/* average every position, the padding's too)",
            versions=((1, 16), (1, 17)),  # trl.experimental: may change in any release
            layout=_PREFERENCE_PAIRS,
        ),
        LibraryLoss(
            "trl.experimental.cpo.cpo_trainer.CPOTrainer", "TRL's CPO loss", "loss_type",
            frozenset({"sigmoid", "hinge", "ipo", "simpo"}),
            "log-probabilities and the NLL term over labels that are not -100; chosen and rejected padded together "
            "(its logged logits/* average every position, the padding's too)",
            versions=((1, 16), (1, 17)),
            layout=_PREFERENCE_PAIRS,
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
        return "a loss of your own (compute_loss or compute_loss_func)"
    found = _version(version)
    low, high = loss.versions or TRL_VERSIONS
    if found is None or not low <= found < high:
        return f"{loss.name} of TRL {version}: only TRL >= {'.'.join(map(str, low))}, < {'.'.join(map(str, high))} was read"
    if compute_loss_func:
        return f"{loss.name} with a compute_loss_func of your own"
    options = options or {}
    if options.get("use_liger_kernel"):
        return f"{loss.name} with Liger kernels (use_liger_kernel=True): not read"
    if options.get("use_weighting"):
        return f"{loss.name} with use_weighting=True: not read"
    if loss.option is None:
        return loss
    value = options.get(loss.option)
    values = [value] if isinstance(value, str) else list(value) if isinstance(value, Sequence) else [value]
    unknown = [v for v in values if v not in loss.option_values]
    if unknown or not values:
        return f"{loss.name} with {loss.option}={value!r}: only {', '.join(sorted(loss.option_values))} were read"
    return loss


# -- a loss of your own, declared padding-safe ------------------------------------------------------------

#: The attribute :func:`ignores_padding` sets on a ``compute_loss``, a ``compute_loss_func`` or a Trainer class.
DECLARED = "__tpu_ext_ignores_padding__"
#: How far the declared loss of the first batch, padded, may be from the same batch as collated: relative to
#: the collated loss (and at least this much absolute). Summing the same tokens in another order moves a
#: float32 loss by about 1e-6; a loss that reads the padded length moves by the padding's share.
DECLARED_TOLERANCE = 1e-3

#: Said for a loss the plugin does not know, in the log and the docs' table.
HOW_TO_DECLARE = "if it ignores padded positions and rows, declare it with transformers_tpu_ext.training.ignores_padding"


@dataclass(frozen=True)
class PaddingDeclaration:
    """A user's word that a loss ignores the padding the plugin adds: positions past each row's collated
    length (the mask 0, the labels -100, ``completion_mask`` 0) and, with ``rows``, rows added to a partial
    batch (copies of its first row, labels -100). Checked on the first batch (:func:`declared_check`)."""

    rows: bool = True


def ignores_padding(obj: Any = None, *, rows: bool = True) -> Any:
    """Declare that a loss of your own ignores padded positions (and, ``rows=True``, padded rows).

    Decorate the ``compute_loss`` method of your Trainer, the Trainer class itself, or a function given as
    ``compute_loss_func``::

        class MyTrainer(Trainer):
            @ignores_padding
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None): ...

        @ignores_padding(rows=False)         # it reads every row (pairs, groups): lengths only
        class MyPairTrainer(DPOTrainer): ...

    On TPU the Trainer's batches are then padded as a Transformers model's own loss allows; the first
    batch checks the word (its loss padded and as collated, see docs/training.md). Returns ``obj``, marked.
    """

    def mark(target: Any) -> Any:
        setattr(target, DECLARED, PaddingDeclaration(rows=rows))
        return target

    return mark if obj is None else mark(obj)


def declared_check(what: str, collated: float, padded: float, shape: str, tolerance: float = DECLARED_TOLERANCE) -> str | None:
    """Why the declaration of ``what`` (a ``Class.compute_loss``) does not hold on the first batch, or ``None``:
    ``collated`` is its loss on the batch as collated, ``padded`` on the same batch padded as ``shape`` says."""
    if collated != collated or padded != padded:  # NaN: nothing to compare
        return None if (collated != collated) == (padded != padded) else f"{what} gives {collated} as collated and {padded} padded"
    if abs(padded - collated) <= tolerance * max(abs(collated), 1.0):
        return None
    return (
        f"{what} is declared with @ignores_padding, but its loss on the first batch is {collated:.6g} as collated and "
        f"{padded:.6g} padded ({shape}): it reads the padding. Remove @ignores_padding (its batches are then left "
        "as the collator made them), or ignore the padding: positions where attention_mask is 0 or labels are -100"
        ", and rows whose labels are all -100"
    )


def own_loss_reason(what: str) -> str:
    """The reason a loss the plugin does not know leaves its batches as collated (log and docs)."""
    return f"{what}: whether it ignores padding is unknown ({HOW_TO_DECLARE})"
