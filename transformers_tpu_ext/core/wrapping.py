"""Reversible wrapt wrapping shared by the patch modules."""

from __future__ import annotations

import copy
import functools
import logging
import sys
from typing import Any, Callable

import wrapt

logger = logging.getLogger("transformers_tpu_ext")

_MISSING = object()

Wrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]


class _BoundWrapper(wrapt.BoundFunctionWrapper):
    """A wrapped method bound to an instance copies and pickles as a bound method does: as the same method
    of the copied (or unpickled) instance. wrapt's proxies refuse both, and Transformers' and PEFT's objects
    keep bound methods of a model: ``PeftModelForCausalLM`` holds ``base_model.prepare_inputs_for_generation``,
    so ``copy.deepcopy(peft_model)`` (TRL's tests, users' reference models) failed with the plugin active."""

    def __reduce_ex__(self, protocol: int) -> Any:
        if self._self_instance is None:
            return super().__reduce_ex__(protocol)
        return getattr, (self._self_instance, self.__name__)

    def __reduce__(self) -> Any:
        return self.__reduce_ex__(2)

    def __copy__(self) -> Any:
        return self if self._self_instance is None else getattr(self._self_instance, self.__name__)

    def __deepcopy__(self, memo: dict) -> Any:
        if self._self_instance is None:
            return self
        return getattr(copy.deepcopy(self._self_instance, memo), self.__name__)


class _FunctionWrapper(wrapt.FunctionWrapper):
    __bound_function_wrapper__ = _BoundWrapper


class Wraps:
    """The wrappers one patch installed, so that ``revert`` restores the exact originals.

    ``wrap`` refuses to wrap twice (it checks ``__wrapped__`` chains for its own wrapper), and
    ``unwrap_all`` puts back the very object that was there before, in reverse order.
    """

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, dotted_name: str, wrapper: Wrapper) -> None:
        parent, attribute, original = wrapt.resolve_path(owner, dotted_name)
        if _wrapped_by(original, wrapper):
            return
        # On a class, remember what its own __dict__ held (nothing, if the method is inherited).
        before = vars(parent).get(attribute, _MISSING) if isinstance(parent, type) else original
        wrapt.wrap_object(parent, attribute, _FunctionWrapper, (wrapper,))
        self._saved.append((parent, attribute, before))

    def replace(self, parent: Any, attribute: str, value: Any) -> None:
        """Rebind a name (e.g. one a module imported ``from`` another) and remember the old one."""
        self._saved.append((parent, attribute, getattr(parent, attribute)))
        setattr(parent, attribute, value)

    def unwrap_all(self) -> None:
        while self._saved:
            parent, attribute, original = self._saved.pop()
            if original is _MISSING:
                delattr(parent, attribute)
            else:
                setattr(parent, attribute, original)

    def __bool__(self) -> bool:
        return bool(self._saved)


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time it is seen in this process."""
    if message not in _warned:
        _warned.add(message)
        logger.warning("transformers-tpu-ext: %s", message)


def _wrapped_by(obj: Any, wrapper: Wrapper) -> bool:
    while obj is not None:
        if getattr(obj, "_self_wrapper", None) is wrapper:
            return True
        obj = getattr(obj, "__wrapped__", None)
    return False


_USER_ERROR = "__transformers_tpu_ext_user_error__"


def user_error(error: BaseException) -> BaseException:
    """Mark ``error`` as one the user caused and must see (e.g. a missing package on TPU):
    :func:`fail_safe` lets it through instead of falling back to the upstream call."""
    setattr(error, _USER_ERROR, True)
    return error


def fail_safe(wrapper: Wrapper) -> Wrapper:
    """Make a wrapper's own failures harmless.

    If the wrapper raises before it called the upstream function, the error is logged once and the
    upstream function is called with the caller's original arguments: a bug of ours never breaks a
    user's ``generate()``. Errors raised by the upstream call itself, and errors marked with
    :func:`user_error`, propagate unchanged.
    """
    reported: set[str] = set()

    @functools.wraps(wrapper)
    def guarded(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        called = False

        def tracked(*a: Any, **k: Any) -> Any:
            nonlocal called
            called = True
            return wrapped(*a, **k)

        try:
            return wrapper(tracked, instance, args, kwargs)
        except Exception as error:
            if called or getattr(error, _USER_ERROR, False):
                raise
            key = f"{type(error).__name__}: {error}"
            if key not in reported:
                reported.add(key)
                logger.warning(
                    "transformers-tpu-ext: %s failed (%s); falling back to the unpatched call",
                    getattr(wrapper, "__qualname__", wrapper),
                    key,
                )
            return wrapped(*args, **kwargs)

    return guarded


def caller_module() -> str:
    """The ``__name__`` of the module that called the wrapped function: the first frame outside wrapt and
    this package (a wrapper runs under wrapt's proxy and :func:`fail_safe`)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name == "wrapt" or name.startswith(("wrapt.", __package__.rpartition(".")[0]))):
            return name
        frame = frame.f_back
    return ""
