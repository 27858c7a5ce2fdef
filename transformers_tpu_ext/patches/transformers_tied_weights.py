"""Transformers: tied parameters stay tied when a model moves to the TPU.

torch_tpu unties tied parameters on a move (torch_tpu issue #4161): after ``model.to("tpu")``
(what ``pipeline(..., device="tpu")`` calls) or ``model.tpu()``, ``lm_head.weight`` and
``embed_tokens.weight`` of a tied model are two parameters, so the model holds the matrix twice and
an update of one no longer reaches the other. The wrappers on ``PreTrainedModel.to`` and
``PreTrainedModel.tpu`` (the outermost calls of a move, so whatever the backend does inside is done
by then) note which parameter names share one object before the move and, when the model has
parameters on the TPU afterwards, rebind every name of a split group to one parameter (as
Accelerate's ``retie_parameters`` does after dispatching). Off TPU they call the original and
nothing else.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import backend
from ._wrap import Wraps, fail_safe

NAME = "transformers_tied_weights"
TARGET = "transformers.modeling_utils"
DISTRIBUTION = "transformers"

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


def _move(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    if not backend.tpu_available():
        return wrapped(*args, **kwargs)
    groups = tied_groups(instance.named_parameters(remove_duplicate=False))
    result = wrapped(*args, **kwargs)
    if groups and any(backend.is_tpu(param) for param in instance.parameters()):
        retie(instance, groups)
    return result


_wrapper = fail_safe(_move)


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "PreTrainedModel.to", _wrapper)
    # ``Module.tpu()`` exists once torch_tpu (or the simulator) registered the device, which happens
    # at ``import torch`` through its entry point, before Transformers is imported.
    if hasattr(module.PreTrainedModel, "tpu"):
        _wraps.wrap(module, "PreTrainedModel.tpu", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
