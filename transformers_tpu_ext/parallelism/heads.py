"""Plain helpers over configs and tensor-parallel plans (pure: no torch, no Transformers).

Head counts read off a config, the attention blocks of a plan, and the KV-head replication layout
(:func:`kv_replication`) that the ``tp_plans`` rewriters and the ``tp_kv_cache`` patch share. Every
name here is also importable from :mod:`transformers_tpu_ext.parallelism.tp_plans`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["KV_REPLICATED_STYLE", "KVReplication", "attention_blocks", "head_counts", "kv_replication", "replicated_kv_heads_per_rank"]

#: The TP style the ``tp_plan_rewrite`` patch registers in Transformers' ``ParallelInterface``:
#: a column-wise linear whose output heads are sharded over ``num_key_value_heads`` groups of ranks
#: and replicated inside each group.
KV_REPLICATED_STYLE = "kv_replicated_colwise"

_QUERY, _KEY, _VALUE = "q_proj", "k_proj", "v_proj"


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    if callable(get):
        try:
            return get(decoder=True)
        except TypeError:
            return get()
    return config


def head_counts(config: Any) -> tuple[int, int] | None:
    """``(num_attention_heads, num_key_value_heads)`` of the (text) config; ``None`` if not plain ints."""
    text = _text_config(config)
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None)
    if kv_heads is None:
        kv_heads = heads
    if isinstance(heads, bool) or not isinstance(heads, int) or not isinstance(kv_heads, int):
        return None
    if heads <= 0 or kv_heads <= 0:
        return None
    return heads, kv_heads


def _ties_embeddings(config: Any) -> bool:
    for candidate in (config, _text_config(config)):
        value = getattr(candidate, "tie_word_embeddings", None)
        if value is not None:
            return bool(value)
    return False


def attention_blocks(plan: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Group the plan's attention rules by block: ``{"layers.*.self_attn": {"q_proj": "colwise", ...}}``.

    A block is a prefix holding a ``q_proj``, ``k_proj`` or ``v_proj`` rule; its dict holds every rule
    under that prefix, keyed by the rest of the name.
    """
    prefixes = {
        key.rpartition(".")[0] for key in plan if key.rpartition(".")[2] in (_QUERY, _KEY, _VALUE) and "." in key
    }
    blocks: dict[str, dict[str, str]] = {}
    for prefix in sorted(prefixes):
        blocks[prefix] = {
            key[len(prefix) + 1 :]: style for key, style in plan.items() if key.startswith(prefix + ".")
        }
    return blocks


@dataclass(frozen=True)
class KVReplication:
    """How ``tp_size`` ranks share ``num_key_value_heads`` replicated KV heads.

    Rank ``r`` holds query heads ``[r * query_heads_per_rank, (r + 1) * query_heads_per_rank)`` and
    KV head ``r // replicas`` (the one those query heads use); the ranks form a
    ``(num_key_value_heads, replicas)`` mesh, row-major.
    """

    num_heads: int
    num_key_value_heads: int
    tp_size: int

    @property
    def replicas(self) -> int:
        return self.tp_size // self.num_key_value_heads

    @property
    def query_heads_per_rank(self) -> int:
        return self.num_heads // self.tp_size

    @property
    def kv_heads_per_rank(self) -> int:
        return 1

    @property
    def key_value_groups_per_rank(self) -> int:
        """``num_key_value_groups`` of an attention module on one rank."""
        return self.query_heads_per_rank // self.kv_heads_per_rank

    def kv_head_of_rank(self, rank: int) -> int:
        return rank // self.replicas


def kv_replication(num_heads: int, num_key_value_heads: int, tp_size: int) -> KVReplication | None:
    """The KV-replication layout, or ``None`` when it does not apply (or is not needed)."""
    if tp_size <= 1 or num_key_value_heads % tp_size == 0:
        return None
    if tp_size % num_key_value_heads or num_heads % tp_size or num_heads % num_key_value_heads:
        return None
    return KVReplication(num_heads, num_key_value_heads, tp_size)


def replicated_kv_heads_per_rank(plan: Mapping[str, str], num_heads: int | list[int]) -> int | list[int] | None:
    """KV heads one rank holds when ``plan`` replicates KV heads (one per rank), else ``None``.

    Transformers sizes a static cache under TP with ``get_kv_heads_per_rank``, which knows the
    ``colwise`` style only; under :data:`KV_REPLICATED_STYLE` each rank holds exactly one KV head.
    """
    if not any(key.rsplit(".", 1)[-1] == _KEY and style == KV_REPLICATED_STYLE for key, style in plan.items()):
        return None
    return 1 if isinstance(num_heads, int) else [1] * len(num_heads)
