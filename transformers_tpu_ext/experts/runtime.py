"""The experts of a mixture-of-experts layer on TPU through JAX's megablox grouped matmul (``experts.kernel``).

:func:`dispatching_experts` is what the patch registers as Transformers' ``"grouped_mm"`` experts
implementation: per call, the kernel path where ``experts.policy.experts_path`` allows it, Transformers' own
``grouped_mm`` everywhere else (off TPU, float16, no JAX). :func:`gmm_experts_forward` computes what
Transformers' ``grouped_mm_experts_forward`` computes, with static shapes and no host synchronisation:

1. the ``tokens x top_k`` (token, expert) pairs sorted by expert (stable); routes to experts this rank does not
   hold (expert parallelism: ids past ``num_experts``) sorted last and counted in no group;
2. the rows per expert (``scatter_add`` of ones, int32): the kernel's ``group_sizes``;
3. the sorted rows padded to the kernel's row tile (``policy.padded_rows``; padding rows belong to no expert);
4. up projection (``gate_up_proj`` or ``up_proj``, either weight layout) through the kernel, the bias of each
   row's expert, the module's own gate (``_apply_gate``) or activation, down projection, its bias, the module's
   post-expert norm;
5. rows the kernel computed nothing for (padding, other ranks' routes) set to zero, each row weighted by its
   routing weight, put back in (token, top-k) order and summed over the top-k, in float32 as upstream sums.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from . import policy

logger = logging.getLogger("transformers_tpu_ext")

__all__ = ["dispatching_experts", "experts_facts", "gmm_experts_forward"]


@functools.cache
def dispatching_experts(original: Any) -> Any:
    """The ``grouped_mm`` experts implementation: the kernel path on TPU (:func:`gmm_experts_forward`), else
    ``original`` (Transformers' ``grouped_mm_experts_forward``) with the same arguments."""

    def experts_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or _path(self, hidden_states) != "gmm":
            return original(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs)
        return gmm_experts_forward(self, hidden_states, top_k_index, top_k_weights)

    global _environment_fn, _register_fn
    if _environment_fn is environment:  # made here, outside any trace
        import torch._dynamo

        _environment_fn = torch._dynamo.assume_constant_result(environment)
        _register_fn = torch._dynamo.assume_constant_result(_register_kernel)
    experts_forward.__name__ = experts_forward.__qualname__ = "tpu_gmm_or_grouped_mm_experts_forward"
    experts_forward.__wrapped__ = original
    return experts_forward


def _path(module: Any, hidden_states: Any) -> str:
    """The call's path (:func:`policy.experts_path`); traceable: the installed JAX and torch-tpu are read once,
    outside any trace, and are constants inside one."""
    import torch

    from ..backend import is_tpu

    if not is_tpu(hidden_states.device):  # off TPU: nothing read (torch_tpu may register its device later)
        return "upstream"
    path, why = policy.experts_path(experts_facts(module, hidden_states, *_environment_constant()))
    if not torch.compiler.is_compiling():
        _say(path, why)
    return path


_said: set[str] = set()


def _say(path: str, why: str) -> None:
    message = f"transformers-tpu-ext: mixture-of-experts layers on TPU: {path}: {why}"
    if message not in _said and why != "not on a TPU":
        _said.add(message)
        logger.info(message)


_environment: list[tuple[str | None, bool, bool]] = []


def environment() -> tuple[str | None, bool, bool]:
    """``(JAX version or None, the kernel's module is there, torch.tpu.pallas.jax_op exists)``, read at the first
    experts call on a TPU (torch_tpu is loaded by then)."""
    if not _environment:
        _environment.append(_read_environment())
    return _environment[0]


def _read_environment() -> tuple[str | None, bool, bool]:
    import importlib.util

    import torch

    jax_version, kernel = None, False
    if importlib.util.find_spec("jax") is not None:
        from importlib import metadata

        jax_version = metadata.version("jax")
        try:
            kernel = importlib.util.find_spec(policy.KERNEL) is not None
        except ImportError:
            kernel = False
    pallas = getattr(getattr(torch, "tpu", None), "pallas", None)
    return jax_version, kernel, callable(getattr(pallas, "jax_op", None))


def _register_kernel() -> bool:
    from . import kernel

    return kernel.register()


# environment() and the kernel's registration as TorchDynamo runs them (in Python, their result a constant:
# never part of a graph); made by dispatching_experts, outside any trace.
_environment_fn: Any = environment
_register_fn: Any = _register_kernel


def _environment_constant() -> tuple[str | None, bool, bool]:
    return _environment_fn()


def experts_facts(
    module: Any, hidden_states: Any, jax_version: str | None = None, kernel: bool = False, jax_op: bool = False
) -> policy.ExpertsFacts:
    """The facts :func:`policy.experts_path` decides on, read off an experts module and its input (and
    :func:`environment`)."""
    from ..backend import is_tpu

    return policy.ExpertsFacts(
        tpu=is_tpu(hidden_states.device),
        dtype=str(_weights(module)[0].dtype).removeprefix("torch."),
        has_gate=bool(module.has_gate),
        gate_layout="concatenated" if getattr(module, "is_concatenated", True) else "interleaved",
        has_bias=bool(module.has_bias),
        transposed=bool(module.is_transposed),
        expert_parallel=bool(getattr(module, "_is_expert_parallel", False)),
        distributed_weights=_is_dtensor(_weights(module)[0]),
        jax=jax_version,
        kernel=kernel,
        jax_op=jax_op,
    )


def model_facts(model: Any) -> policy.ExpertsFacts | None:
    """The facts of ``model``'s first experts module (Transformers' experts interface), on the model's device; or
    ``None`` if it has none."""
    from ..backend import is_tpu

    for module in model.modules():
        if hasattr(module, "has_gate") and hasattr(module, "is_transposed") and hasattr(module, "down_proj"):
            environment_facts = environment() if is_tpu(model.device) else (None, False, False)
            return experts_facts(module, next(module.parameters()), *environment_facts)
    return None


def _is_dtensor(tensor: Any) -> bool:
    import torch.distributed

    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def _weights(module: Any) -> tuple[Any, Any, Any, Any]:
    """``(up, down, up_bias, down_bias)``: the gate-and-up (or up) projection, the down projection, their biases."""
    up = module.gate_up_proj if module.has_gate else module.up_proj
    up_bias = (module.gate_up_proj_bias if module.has_gate else module.up_proj_bias) if module.has_bias else None
    return up, module.down_proj, up_bias, module.down_proj_bias if module.has_bias else None


def gmm_experts_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """Transformers' ``grouped_mm_experts_forward``, through the kernel (see the module's docstring)."""
    import torch

    from . import kernel

    _register_fn()  # the ops exist before a trace reads them
    up, down, up_bias, down_bias = _weights(self)
    tokens, top_k = top_k_index.shape
    num_experts, pairs = self.num_experts, tokens * top_k
    expert_ids = top_k_index.reshape(-1)
    owned = expert_ids < num_experts  # expert parallelism: routes to other ranks' experts are not this rank's
    sort_key = torch.where(owned, expert_ids, num_experts)
    sorted_ids, order = torch.sort(sort_key, stable=True)
    counts = torch.zeros(num_experts + 1, dtype=torch.int32, device=hidden_states.device)
    group_sizes = counts.scatter_add(0, sorted_ids, torch.ones_like(sorted_ids, dtype=torch.int32))[:num_experts]
    computed = (sorted_ids < num_experts).unsqueeze(-1)  # rows the kernel computes
    experts_of_rows = sorted_ids.clamp(max=num_experts - 1)

    rows = policy.padded_rows(pairs)
    lhs = hidden_states[order // top_k].to(up.dtype).masked_fill(~computed, 0)  # no gradient into other ranks' routes

    def grouped(x: Any, weight: Any) -> Any:  # [pairs, k] x expert weights -> [pairs, n], rows in expert order
        padded = torch.nn.functional.pad(x, (0, 0, 0, rows - pairs))
        op = kernel.op("gmm" if self.is_transposed else "gmm_t")  # weights [experts, k, n] or [experts, n, k]
        return op(padded.contiguous(), weight, group_sizes)[:pairs].masked_fill(~computed, 0)

    out = grouped(lhs, up)
    if up_bias is not None:
        out = out + up_bias[experts_of_rows]
    out = self._apply_gate(out) if self.has_gate else self.act_fn(out)
    out = grouped(out.to(down.dtype), down)
    if down_bias is not None:
        out = out + down_bias[experts_of_rows]
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    weighted = out.masked_fill(~computed, 0) * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    unsorted = torch.empty_like(weighted).index_copy(0, order, weighted)  # back to (token, top-k) order
    return unsorted.view(tokens, top_k, -1).sum(dim=1).to(hidden_states.dtype)
