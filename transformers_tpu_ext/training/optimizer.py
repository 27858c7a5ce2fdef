"""The optimizer step on TPU, as :func:`transformers_tpu_ext.training.policy.optimizer_plan` decides.

``accelerator.prepare(optimizer)`` (and so the Trainer) calls :func:`adapt_step` on the user's
optimizer. It replaces nothing the user or Transformers can see: ``param_groups`` keep a float
``lr`` and the user's ``capturable`` and ``foreach``, ``state_dict()`` is the one a CPU run writes
(with device moments, as on a GPU). Only during ``step()`` does a group the plan adapts hold a
device tensor learning rate (one per group, filled from the float when it changed: a
host-to-device copy, no program keyed by the value) and the plan's settings; they are put back
when the step returns. The plan is evaluated at every step from the group as it is then, so a
``load_state_dict`` (resuming a CPU checkpoint), ``add_param_group`` or a changed setting is
picked up at the next step.

With the ``tpu`` dynamo backend, the step is compiled once for the run when every adapted group
allows it (``compile_step``): it sees the same tensor and the same settings at every call.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Mapping
from typing import Any

from . import policy as training_policy

__all__ = ["adapt_step", "plans"]

logger = logging.getLogger("transformers_tpu_ext")

#: Set on an optimizer whose step :func:`adapt_step` wrapped (once per optimizer).
ADAPTED = "_tpu_ext_adapted_step"


def _kind(optimizer: Any) -> str:
    cls = type(optimizer)
    return f"{cls.__module__}.{cls.__qualname__}"


def _on_device(group: Mapping[str, Any]) -> bool:
    from .. import backend

    return all(
        backend.is_tpu(p.device) and p.is_floating_point() and p.layout == _strided() for p in group["params"]
    )


def _strided() -> Any:
    import torch

    return torch.strided


def plans(optimizer: Any, sharded: bool = False) -> list[training_policy.OptimizerPlan]:
    """The plan of each param group of ``optimizer`` as it is now."""
    kind = _kind(optimizer)
    return [
        training_policy.optimizer_plan(kind, group, sharded=sharded, on_device=_on_device(group))
        for group in optimizer.param_groups
    ]


def adapt_step(optimizer: Any, *, sharded: bool = False, compile_backend: str | None = None) -> list[training_policy.OptimizerPlan]:
    """Run ``optimizer``'s step on TPU as its plans say (installed once); returns the current plans.

    ``sharded``: the parameters are DTensors (FSDP2, tensor parallelism). ``compile_backend``: the
    dynamo backend to compile the step with (``"tpu"``), or ``None``.
    """
    import torch

    current = plans(optimizer, sharded)
    if getattr(optimizer, ADAPTED, False):
        return current
    eager = optimizer.step
    compiled = None
    if compile_backend:
        compiled = torch.compile(eager, backend=compile_backend, dynamic=False)
    shadows: dict[int, list[Any]] = {}  # group index -> [device tensor, the float it holds]

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        restore: list[tuple[dict[str, Any], dict[str, Any]]] = []
        compile_ok = compiled is not None
        try:
            for index, (group, plan) in enumerate(zip(self.param_groups, plans(self, sharded))):
                if plan.action != training_policy.ADAPT or not group["params"]:
                    compile_ok = compile_ok and not group["params"]
                    continue
                compile_ok = compile_ok and plan.compile_step
                saved = {key: group[key] for key in ("lr", *plan.settings) if key in group}
                restore.append((group, saved))
                if plan.tensor_lr:
                    group["lr"] = _device_lr(shadows, index, float(group["lr"]), group["params"][0].device)
                group.update(plan.settings)
                if plan.settings.get("capturable"):
                    _steps_to_device(self, group)
            run = compiled if compile_ok and restore else eager
            return run(*args, **kwargs)
        finally:
            for group, saved in restore:
                group.update(saved)

    if getattr(eager, "_wrapped_by_lr_sched", False):  # a schedule made before prepare() already counts steps
        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = types.MethodType(step, optimizer)
    setattr(optimizer, ADAPTED, True)
    return current


def _device_lr(shadows: dict[int, list[Any]], index: int, value: float, device: Any) -> Any:
    import torch

    entry = shadows.get(index)
    if entry is None or entry[0].device != device:
        entry = shadows[index] = [torch.tensor(value, dtype=torch.float32, device=device), value]
    elif entry[1] != value:
        entry[0].copy_(torch.tensor(value, dtype=torch.float32))  # a host-to-device copy: no program keyed by the value
        entry[1] = value
    return entry[0]


def _steps_to_device(optimizer: Any, group: Mapping[str, Any]) -> None:
    """A state loaded from a CPU checkpoint keeps Adam's step count on the host: a capturable step needs it on the chip."""
    import torch

    for param in group["params"]:
        state = optimizer.state.get(param)
        step = state.get("step") if state else None
        if isinstance(step, torch.Tensor) and step.device != param.device:
            state["step"] = step.to(param.device)
