"""What a patch relies on in its target, checked before the patch is applied.

A version range says which releases pip may install; it cannot say that Transformers 5.26 renamed a
parameter our wrapper reads, or turned a default on. Each patch module therefore declares, next to
``TARGET``, the facts of its target it relies on::

    RELIES_ON = (
        Signature("PreTrainedModel.set_use_kernels", ("use_kernels", "kernel_config", "mode")),
        Signature("transformers.modeling_utils:PreTrainedModel.from_pretrained", ("pretrained_model_name_or_path",)),
        Attribute("PreTrainedModel.kernels_mode"),
    )

A path is relative to the imported ``TARGET`` module, or absolute as ``"module:Qualified.name"`` (that
module is imported if it is not yet). Activation calls
:func:`check` before ``apply``: the first expectation that does not hold is the reason the patch stands
aside (one warning naming the installed release; ``transformers-tpu doctor`` lists it under "Known
problems"), and the others keep working. An expectation is plain data; :func:`check` only reads the target
(``getattr``, ``inspect.signature``), never calls it.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Union

__all__ = ["Attribute", "Default", "Expectation", "Signature", "check", "resolve"]

_MISSING = object()


@dataclass(frozen=True)
class Attribute:
    """``path`` exists (a class, function, constant or property)."""

    path: str

    def problem(self, value: Any, method: bool = False) -> str | None:
        return None


@dataclass(frozen=True)
class Signature:
    """``path`` is a callable whose parameters include ``params`` (by name; ``positional``: the first ones in
    this order, for a wrapper that reads ``args[i]``), and that accepts nothing else required."""

    path: str
    params: tuple[str, ...] = ()
    positional: tuple[str, ...] = ()

    def problem(self, value: Any, method: bool = False) -> str | None:
        if not callable(value) and not isinstance(value, (classmethod, staticmethod)):
            return f"{self.path} is no longer callable"
        parameters = _parameters(value, method)
        if parameters is None:
            return None  # a builtin without a signature: nothing more to read
        names = [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in parameters)
        missing = [name for name in self.params if name not in names and not takes_kwargs]
        if missing:
            return f"{self.path} no longer takes {', '.join(missing)} (it takes {', '.join(names) or 'nothing'})"
        positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if self.positional and positional[: len(self.positional)] != list(self.positional):
            return (
                f"{self.path}'s leading parameters are {', '.join(positional[: len(self.positional)])}, "
                f"not {', '.join(self.positional)}"
            )
        return None


@dataclass(frozen=True)
class Default:
    """The parameter ``param`` of the callable ``path`` defaults to ``value`` (a default a patch changes, or
    whose meaning its wrapper reads)."""

    path: str
    param: str
    value: Any

    def problem(self, value: Any, method: bool = False) -> str | None:
        parameters = _parameters(value, method)
        found = {p.name: p for p in parameters or ()}
        if self.param not in found:
            return f"{self.path} no longer takes {self.param}"
        default = found[self.param].default
        if default is inspect.Parameter.empty or default != self.value:
            shown = "no default" if default is inspect.Parameter.empty else f"default {default!r}"
            return f"{self.path}'s {self.param} now has {shown} (the patch relies on {self.value!r})"
        return None


Expectation = Union[Attribute, Signature, Default]


def _parameters(value: Any, method: bool) -> list[inspect.Parameter] | None:
    """The parameters a caller passes: without ``self``/``cls`` for a method read off its class."""
    function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    if method and not isinstance(value, staticmethod) and parameters:
        parameters = parameters[1:]
    return parameters


def resolve(target: ModuleType, path: str) -> tuple[Any, bool]:
    """The object ``path`` names (relative to ``target``, or ``"module:qualname"``; ``_MISSING`` if absent),
    and whether it is a method read off its class.

    A class attribute is read from the class ``__dict__`` along the MRO, so a classmethod or property is
    seen as declared (a property as its getter), not bound."""
    if ":" in path:
        module_name, _, qualname = path.partition(":")
        owner: Any = sys.modules.get(module_name)
        if owner is None:
            owner = importlib.import_module(module_name)
    else:
        owner, qualname = target, path
    value: Any = owner
    method = False
    for part in qualname.split("."):
        if isinstance(value, type):
            for klass in value.__mro__:
                if part in vars(klass):
                    value = vars(klass)[part]
                    break
            else:
                return _MISSING, False
            method = not isinstance(value, type)
            if isinstance(value, property):
                value = value.fget
        else:
            value = getattr(value, part, _MISSING)
            method = False
            if value is _MISSING:
                return _MISSING, False
    return value, method


def check(target: ModuleType, expectations: tuple[Expectation, ...]) -> str | None:
    """``None`` when every expectation holds in ``target``, else what changed (the first mismatch)."""
    for expectation in expectations:
        try:
            value, method = resolve(target, expectation.path)
        except ImportError as error:
            return f"{expectation.path.partition(':')[0]} cannot be imported ({error})"
        if value is _MISSING:
            return f"{expectation.path} no longer exists"
        problem = expectation.problem(value, method)
        if problem:
            return problem
    return None
