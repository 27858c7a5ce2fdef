"""Tensor-parallel plan rewriting: plain functions over configs and plans (``{pattern: style}`` dicts).

When a model is loaded with ``DistributedConfig(tp_size=N)``, the patch ``patch_tp_plan_rewrite``
hands :func:`rewrite_plan` the model's *effective* plan (its default plan merged with the user's
``tp_plan``; the user's entries always win). Each registered rewriter looks at the config and the plan
and may return a rewritten plan with a one-line reason; the reasons are logged once per load. The
result is then checked by :func:`validate_plan`, which raises :class:`TPPlanError` for a plan that
cannot work, before any weight is loaded.

Built-in rewriters, in order:

- ``kv_heads``: key-value heads that ``tp_size`` does not divide. When ``tp_size`` is a multiple of
  the KV head count (and divides the query heads), each KV head is replicated on
  ``tp_size // num_key_value_heads`` ranks (``k_proj``/``v_proj`` get the style
  :data:`KV_REPLICATED_STYLE`; the query heads, ``o_proj`` and the MLP stay sharded). Otherwise every
  rule of the attention block becomes ``"replicate"`` (the guide's manual fix, automatically).
- ``tied_embeddings``: tied input/output embeddings are one weight, so the embedding and the output
  head must shard it the same way; the rule that is not the user's is aligned with the other one.

Add your own with :func:`register_rewriter`. Nothing here imports torch or Transformers.

Where the patches rewrite is :data:`TP_REWRITE_ENV` (``TRANSFORMERS_TPU_EXT_TP_REWRITE``), read by
:func:`rewrite_mode` each time a patched function runs: ``auto`` (the default) only when a TPU is
present, so that without one the plugin changes nothing; ``always`` on any device (CPU/GPU clusters
that want the fix); ``never`` not at all. The functions here work on any device regardless.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..settings.parser import parse
from .settings import SETTINGS as _SETTINGS
from .heads import (  # the plain helpers over configs and plans, re-exported here
    _KEY,
    _QUERY,
    _VALUE,
    KV_REPLICATED_STYLE,
    KVReplication,
    _ties_embeddings,
    attention_blocks,
    head_counts,
    kv_replication,
    replicated_kv_heads_per_rank,
)

__all__ = [
    "KV_REPLICATED_STYLE",
    "replicated_kv_heads_per_rank",
    "REPLICATE_STYLE",
    "TP_REWRITE_ENV",
    "TP_REWRITE_MODES",
    "KVReplication",
    "PlanContext",
    "PlanRewrite",
    "Rewrite",
    "Rewriter",
    "TPPlanError",
    "attention_blocks",
    "head_counts",
    "kv_replication",
    "register_rewriter",
    "registered_rewriters",
    "rewrite_enabled",
    "rewrite_mode",
    "rewrite_plan",
    "unregister_rewriter",
    "validate_plan",
]

#: Transformers' style for a module every rank keeps whole (no collective, no gradient reduction).
REPLICATE_STYLE = "replicate"

# Styles whose output (for a linear: the weight's dim 0) is sharded, leaving each rank a slice of heads.
_SHARDED_OUTPUT = frozenset({"colwise"})
# Styles that expect their input sharded on the last dim (the heads of the previous colwise layer).
_SHARDED_INPUT = frozenset({"rowwise"})
# Which dim of a [vocab, hidden] weight each embedding / head style shards (None: whole on every rank).
_EMBEDDING_DIM = {"embedding_rowwise": 0, "embedding_colwise": 1, REPLICATE_STYLE: None}
_HEAD_DIM = {
    "colwise": 0,
    "colwise_gather_output": 0,
    "colwise_rep": 0,
    "rowwise": 1,
    "rowwise_split_input": 1,
    "rowwise_rep": 1,
    REPLICATE_STYLE: None,
}
# The style to give a tied head / embedding so that it shards the shared weight on a given dim.
_HEAD_FOR_DIM = {0: "colwise_gather_output", 1: "rowwise_split_input", None: REPLICATE_STYLE}
_EMBEDDING_FOR_DIM = {0: "embedding_rowwise", 1: "embedding_colwise", None: REPLICATE_STYLE}

_OUTPUT = "o_proj"


class TPPlanError(ValueError):
    """A tensor-parallel plan that cannot work for this model; raised before any weight is loaded."""


# --------------------------------------------------------------------------------------------------
# Where the patches rewrite

#: The environment variable choosing where the ``tp_plan_rewrite`` and ``tp_kv_cache`` patches act.
TP_REWRITE_ENV = "TRANSFORMERS_TPU_EXT_TP_REWRITE"
#: Its values: ``auto`` (default: only when a TPU is present), ``always`` (any device), ``never``.
TP_REWRITE_MODES = ("auto", "always", "never")
_REWRITE = next(s for s in _SETTINGS if s.name == TP_REWRITE_ENV)
assert _REWRITE.choices == TP_REWRITE_MODES


def rewrite_mode(environ: Mapping[str, str] | None = None) -> str:
    """The value of :data:`TP_REWRITE_ENV` (``"auto"`` when unset or empty), parsed by the settings layer's
    one parser from its declaration (``parallelism.settings``); ``ValueError`` if invalid."""
    raw = (os.environ if environ is None else environ).get(TP_REWRITE_ENV, "")
    return parse(_REWRITE, raw) if raw.strip() else "auto"


def rewrite_enabled(tpu_available: Callable[[], bool], environ: Mapping[str, str] | None = None) -> bool:
    """Whether the TP patches act now: ``always``, or ``auto`` and ``tpu_available()`` (asked only then)."""
    mode = rewrite_mode(environ)
    return mode == "always" or (mode == "auto" and bool(tpu_available()))


@dataclass(frozen=True)
class PlanContext:
    """What a rewriter sees. ``plan`` already holds the user's entries and earlier rewrites."""

    config: Any
    plan: Mapping[str, str]
    tp_size: int
    user_plan: Mapping[str, str] = field(default_factory=dict)
    model_name: str = "model"

    def is_user(self, key: str) -> bool:
        """Whether ``key`` was given by the user (the rewrite of such a key is discarded)."""
        return key in self.user_plan


@dataclass(frozen=True)
class Rewrite:
    """A rewriter's answer: the whole new plan and a one-line reason (what changed and why)."""

    plan: Mapping[str, str]
    reason: str


@dataclass(frozen=True)
class PlanRewrite:
    """The result of :func:`rewrite_plan`: the final plan and one ``"name: reason"`` per rewrite."""

    plan: dict[str, str]
    reasons: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.reasons)


Rewriter = Callable[[PlanContext], "Rewrite | None"]

_REWRITERS: dict[str, Rewriter] = {}


def register_rewriter(name: str, rewriter: Rewriter | None = None, *, replace: bool = False) -> Any:
    """Add a rewriter (run after those already registered). Usable as a decorator.

    A rewriter takes a :class:`PlanContext` and returns a :class:`Rewrite` or ``None`` (no change).
    It must be a pure function of the context; the user's entries win over whatever it returns.
    """

    def add(function: Rewriter) -> Rewriter:
        if name in _REWRITERS and not replace:
            raise ValueError(f"a TP-plan rewriter named {name!r} is already registered (pass replace=True)")
        _REWRITERS[name] = function
        return function

    return add if rewriter is None else add(rewriter)


def unregister_rewriter(name: str) -> Rewriter | None:
    """Remove a rewriter; returns it (``None`` if there was none of that name)."""
    return _REWRITERS.pop(name, None)


def registered_rewriters() -> tuple[str, ...]:
    """The names of the registered rewriters, in the order they run."""
    return tuple(_REWRITERS)


# --------------------------------------------------------------------------------------------------
# Built-in rewriters


def _rewrite_kv_heads(ctx: PlanContext) -> Rewrite | None:
    counts = head_counts(ctx.config)
    if counts is None or ctx.tp_size <= 1:
        return None
    heads, kv_heads = counts
    tp = ctx.tp_size
    plan = dict(ctx.plan)
    layout = kv_replication(heads, kv_heads, tp)
    replicated_kv: list[str] = []
    replicated_blocks: list[str] = []
    for prefix, rules in attention_blocks(plan).items():
        query_bad = rules.get(_QUERY) in _SHARDED_OUTPUT and heads % tp != 0
        kv_bad = any(rules.get(name) in _SHARDED_OUTPUT for name in (_KEY, _VALUE)) and kv_heads % tp != 0
        if not (query_bad or kv_bad):
            continue
        user_keeps_shards = any(
            ctx.is_user(f"{prefix}.{name}") and rules.get(name) in _SHARDED_OUTPUT | _SHARDED_INPUT
            for name in (_QUERY, _OUTPUT)
        )
        if (
            layout is not None
            and rules.get(_QUERY) in _SHARDED_OUTPUT
            and rules.get(_OUTPUT) in _SHARDED_INPUT
            and all(rules.get(name) in _SHARDED_OUTPUT for name in (_KEY, _VALUE))
        ):
            for name in (_KEY, _VALUE):
                plan[f"{prefix}.{name}"] = KV_REPLICATED_STYLE
            replicated_kv.append(prefix)
        elif not user_keeps_shards:
            for name in rules:
                plan[f"{prefix}.{name}"] = REPLICATE_STYLE
            replicated_blocks.append(prefix)
    if not replicated_kv and not replicated_blocks:
        return None
    heads_text = f"{kv_heads} key-value heads ({heads} query heads) cannot be split over tp_size={tp}"
    if replicated_kv:
        assert layout is not None
        what = (
            f"each KV head is replicated on {layout.replicas} ranks ({_QUERY} keeps {layout.query_heads_per_rank} "
            f"query heads per rank, {_KEY}/{_VALUE} -> {KV_REPLICATED_STYLE}, {_OUTPUT} and the MLP stay sharded) "
            f"in {', '.join(replicated_kv)}"
        )
    else:
        what = (
            f"the attention projections are replicated on every rank ({REPLICATE_STYLE}; the MLP stays sharded) "
            f"in {', '.join(replicated_blocks)}"
        )
    return Rewrite(plan, f"{heads_text}: {what}")


def _embedding_key(plan: Mapping[str, str]) -> str | None:
    keys = [key for key, style in plan.items() if style in ("embedding_rowwise", "embedding_colwise")]
    named = [key for key in keys if key.rpartition(".")[2] == "embed_tokens"]
    keys = named or keys
    return keys[0] if len(keys) == 1 else None


def _head_key(plan: Mapping[str, str]) -> str:
    heads = [key for key in plan if key.rpartition(".")[2] == "lm_head"]
    return heads[0] if len(heads) == 1 else "lm_head"


def _rewrite_tied_embeddings(ctx: PlanContext) -> Rewrite | None:
    if ctx.tp_size <= 1 or not _ties_embeddings(ctx.config):
        return None
    embedding = _embedding_key(ctx.plan)
    if embedding is None:
        return None
    head = _head_key(ctx.plan)
    embedding_style, head_style = ctx.plan[embedding], ctx.plan.get(head)
    if head_style is not None and head_style not in _HEAD_DIM:
        return None  # a style we do not know: leave it to its author
    embedding_dim = _EMBEDDING_DIM[embedding_style]
    head_dim = _HEAD_DIM.get(head_style) if head_style is not None else None
    if head_style is not None and embedding_dim == head_dim:
        return None
    plan = dict(ctx.plan)
    if not ctx.is_user(head):
        plan[head] = _HEAD_FOR_DIM[embedding_dim]
        changed, old, new, like = head, head_style, plan[head], f"{embedding} ({embedding_style})"
    elif not ctx.is_user(embedding):
        plan[embedding] = _EMBEDDING_FOR_DIM[head_dim]
        changed, old, new, like = embedding, embedding_style, plan[embedding], f"{head} ({head_style})"
    else:
        return None  # both are the user's: validate_plan explains the conflict
    return Rewrite(
        plan,
        f"input and output embeddings are tied (one weight): {changed} {old or 'unsharded'} -> {new} so it "
        f"shards that weight like {like}; they stay tied",
    )


register_rewriter("kv_heads", _rewrite_kv_heads)
register_rewriter("tied_embeddings", _rewrite_tied_embeddings)


# --------------------------------------------------------------------------------------------------
# The entry point and the check


def rewrite_plan(
    config: Any,
    plan: Mapping[str, str],
    tp_size: int,
    user_plan: Mapping[str, str] | None = None,
    *,
    model_name: str = "model",
) -> PlanRewrite:
    """Run every registered rewriter over ``plan`` (the user's entries always win), then validate.

    ``plan`` is the effective plan (the model's default merged with ``user_plan``); ``user_plan`` is
    what the user passed in ``DistributedConfig(tp_plan=...)``. Raises :class:`TPPlanError` when the
    final plan cannot work.
    """
    user = dict(user_plan or {})
    current = {**plan, **user}
    reasons: list[str] = []
    for name, rewriter in list(_REWRITERS.items()):
        ctx = PlanContext(config=config, plan=dict(current), tp_size=tp_size, user_plan=user, model_name=model_name)
        result = rewriter(ctx)
        if result is None:
            continue
        rewritten = {**result.plan, **user}
        if rewritten != current:
            current = rewritten
            reasons.append(f"{name}: {result.reason}")
    validate_plan(config, current, tp_size, model_name=model_name, user_plan=user)
    return PlanRewrite(current, tuple(reasons))


def _what_to_do(heads: int, kv_heads: int, tp_size: int, prefix: str, user: Mapping[str, str]) -> str:
    good = [n for n in range(2, heads + 1) if heads % n == 0 and (kv_heads % n == 0 or n % kv_heads == 0)]
    forced = sorted(key for key in user if key.startswith(prefix + "."))
    hints = []
    if forced:
        hints.append(f"drop your tp_plan entries {forced} to let transformers-tpu-ext rewrite the attention plan")
    replicated = {f"{prefix}.{name}": REPLICATE_STYLE for name in (_QUERY, _KEY, _VALUE, _OUTPUT)}
    hints.append(f"or replicate the attention with tp_plan={replicated}")
    if good:
        hints.append(f"or use a tp_size in {good}")
    return "; ".join(hints)


def validate_plan(
    config: Any,
    plan: Mapping[str, str],
    tp_size: int,
    *,
    model_name: str = "model",
    user_plan: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`TPPlanError` when ``plan`` cannot shard this model over ``tp_size`` ranks.

    Checks the attention blocks (query / key-value heads against ``tp_size``, a sharded ``q_proj``
    with its ``o_proj``) and tied embeddings (one weight sharded two ways). Rules it does not know
    are left alone.
    """
    if tp_size <= 1:
        return
    user = user_plan or {}
    problems: list[str] = []
    counts = head_counts(config)
    if counts is not None:
        heads, kv_heads = counts
        for prefix, rules in attention_blocks(plan).items():
            q, o = rules.get(_QUERY), rules.get(_OUTPUT)
            kv = {rules.get(_KEY), rules.get(_VALUE)} - {None}
            issue = None
            if q in _SHARDED_OUTPUT and heads % tp_size:
                issue = f"{_QUERY} is sharded by head but {heads} attention heads do not divide by tp_size={tp_size}"
            elif kv & _SHARDED_OUTPUT and kv_heads % tp_size:
                issue = (
                    f"{_KEY}/{_VALUE} are sharded by head but {kv_heads} key-value heads do not divide by "
                    f"tp_size={tp_size}"
                )
            elif KV_REPLICATED_STYLE in kv and (
                kv_replication(heads, kv_heads, tp_size) is None or q not in _SHARDED_OUTPUT or len(kv) != 1
            ):
                issue = (
                    f"{KV_REPLICATED_STYLE} needs tp_size to be a multiple of the {kv_heads} key-value heads, to "
                    f"divide the {heads} attention heads, and {_QUERY} sharded colwise"
                )
            elif q in _SHARDED_OUTPUT and _KEY in rules and not kv & (_SHARDED_OUTPUT | {KV_REPLICATED_STYLE}):
                issue = f"{_QUERY} is sharded by head while {_KEY}/{_VALUE} are not (query/key grouping breaks)"
            elif q is not None and o is not None and (q in _SHARDED_OUTPUT) != (o in _SHARDED_INPUT):
                issue = f"{_QUERY} ({q}) and {_OUTPUT} ({o}) disagree on whether the heads are sharded"
            if issue:
                problems.append(
                    f"{prefix}: {issue} (num_attention_heads={heads}, num_key_value_heads={kv_heads}). "
                    f"To fix: {_what_to_do(heads, kv_heads, tp_size, prefix, user)}."
                )
    if _ties_embeddings(config) and (embedding := _embedding_key(plan)) is not None:
        head = _head_key(plan)
        head_style = plan.get(head)
        if head_style in _HEAD_DIM and _EMBEDDING_DIM[plan[embedding]] != _HEAD_DIM[head_style]:
            problems.append(
                f"{embedding} ({plan[embedding]}) and {head} ({head_style}) are tied (one weight) but shard it "
                f"differently. To fix: give {head} {_HEAD_FOR_DIM[_EMBEDDING_DIM[plan[embedding]]]!r} (or "
                f"{embedding} {_EMBEDDING_FOR_DIM[_HEAD_DIM[head_style]]!r}), or drop one of your entries."
            )
    if problems:
        raise TPPlanError(
            f"{model_name}: this tensor-parallel plan cannot work with tp_size={tp_size}, so no weight was "
            f"loaded:\n  - " + "\n  - ".join(problems)
        )
