"""Tensor-parallel serving on TPU: which sharded models the TPU serving path computes exactly (plain data, no torch).

A model loaded with ``DistributedConfig(tp_size=N)`` (or ``tp_plan="auto"`` under a launcher) runs one
continuous-batching manager per rank. Transformers makes them agree (Transformers 5.24,
``continuous_batching/distributed.py``): rank 0 of the tensor-parallel group drives, its new requests
and cancellations are broadcast to the other ranks before every step, so every rank schedules the same
requests in the same order; the paged cache of each rank holds the key-value heads its ``k_proj`` and
``v_proj`` shards produce (``num_key_value_heads // tp_size`` when the plan shards them), and the
row-wise ``o_proj`` sums the ranks' heads.

On the TPU path each rank's step is the one-chip step on its local heads: the paged attention (or
JAX's ragged kernel) over its own pages, its own query heads. That is exact when the plan shards the
attention by heads the way Transformers' default plans do (``q_proj``, ``k_proj``, ``v_proj``
column-wise, ``o_proj`` row-wise) and both head counts divide by ``tp_size``; :func:`tp_path` says so,
and anything else keeps Transformers' manager, unpatched, with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["HEAD_SHARDED", "REPLICATED_NORMS", "TPFacts", "attention_styles", "local_heads", "path_table", "tp_path"]

#: The attention rules of a head-sharded plan (Transformers' default ``base_model_tp_plan`` of Llama,
#: Qwen, Mistral, Gemma...): each rank computes whole heads, the output projection sums them.
HEAD_SHARDED: Mapping[str, str] = {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "o_proj": "rowwise"}
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
    sharded = {name: rules.get(name) for name in HEAD_SHARDED}
    if sharded != dict(HEAD_SHARDED):
        shown = ", ".join(f"{name} {style or 'not sharded'}" for name, style in sharded.items())
        return False, (
            f"the tp_plan's attention is not sharded by heads ({shown}; TPU serving takes q/k/v_proj colwise, "
            "o_proj rowwise)"
        )
    others = sorted(f"{name} {style}" for name, style in rules.items()
                    if name not in HEAD_SHARDED and style not in REPLICATED_NORMS.get(name, ()))
    if others:
        return False, f"the tp_plan shards more of the attention than its heads ({', '.join(others)})"
    if not facts.heads or facts.heads % tp:
        return False, f"{facts.heads} query heads do not divide over tp_size={tp}"
    if not facts.kv_heads or facts.kv_heads % tp:
        return False, f"{facts.kv_heads} key-value heads do not divide over tp_size={tp}"
    heads, kv_heads = local_heads(facts)
    return True, f"{heads} query and {kv_heads} key-value heads per chip, each rank's paged cache holds its own"


def local_heads(facts: TPFacts) -> tuple[int, int]:
    """``(query heads, key-value heads)`` one rank computes and caches (the whole model's without TP)."""
    tp = max(facts.tp_size, 1)
    return facts.heads // tp, facts.kv_heads // tp


# -------------------------------------------------------------------------------------------------
# docs/serving.md's table, computed from the predicate (scripts/gen_docs_tables.py writes it).

BEGIN = "<!-- generated: transformers_tpu_ext.serving.tensor_parallel.path_table() -->"
END = "<!-- end of generated table -->"

_DEFAULT = tuple(sorted({**HEAD_SHARDED, "q_norm": "replicated_with_grad_allreduce"}.items()))
_CASES: tuple[tuple[str, TPFacts], ...] = (
    ("Llama 3 8B (32 query, 8 key-value heads), Transformers' plan, `tp_size=4`", TPFacts(4, 32, 8, _DEFAULT)),
    ("Qwen3-0.6B (16 query, 8 key-value heads), `tp_size=8`", TPFacts(8, 16, 8, _DEFAULT)),
    (
        "GLM-4 shape (2 key-value heads), `tp_size=4`: key-value heads replicated by the plan rewrite",
        TPFacts(4, 8, 2, tuple(sorted({**HEAD_SHARDED, "k_proj": "kv_replicated_colwise", "v_proj": "kv_replicated_colwise"}.items()))),
    ),
    (
        "3 key-value heads, `tp_size=2`: attention replicated by the plan rewrite",
        TPFacts(2, 6, 3, tuple(sorted(dict.fromkeys(HEAD_SHARDED, "replicate").items()))),
    ),
    ("a user `tp_plan` that leaves the attention unsharded (MLP only)", TPFacts(2, 8, 4, ())),
)


def path_table() -> str:
    """The markdown table of :func:`tp_path` over typical sharded models (docs/serving.md)."""
    rows = ["| sharded model | continuous batching | why |", "|---|---|---|"]
    for label, facts in _CASES:
        taken, why = tp_path(facts)
        rows.append(f"| {label} | {'TPU serving, per chip' if taken else 'Transformers, unpatched'} | {why} |")
    return "\n".join(rows)
