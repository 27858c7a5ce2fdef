"""Size a static KV cache right under KV-head replication (the ``tp_plan_rewrite`` patch's plans).

``generate()`` with a static cache under tensor parallelism asks
``transformers.generation.utils.get_kv_heads_per_rank`` (bound there by name from
``transformers.distributed.tensor_parallel``) how many KV heads a rank holds. It knows the
``colwise`` style only, so with ``k_proj: kv_replicated_colwise`` it answers "all of them" and the
cache update fails (``index_copy_(): Source/destination tensor must have same slice shapes``). On TPU
the static cache is the default, so this is the path a plain ``generate()`` takes. The wrapper
answers one head per rank for such plans (:func:`transformers_tpu_ext.parallelism.tp_plans.replicated_kv_heads_per_rank`)
and defers to upstream for every other plan.

Like ``tp_plan_rewrite``, it acts only where that patch does (``TRANSFORMERS_TPU_EXT_TP_REWRITE``,
decided each time the function runs): by default only when a TPU is present; with ``always`` on any
device; with ``never`` not at all. Otherwise the call is upstream's.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import backend
from . import tp_plans
from ..core.relies import Signature
from ..core.wrapping import Wraps, fail_safe

NAME = "tp_kv_cache"
TARGET = "transformers.generation.utils"
DISTRIBUTION = "transformers"
RELIES_ON = (
    # Bound here from transformers.distributed.tensor_parallel; the wrapper reads args[0], args[1] (or by name).
    Signature("get_kv_heads_per_rank", ("tp_plan", "num_heads"), positional=("tp_plan", "num_heads")),
)

_wraps = Wraps()


def _kv_heads_per_rank(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    plan = args[0] if args else kwargs.get("tp_plan")
    num_heads = args[1] if len(args) > 1 else kwargs.get("num_heads")
    per_rank = tp_plans.replicated_kv_heads_per_rank(plan or {}, num_heads)
    return wrapped(*args, **kwargs) if per_rank is None else per_rank


_guarded = fail_safe(_kv_heads_per_rank)


def _wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    if not tp_plans.rewrite_enabled(backend.tpu_available):  # ValueError for an invalid setting
        return wrapped(*args, **kwargs)
    return _guarded(wrapped, instance, args, kwargs)


def apply(module: Any) -> None:
    _wraps.wrap(module, "get_kv_heads_per_rank", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
