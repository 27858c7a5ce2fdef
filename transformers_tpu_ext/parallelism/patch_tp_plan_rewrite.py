"""Rewrite tensor-parallel plans at load time (SPEC capability 4); the logic is in ``tp_plans``.

Transformers resolves a model's TP plan in ``DistributedMixin._resolve_parallel_plans`` (called by
``from_pretrained(..., distributed_config=...)`` after the model is built on the meta device and
before any weight is read). The wrapper here:

1. merges the model's default plan with the user's ``tp_plan`` (the user's entries win), runs
   :func:`transformers_tpu_ext.parallelism.tp_plans.rewrite_plan` on it, logs each rewrite once (rank 0), and
   raises :class:`~transformers_tpu_ext.parallelism.tp_plans.TPPlanError` for a plan that cannot work;
2. lets the upstream method resolve the rewritten plan (its own checks and ``*`` expansion run as is);
3. for KV-head replication, builds the ``(num_key_value_heads, replicas)`` view of the TP ranks the
   style below shards on, and sets each rewritten attention module's ``num_key_value_groups`` to its
   per-rank value.

The first time it acts, it also registers the TP style ``kv_replicated_colwise`` in Transformers'
``ParallelInterface`` (``ParallelInterface.register``, the documented way); ``revert()`` puts the
registry entry and the method back exactly.

When it acts is decided each time the method runs, by ``TRANSFORMERS_TPU_EXT_TP_REWRITE``
(:func:`transformers_tpu_ext.parallelism.tp_plans.rewrite_enabled`): ``auto`` (the default) only when a TPU is
present, so that without one the call is upstream's, byte for byte (no rewrite, no ``TPPlanError``,
no extra style); ``always`` on any device (the failures it fixes are the same on CPU/gloo and GPU,
so clusters there can opt in); ``never`` not at all. An invalid value raises ``ValueError``. Device
binding (one chip per rank seen as ``tpu:0``) and the ``tpu_dist`` backend are already handled by
Transformers 5.24 (``transformers.distributed.utils``), so nothing is added here.
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

from .. import backend
from . import tp_plans
from ..core.relies import Attribute, Signature
from ..core.wrapping import _MISSING, Wraps

NAME = "tp_plan_rewrite"
TARGET = "transformers.distributed.mixin"
DISTRIBUTION = "transformers"
_LAYER = "transformers.distributed.tensor_parallel:TensorParallelLayer"
RELIES_ON = (
    Signature("DistributedMixin._resolve_parallel_plans", positional=("distributed_config",)),
    # The style below subclasses TensorParallelLayer and overrides these (apply_tensor_parallelism calls them).
    Signature(f"{_LAYER}.shard_param", positional=("module", "param", "mesh")),
    Signature(f"{_LAYER}.install_forward", positional=("module", "mesh")),
    Signature(f"{_LAYER}.transform_inputs_pre_forward", positional=("module", "args", "kwargs", "mesh")),
    Signature(f"{_LAYER}.should_use_local_tensors", positional=("module",)),
    Signature("transformers.distributed.parallel_utils:ParallelInterface.register"),
    Attribute("transformers.distributed.parallel_utils:ParallelInterface._global_mapping"),
)

logger = logging.getLogger("transformers_tpu_ext")

_wraps = Wraps()
_style_saved: list[tuple[Any, Any]] = []  # (interface class, previous registry value)
_style_lock = threading.Lock()
_reported: set[str] = set()

# Attribute set on k_proj/v_proj modules: the 2-D mesh their KV-replicated weights live on.
_KV_MESH_ATTR = "_tpu_ext_kv_mesh"
_KV_MESH_DIMS = ("tp_kv", "tp_kv_replica")


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "DistributedMixin._resolve_parallel_plans", _resolve_parallel_plans)


def revert() -> None:
    _wraps.unwrap_all()
    with _style_lock:
        while _style_saved:
            interface, previous = _style_saved.pop()
            if previous is _MISSING:
                interface._global_mapping.pop(tp_plans.KV_REPLICATED_STYLE, None)
            else:
                interface._global_mapping[tp_plans.KV_REPLICATED_STYLE] = previous


def _register_style() -> None:
    """Register ``kv_replicated_colwise`` in ``ParallelInterface``, once, when the rewrite first acts."""
    with _style_lock:
        if _style_saved or not _wraps:
            return
        from transformers.distributed import parallel_utils

        interface = parallel_utils.ParallelInterface
        previous = interface._global_mapping.get(tp_plans.KV_REPLICATED_STYLE, _MISSING)
        interface.register(tp_plans.KV_REPLICATED_STYLE, _kv_replicated_style())
        _style_saved.append((interface, previous))


# --------------------------------------------------------------------------------------------------
# The wrapper


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _resolve_parallel_plans(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not tp_plans.rewrite_enabled(backend.tpu_available):  # ValueError for an invalid setting
        return wrapped(*args, **kwargs)
    distributed_config = args[0] if args else kwargs.get("distributed_config")
    try:
        _register_style()
        prepared = _prepare(instance, distributed_config)
    except tp_plans.TPPlanError:
        raise  # a plan that cannot work: the user must hear it, before any weight is loaded
    except Exception as error:  # noqa: BLE001 - a bug of ours falls back to the upstream behaviour
        key = f"{type(error).__name__}: {error}"
        if key not in _reported:
            _reported.add(key)
            logger.warning("transformers-tpu-ext: TP-plan rewriting failed (%s); using the plan as is", key)
        prepared = None
    if prepared is None:
        return wrapped(*args, **kwargs)
    rewritten_config, rewrite = prepared
    if args:
        args = (rewritten_config, *args[1:])
    else:
        kwargs = {**kwargs, "distributed_config": rewritten_config}
    result = wrapped(*args, **kwargs)
    _finish_kv_replication(instance, distributed_config, result[0])
    return result


def _prepare(model: Any, distributed_config: Any) -> tuple[Any, tp_plans.PlanRewrite] | None:
    """The config copy carrying the rewritten plan, or ``None`` when there is nothing to rewrite."""
    tp_size = getattr(distributed_config, "tp_size", 1) or 1
    override = getattr(distributed_config, "tp_plan", None)
    if tp_size <= 1 or (isinstance(override, dict) and not override):
        return None  # no TP, or an explicit empty plan ("apply no TP rule")
    user_plan = dict(override) if isinstance(override, dict) else {}
    model_plan = dict(model.tp_plan or {})
    effective = {**model_plan, **user_plan}
    if not effective:
        return None
    rewrite = tp_plans.rewrite_plan(
        model.config, effective, tp_size, user_plan, model_name=type(model).__name__
    )
    if not rewrite.changed:
        return None
    if _rank() == 0:
        for reason in rewrite.reasons:
            logger.warning("transformers-tpu-ext: %s TP plan rewritten, %s", type(model).__name__, reason)
    # Upstream merges `model._tp_plan | distributed_config.tp_plan`: hand it the whole rewritten plan as
    # the override (so its unknown-key check still sees the user's keys) and drop the default rules a
    # rewriter removed. The user's DistributedConfig is left untouched.
    model._tp_plan = {key: style for key, style in model_plan.items() if key in rewrite.plan}
    rewritten_config = copy.copy(distributed_config)
    rewritten_config.tp_plan = dict(rewrite.plan)
    return rewritten_config, rewrite


def _finish_kv_replication(model: Any, distributed_config: Any, tp_plan: dict[str, str]) -> None:
    """Give KV-replicated projections their mesh and their attention modules the per-rank grouping."""
    modules = [name for name, style in tp_plan.items() if style == tp_plans.KV_REPLICATED_STYLE]
    modules = [name for name in modules if _is_module(model, name)]
    if not modules:
        return
    heads, kv_heads = tp_plans.head_counts(model.config)  # the rewrite checked they are ints
    layout = tp_plans.kv_replication(heads, kv_heads, distributed_config.tp_size)
    mesh = _kv_mesh(model, distributed_config, layout)
    for name in modules:
        projection = model.get_submodule(name)
        setattr(projection, _KV_MESH_ATTR, mesh)
        parent = model.get_submodule(name.rpartition(".")[0])
        if hasattr(parent, "num_key_value_groups"):
            parent.num_key_value_groups = layout.key_value_groups_per_rank


def _is_module(model: Any, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def _kv_mesh(model: Any, distributed_config: Any, layout: tp_plans.KVReplication) -> Any:
    """The TP ranks seen as a ``(num_key_value_heads, replicas)`` mesh, row-major like Transformers' own."""
    from torch.distributed.device_mesh import init_device_mesh

    tp_mesh = model._mesh_manager.get_mesh("tp")
    shape = (
        distributed_config.pp_size,
        distributed_config.dp_replicate_size,
        distributed_config.fsdp_size,
        layout.num_key_value_heads,
        layout.replicas,
    )
    names = ("pp", "dp_replicate", "fsdp", *_KV_MESH_DIMS)
    full = init_device_mesh(tp_mesh.device_type, shape, mesh_dim_names=names)
    mesh = full[_KV_MESH_DIMS]
    if mesh.mesh.flatten().tolist() != tp_mesh.mesh.flatten().tolist():
        raise RuntimeError(
            f"transformers-tpu-ext: the KV-head mesh {mesh.mesh.tolist()} does not cover the TP ranks "
            f"{tp_mesh.mesh.tolist()}"
        )
    return mesh


# --------------------------------------------------------------------------------------------------
# The TP style


def _kv_replicated_style() -> Any:
    """Build the ``kv_replicated_colwise`` style (a class over Transformers' ``TensorParallelLayer``)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from transformers.distributed.tensor_parallel import TensorParallelLayer

    class KVReplicatedColwiseParallel(TensorParallelLayer):
        """Column-wise linear over KV heads replicated in groups of ranks.

        The weight (and bias) live on the ``(num_key_value_heads, replicas)`` view of the TP ranks with
        placements ``(Shard(0), Replicate())``: rank ``r`` holds KV head ``r // replicas``, the one its
        query heads use. The input is replicated; the output is this rank's KV head, kept local. For
        training, the input gradient is summed over the TP ranks (each covers its own query heads) and
        the weight gradient over the replicas of a head.
        """

        def should_use_local_tensors(self, module: Any) -> bool:
            return True

        # Transformers 5.25 passes ``config=`` and ``mesh_manager=`` to shard_param and install_forward (5.23-5.24
        # pass neither): whatever the installed release passes is taken, and handed on where upstream's is called.
        def shard_param(self, module: Any, param: str, mesh: Any, **upstream: Any) -> None:
            meta = module._parameters.get(param)
            if meta is None:
                return
            kv_mesh = getattr(module, _KV_MESH_ATTR)
            module._parameters[param] = torch.nn.Parameter(
                distribute_tensor(meta, kv_mesh, [Shard(0), Replicate()], src_data_rank=None),
                requires_grad=meta.requires_grad,
            )

        def transform_inputs_pre_forward(self, module: Any, args: tuple, kwargs: dict, mesh: Any) -> Any:
            x = args[0]
            if isinstance(x, DTensor):
                x = x.redistribute(placements=[Replicate()] * x.device_mesh.ndim).to_local()
            if torch.is_grad_enabled() and x.requires_grad:
                x = DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])
            return (x, *args[1:]), kwargs

        def install_forward(self, module: Any, mesh: Any, **upstream: Any) -> Any:
            module = super().install_forward(module, mesh, **upstream)
            forward = module.forward
            hooked: dict[str, Any] = {}

            def _sum_over_replicas(param: Any) -> None:
                grad = param.grad
                local = grad.to_local() if isinstance(grad, DTensor) else grad
                dist.all_reduce(local, group=getattr(module, _KV_MESH_ATTR).get_group(_KV_MESH_DIMS[1]))

            def kv_forward(*args: Any, **kwargs: Any) -> Any:
                if torch.is_grad_enabled():
                    # Parameters are replaced when the weights load: hook them at the first forward.
                    for name, param in module.named_parameters(recurse=False):
                        if param.requires_grad and hooked.get(name) is not param:
                            param.register_post_accumulate_grad_hook(_sum_over_replicas)
                            hooked[name] = param
                return forward(*args, **kwargs)

            module.forward = kv_forward
            return module

    return KVReplicatedColwiseParallel()
