"""Transformers: tied parameters stay tied when a model moves to or from the TPU.

torch_tpu unties tied parameters on a move (torch_tpu issue #4161). The cause is
``torch.nn.Module._apply``, which ``.to()``, ``.tpu()``, ``.cpu()`` and ``to_empty()`` all call:
for each module it converts the module's own parameters, and when the converted tensor is another
TensorImpl type (``torch._has_compatible_shallow_copy_type`` False, as for a PrivateUse1 backend)
it stores a new ``Parameter`` in that module. A parameter shared by two modules (``lm_head.weight``
and ``embed_tokens.weight``) becomes two: the model holds the matrix twice and an update of one no
longer reaches the other.

The wrapper sits on ``PreTrainedModel._apply`` (inherited from ``Module``, so every move of a
Transformers model goes through it, whatever method started it). The outermost call notes which
parameter names share one object, lets ``_apply`` run, and when a parameter was or is now on a TPU
rebinds every name of a split group to one parameter (as Accelerate's ``retie_parameters`` does
after dispatching). Nested ``_apply`` calls (the model's own submodels) pass through. Without a
TPU, it calls the original and nothing else.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .. import backend
from ..core.relies import Signature
from ..core.wrapping import Wraps, fail_safe

NAME = "transformers_tied_weights"
TARGET = "transformers.modeling_utils"
DISTRIBUTION = "transformers"
RELIES_ON = (
    Signature("PreTrainedModel._apply", positional=("fn",)),  # torch's Module._apply, which every move calls
    Signature("PreTrainedModel.named_parameters", ("remove_duplicate",)),
    Signature("PreTrainedModel.get_submodule", positional=("target",)),
)

_wraps = Wraps()


def tied_groups(named_parameters: Any) -> list[list[str]]:
    """Names that share one parameter object, for each object with several names."""
    by_id: dict[int, list[str]] = {}
    for name, param in named_parameters:
        by_id.setdefault(id(param), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def _owner(model: Any, name: str) -> tuple[Any, str]:
    module_path, _, attribute = name.rpartition(".")
    return (model.get_submodule(module_path) if module_path else model), attribute


def retie(model: Any, groups: list[list[str]]) -> int:
    """Rebind every name of each group to the group's first parameter; returns how many were rebound."""
    rebound = 0
    for names in groups:
        owner, attribute = _owner(model, names[0])
        keep = getattr(owner, attribute)
        for name in names[1:]:
            owner, attribute = _owner(model, name)
            if getattr(owner, attribute) is not keep:
                setattr(owner, attribute, keep)
                rebound += 1
    return rebound


class _Depth(threading.local):
    """How many wrapped ``_apply`` calls this thread is inside (``_apply`` recurses into submodels)."""

    value = 0


_depth = _Depth()


def _on_tpu(model: Any) -> bool:
    return any(backend.is_tpu(param) for param in model.parameters())


def _apply_and_retie(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    if _depth.value or not backend.tpu_available():  # a nested model, or no TPU: upstream only
        return wrapped(*args, **kwargs)
    groups = tied_groups(instance.named_parameters(remove_duplicate=False))
    was_on_tpu = bool(groups) and _on_tpu(instance)
    _depth.value += 1
    try:
        result = wrapped(*args, **kwargs)
    finally:
        _depth.value -= 1
    if groups and (was_on_tpu or _on_tpu(instance)):
        retie(instance, groups)
    return result


_wrapper = fail_safe(_apply_and_retie)


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "PreTrainedModel._apply", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
