"""Tensor-parallel serving on TPU: which sharded models the TPU serving path computes exactly (plain data, no torch).

A model loaded with ``DistributedConfig(tp_size=N)`` (or ``tp_plan="auto"`` under a launcher) runs one
continuous-batching manager per rank. Transformers makes them agree (Transformers 5.24,
``continuous_batching/distributed.py``): rank 0 of the tensor-parallel group drives, its new requests
and cancellations are broadcast to the other ranks before every step, so every rank schedules the same
requests in the same order; the paged cache of each rank holds the key-value heads its ``k_proj`` and
``v_proj`` shards produce (``num_key_value_heads // tp_size`` when the plan shards them), and the
row-wise ``o_proj`` sums the ranks' heads.

On the TPU path each rank's step is the one-chip step on its local heads: the paged attention (or
JAX's ragged kernel) over its own pages, its own query heads. That is exact for three layouts of the
attention (:func:`layout`), which :func:`tp_path` recognises; anything else keeps Transformers'
manager, unpatched, with its reason:

- ``"sharded"``: Transformers' default plans (``q_proj``, ``k_proj``, ``v_proj`` column-wise,
  ``o_proj`` row-wise), both head counts divisible by ``tp_size``;
- ``"kv_replicated"``: the ``tp_plan_rewrite`` patch's plan for fewer key-value heads than chips
  (GLM-4: 2 on 4 chips): each rank holds one key-value head and its share of query heads;
- ``"replicated"``: the whole attention on every rank (the rewrite for head counts that do not divide).

Transformers' own cache divides the key-value heads by ``tp_size`` whenever the plan names ``k_proj``
and ``v_proj`` (``DistributedHelper.are_kv_heads_tp_ed``): right for the first layout only, a
``ValueError`` or a wrong cache for the others. On the TPU path the cache is built with
:func:`kv_split` instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..parallelism.heads import KV_REPLICATED_STYLE, kv_replication

__all__ = [
    "HEAD_SHARDED",
    "KV_REPLICATED",
    "REPLICATED",
    "REPLICATED_NORMS",
    "TPFacts",
    "attention_styles",
    "kv_split",
    "layout",
    "local_heads",
    "path_table",
    "tp_path",
]

#: The attention rules of a head-sharded plan (Transformers' default ``base_model_tp_plan`` of Llama,
#: Qwen, Mistral, Gemma...): each rank computes whole heads, the output projection sums them.
HEAD_SHARDED: Mapping[str, str] = {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "o_proj": "rowwise"}
#: The ``tp_plan_rewrite`` patch's plan for fewer key-value heads than chips (``tp_size`` a multiple of
#: them): query heads sharded, each key-value head replicated on ``tp_size / num_key_value_heads`` ranks.
KV_REPLICATED: Mapping[str, str] = {**HEAD_SHARDED, "k_proj": KV_REPLICATED_STYLE, "v_proj": KV_REPLICATED_STYLE}
#: The rewrite for heads that do not divide (and a user's own): the whole attention on every rank.
REPLICATED: Mapping[str, str] = dict.fromkeys(HEAD_SHARDED, "replicate")
#: Other attention rules a head-sharded plan may hold: per-head norms (Qwen3, Gemma 3), whole on every rank.
REPLICATED_NORMS: Mapping[str, frozenset[str]] = dict.fromkeys(
    ("q_norm", "k_norm"), frozenset({"replicate", "replicated_with_grad_allreduce"})
)


@dataclass(frozen=True)
class TPFacts:
    """What the manager's ``__init__`` wrapper reads off a model for tensor parallelism (plain data)."""

    tp_size: int = 1  # the size of the model's tensor-parallel mesh (1: no tensor parallelism)
    heads: int = 0  # num_attention_heads of the text config
    kv_heads: int = 0  # num_key_value_heads (heads when the config has none)
    #: the plan's rules for the self-attention block, ``(projection, style)`` sorted (see :func:`attention_styles`)
    attention: tuple[tuple[str, str], ...] = ()


def attention_styles(plan: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The rules of ``plan`` for the decoder layers' self-attention (``*layers.*.self_attn.<name>``), as
    :attr:`TPFacts.attention`; with two such blocks (another prefix) their rules must agree, else the
    result holds both, which :func:`tp_path` refuses."""
    rules: set[tuple[str, str]] = set()
    for key, style in plan.items():
        prefix, _, name = key.rpartition(".")
        if prefix.endswith("layers.*.self_attn"):
            rules.add((name, str(style)))
    return tuple(sorted(rules))


def tp_path(facts: TPFacts) -> tuple[bool, str]:
    """``(True, why)`` if each rank's TPU serving step on its local heads computes what Transformers'
    sharded model computes; else ``(False, why not)``: the manager runs unpatched."""
    tp = facts.tp_size
    if tp <= 1:
        return True, "no tensor parallelism"
    rules = dict(facts.attention)
    if len(rules) != len(facts.attention):
        return False, "the tp_plan gives the attention projections of different layers different styles"
    projections = {name: rules.get(name) for name in HEAD_SHARDED}
    shape = layout(facts)
    if shape is None:
        shown = ", ".join(f"{name} {style or 'not sharded'}" for name, style in projections.items())
        return False, (
            f"the tp_plan's attention is neither sharded by heads nor one of the plan rewrites ({shown}; TPU "
            "serving takes q/k/v_proj colwise or k/v_proj kv_replicated_colwise with o_proj rowwise, or all replicate)"
        )
    others = sorted(f"{name} {style}" for name, style in rules.items()
                    if name not in HEAD_SHARDED and style not in REPLICATED_NORMS.get(name, ()))
    if others:
        return False, f"the tp_plan shards more of the attention than its heads ({', '.join(others)})"
    if not facts.heads or not facts.kv_heads or facts.heads % facts.kv_heads:
        return False, f"{facts.heads} query heads for {facts.kv_heads} key-value heads"
    if shape == "sharded" and facts.heads % tp:
        return False, f"{facts.heads} query heads do not divide over tp_size={tp}"
    if shape == "sharded" and facts.kv_heads % tp:
        return False, f"{facts.kv_heads} key-value heads do not divide over tp_size={tp}"
    if shape == "kv_replicated" and kv_replication(facts.heads, facts.kv_heads, tp) is None:
        return False, f"{facts.kv_heads} key-value heads cannot be replicated over tp_size={tp} ({facts.heads} query heads)"
    heads, kv_heads = local_heads(facts)
    how = {"sharded": "", "kv_replicated": " (each key-value head replicated on "
           f"{tp // max(facts.kv_heads, 1)} chips)", "replicated": " (the whole attention on every chip)"}[shape]
    return True, f"{heads} query and {kv_heads} key-value heads per chip{how}, each rank's paged cache holds its own"


def layout(facts: TPFacts) -> str | None:
    """How the plan lays the attention over the ranks: ``"sharded"`` (by heads), ``"kv_replicated"``,
    ``"replicated"``, or ``None`` (another plan)."""
    projections = {name: dict(facts.attention).get(name) for name in HEAD_SHARDED}
    for name, plan in (("sharded", HEAD_SHARDED), ("kv_replicated", KV_REPLICATED), ("replicated", REPLICATED)):
        if projections == dict(plan):
            return name
    return None


def local_heads(facts: TPFacts) -> tuple[int, int]:
    """``(query heads, key-value heads)`` one rank computes and caches (the whole model's without TP or
    with the attention replicated)."""
    tp, shape = max(facts.tp_size, 1), layout(facts)
    if tp == 1 or shape == "replicated":
        return facts.heads, facts.kv_heads
    if shape == "kv_replicated":
        return facts.heads // tp, 1
    return facts.heads // tp, facts.kv_heads // tp


def kv_split(facts: TPFacts) -> int:
    """What the paged cache divides the model's key-value heads by to hold one rank's (Transformers
    divides by ``tp_size`` whenever the plan names ``k_proj`` and ``v_proj``; right for ``"sharded"`` only)."""
    kv_heads = local_heads(facts)[1]
    return facts.kv_heads // kv_heads if kv_heads else 1


# -------------------------------------------------------------------------------------------------
# docs/serving.md's table, computed from the predicate (scripts/gen_docs_tables.py writes it).

BEGIN = "<!-- generated: transformers_tpu_ext.serving.tensor_parallel.path_table() -->"
END = "<!-- end of generated table -->"

_DEFAULT = tuple(sorted({**HEAD_SHARDED, "q_norm": "replicated_with_grad_allreduce"}.items()))
_CASES: tuple[tuple[str, TPFacts], ...] = (
    ("Llama 3 8B (32 query, 8 key-value heads), Transformers' plan, `tp_size=4`", TPFacts(4, 32, 8, _DEFAULT)),
    ("Qwen3-0.6B (16 query, 8 key-value heads), `tp_size=8`", TPFacts(8, 16, 8, _DEFAULT)),
    (
        "GLM-4 shape (8 query, 2 key-value heads), `tp_size=4`: key-value heads replicated by the plan rewrite",
        TPFacts(4, 8, 2, tuple(sorted(KV_REPLICATED.items()))),
    ),
    (
        "6 query, 3 key-value heads, `tp_size=2`: attention replicated by the plan rewrite",
        TPFacts(2, 6, 3, tuple(sorted(REPLICATED.items()))),
    ),
    ("a user plan sharding the query heads only (`k_proj`/`v_proj` replicated)",
     TPFacts(2, 8, 4, tuple(sorted({**HEAD_SHARDED, "k_proj": "replicate", "v_proj": "replicate"}.items())))),
    ("a user `tp_plan` that leaves the attention unsharded (MLP only)", TPFacts(2, 8, 4, ())),
    ("a `tp_plan` sharding attention sinks (gpt-oss)", TPFacts(2, 8, 4, tuple(sorted({**HEAD_SHARDED, "sinks": "local_rowwise"}.items())))),
)


def path_table() -> str:
    """The markdown table of :func:`tp_path` over typical sharded models (docs/serving.md)."""
    rows = ["| sharded model | continuous batching | why |", "|---|---|---|"]
    for label, facts in _CASES:
        taken, why = tp_path(facts)
        rows.append(f"| {label} | {'TPU serving, per chip' if taken else 'Transformers, unpatched'} | {why} |")
    return "\n".join(rows)
