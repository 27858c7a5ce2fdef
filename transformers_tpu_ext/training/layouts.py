"""The keys of a library trainer's own batches, grouped into the lengths they are padded to (pure).

Transformers' collators name their per-token tensors ``input_ids``, ``attention_mask``, ``labels``, ...
(:data:`~transformers_tpu_ext.training.buckets.SEQUENCE_PADDING`). Some trainers' collators prefix
them: TRL's ORPO and CPO return ``chosen_input_ids``, ``chosen_attention_mask``, ``chosen_labels`` and
the same for ``rejected_`` (and left-padded ``prompt_*`` for generation), KTO adds a second sequence,
``KL_input_ids``, ``KL_attention_mask``, ``KL_completion_mask``, run in a forward of its own.
A :class:`~transformers_tpu_ext.training.batch_facts.BatchLayout` (declared with the trainer's loss in
:mod:`.losses`) says which prefixes are padded to one length; :func:`layout_sides` finds them in a batch.

A prefixed key takes the padding of the per-token key it stands for (``chosen_labels``: -100), on the
right. Every tensor of the batch must be known: a per-token key of a group, a per-row tensor, or a
tensor the loss never reads; anything else leaves the batch as collated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .batch_facts import BatchLayout

__all__ = ["layout_sides"]


def layout_sides(
    shapes: Mapping[str, Sequence[int] | None], layout: BatchLayout, padding: Mapping[str, int | str]
) -> tuple[list[list[str]], dict[str, int | str], int] | str:
    """The keys of each group (padded to one length each, the bucket of its longest key), each key's padding
    value, and the batch's rows; or why the batch is left as collated. ``padding``: the padding value of
    each per-token key."""
    present = {k for k, shape in shapes.items() if shape is not None}
    fills: dict[str, int | str] = {}
    sides: list[list[str]] = []
    for group in layout.groups:
        keys = [prefix + base for prefix in group for base in padding if prefix + base in present]
        for prefix in group:
            for base in padding:
                if prefix + base in present:
                    fills[prefix + base] = padding[base]
        if keys:
            sides.append(keys)
    if not sides:
        return "no per-token tensor of the trainer's batches (input_ids, attention_mask, ...) in the batch"
    rows = shapes[sides[0][0]][0]
    for keys in sides:
        if any(len(shapes[k]) != 2 for k in keys):
            return f"{', '.join(k for k in keys if len(shapes[k]) != 2)}: not (batch, sequence)"
        if any(shapes[k][0] != rows for k in keys):
            return "per-token tensors with different numbers of rows"
    for key in layout.per_row:
        shape = shapes.get(key)
        if shape is not None and (len(shape) != 1 or rows % max(shape[0], 1)):
            return f"{key!r} is not one value per row"
    known = set(fills) | set(layout.per_row) | set(layout.unread)
    unknown = sorted(present - known)
    if unknown:
        return f"{', '.join(repr(k) for k in unknown)} in the trainer's batches: not read"
    return sides, fills, rows
