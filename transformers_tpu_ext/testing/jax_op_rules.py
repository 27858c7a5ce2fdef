"""torch_tpu 0.2.0's registration rules of ``torch.tpu.pallas.jax_op`` (``_internal/pallas/pallas.py``:
``_verify_signature``, the schema from the annotations), written again for the simulator (:mod:`.pallas`).
``tests/simulator/test_jax_op_wheel.py`` runs them and the wheel's on the same functions."""

from __future__ import annotations

import collections.abc
import enum
import functools
import inspect
import types
import typing
from typing import Any, Callable, Union

import torch

__all__ = ["bound_names", "op_schema", "signature_of", "static_names", "torch_dtype", "verify_signature"]


def _jax() -> Any:
    try:
        import jax
    except ImportError as error:
        raise ImportError("JAX/Pallas is not available. Please install JAX to use this API.") from error
    return jax


def torch_dtype(dtype: Any) -> torch.dtype:
    import jax.numpy as jnp

    result = getattr(torch, jnp.dtype(dtype).name, None)
    if not isinstance(result, torch.dtype):
        raise NotImplementedError(f"Unsupported dtype for pallas kernels: {dtype}")
    return result




def _unwrap_annotated(typ: Any) -> Any:
    while typing.get_origin(typ) is typing.Annotated:
        typ = typing.get_args(typ)[0]
    return typ


def _strip_optional(typ: Any) -> tuple[Any, bool]:
    typ = _unwrap_annotated(typ)
    if typing.get_origin(typ) not in (Union, types.UnionType):
        return typ, False
    members = [_unwrap_annotated(t) for t in typing.get_args(typ)]
    concrete = [t for t in members if t is not types.NoneType]
    if not concrete:
        return types.NoneType, True
    if len(concrete) == 1:
        return concrete[0], types.NoneType in members
    return functools.reduce(lambda a, b: a | b, concrete), types.NoneType in members


def _sequence_element(typ: Any) -> Any:
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin in (list, collections.abc.Sequence):
        return args[0] if len(args) == 1 else None
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        return args[0] if all(a == args[0] for a in args) else None
    return None


def _int_like(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, int) and not issubclass(t, (bool, enum.Enum))


def _dtype_like(t: Any) -> bool:
    import numpy as np

    return t in (torch.dtype, np.dtype) or (isinstance(t, type) and issubclass(t, (np.dtype, np.generic)))


def _tensor_types() -> tuple:
    return (_jax().Array, torch.Tensor)


def _valid_base(annotation: Any) -> bool:
    import numpy as np

    jax = _jax()
    annotation = _unwrap_annotated(annotation)
    if annotation in (bool, float, int, str, jax.Array, jax.Device, np.dtype, torch.Tensor, torch.device,
                      torch.dtype, torch.types.Number):
        return True
    if isinstance(annotation, type) and issubclass(annotation, (np.dtype, np.generic, enum.Enum)):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return bool(args) and all(isinstance(a, (int, float, bool, str, enum.Enum)) for a in args)
    if origin in (Union, types.UnionType):
        return (
            set(args) <= {int, float, bool}
            or all(isinstance(t, type) and issubclass(t, str) for t in args)
            or all(_int_like(t) for t in args)
            or all(_dtype_like(t) for t in args)
            or all(t in (torch.device, jax.Device) for t in args)
        )
    return False


def _valid_element(elem: Any) -> bool:
    underlying, optional = _strip_optional(elem)
    if underlying in _tensor_types():
        return True
    if optional:
        return False
    if underlying in (int, float, bool) or underlying == torch.types.Number or _int_like(underlying):
        return True
    return typing.get_origin(underlying) in (Union, types.UnionType) and set(typing.get_args(underlying)) <= {int, float, bool}


def _valid_argument_type(annotation: Any) -> bool:
    underlying, _ = _strip_optional(annotation)
    if _valid_base(underlying):
        return True
    elem = _sequence_element(underlying)
    return elem is not None and _valid_element(elem)


def _valid_result(result: Any) -> bool:
    if result is None or result is types.NoneType:
        return True
    underlying, optional = _strip_optional(result)
    if optional:
        return _valid_result(underlying)
    origin, args = typing.get_origin(result), typing.get_args(result)
    if origin is None or origin in (Union, types.UnionType):
        if result in (*_tensor_types(), int, float, bool, torch.types.Number) or _int_like(result):
            return True
        return origin in (Union, types.UnionType) and set(args) <= {int, float, bool}
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _valid_result(args[0])
    if origin in (tuple, list, collections.abc.Sequence):
        return all(_valid_result(a) for a in args)
    return False


def _bound_names(fn: Any) -> set[str]:
    names, current = set(), fn
    while True:
        if isinstance(current, functools.partial):
            names.update(current.keywords or {})
            current = current.func
        elif hasattr(current, "__wrapped__"):
            current = current.__wrapped__
        else:
            return names


def _signature(fn: Any) -> inspect.Signature:
    return inspect.signature(inspect.unwrap(fn), eval_str=True)


def verify_signature(fn: Callable[..., Any]) -> None:
    """Raise ``ValueError`` where torch_tpu's ``jax_op`` refuses ``fn``'s signature (its ``_verify_signature``)."""
    signature, bound = _signature(fn), _bound_names(fn)
    for param in signature.parameters.values():
        if param.annotation is inspect.Parameter.empty:
            raise ValueError(f"Missing argument type annotation for JAX function: {signature}.")
    invalid = [i for i, p in enumerate(signature.parameters.values())
               if p.name not in bound and not _valid_argument_type(p.annotation)]
    result_valid = signature.return_annotation is None or _valid_result(signature.return_annotation)
    if not invalid and result_valid:
        return
    problems = [f"Arguments at indices {invalid} are invalid."] if invalid else []
    if not result_valid:
        problems.append("The return annotation is invalid.")
    raise ValueError(
        f"Invalid signature for JAX function: {signature}. {' '.join(problems)} Only jax.Arrays and POD types are supported."
    )


def _is_tensor(annotation: Any) -> bool:
    underlying, _ = _strip_optional(annotation)
    if underlying in _tensor_types():
        return True
    elem = _sequence_element(underlying)
    return elem is not None and _strip_optional(elem)[0] in _tensor_types()


def _torch_base(typ: Any) -> Any:
    if typ in _tensor_types():
        return torch.Tensor
    if _dtype_like(typ):
        return torch.dtype
    if typ in (torch.device, _jax().Device):
        return torch.device
    if isinstance(typ, type) and issubclass(typ, enum.Enum):
        for base in (str, int):
            if issubclass(typ, base) and not issubclass(typ, bool):
                return base
        values = [m.value for m in typ.__members__.values()]
        for kind in (str, int, float, bool):
            if values and all(isinstance(v, kind) and (kind is bool or not isinstance(v, bool)) for v in values):
                return kind
        return str
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is typing.Literal:
        return next((c for c in (bool, int, float, str) if all(isinstance(a, c) for a in args)), str)
    if origin in (Union, types.UnionType):
        if set(args) <= {int, float, bool}:
            return torch.types.Number
        if all(isinstance(t, type) and issubclass(t, str) for t in args):
            return str
        if all(_int_like(t) for t in args):
            return int
        if all(_dtype_like(t) for t in args):
            return torch.dtype
        if all(t in (torch.device, _jax().Device) for t in args):
            return torch.device
    return typ


def _torch_param(typ: Any) -> Any:
    underlying, optional = _strip_optional(typ)
    elem = _sequence_element(underlying)
    if elem is not None:
        mapped = _torch_param(elem)
        result = list[mapped] if typing.get_origin(underlying) is list else collections.abc.Sequence[mapped]
    else:
        result = _torch_base(underlying)
    return result | types.NoneType if optional else result


def _return_schema(typ: Any) -> str:
    if typ is None or typ is types.NoneType:
        return "()"
    if typ in _tensor_types():
        return "Tensor"
    underlying, optional = _strip_optional(typ)
    if optional:
        return f"{_return_schema(underlying)}?"
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is tuple:
        if not args:
            return "()"
        if len(args) == 2 and args[1] is Ellipsis:
            return f"{_return_schema(args[0])}[]"
        return "(" + ", ".join(_return_schema(a) for a in args) + ")"
    elem = _sequence_element(typ)
    if elem is not None:
        return f"{_return_schema(elem)}[]"
    if typ in (int, float, bool):
        return {int: "SymInt", float: "float", bool: "bool"}[typ]
    if _int_like(typ):
        return "SymInt"
    if typ == torch.types.Number or (origin in (Union, types.UnionType) and set(args) <= {int, float, bool}):
        return "Scalar"
    raise ValueError(f"Unsupported return type annotation: {typ}")


def _default(value: Any) -> Any:
    """A default as the op's schema keeps it (torch_tpu's ``_normalize_caller_arg``): enums by value, JAX and
    NumPy dtypes as torch dtypes, a JAX device as ``tpu``."""
    import numpy as np

    if value is None or isinstance(value, (torch.Tensor, int, float, bool, torch.dtype, torch.device, str)):
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_default(v) for v in value)
    if isinstance(value, enum.Enum):
        inner = value.value
        return str(inner) if isinstance(inner, str) else int(inner) if isinstance(inner, int) and not isinstance(inner, bool) else inner
    if value not in (int, float, bool, str, list, tuple, dict, set) and (
        isinstance(value, (np.dtype, np.generic)) or hasattr(value, "dtype")
        or (isinstance(value, type) and issubclass(value, (np.generic, np.dtype)))
    ):
        try:
            return torch_dtype(np.dtype(value))
        except (TypeError, ValueError, NotImplementedError):
            pass
    if isinstance(value, _jax().Device):
        return torch.device("tpu")
    return value


def op_schema(fn: Callable[..., Any]) -> str:
    """The ``torch.library`` schema torch_tpu's ``jax_op`` gives ``fn`` (after :func:`verify_signature`)."""
    signature, bound = _signature(fn), _bound_names(fn)
    positional, keyword = [], []
    for name, param in signature.parameters.items():
        if name in bound or not _valid_argument_type(param.annotation):
            continue
        annotation = _torch_param(param.annotation)
        if param.default is inspect.Parameter.empty:
            param = param.replace(annotation=annotation)
        else:
            default = _default(param.default)
            if not (default is None or isinstance(default, (int, float, bool, str, torch.device, torch.dtype))):
                default = None
                if not _strip_optional(annotation)[1]:
                    annotation = annotation | types.NoneType
            param = param.replace(annotation=annotation, default=default)
        (keyword if param.kind is inspect.Parameter.KEYWORD_ONLY else positional).append(param)

    def dummy(*args: Any, **kwargs: Any) -> None:
        del args, kwargs

    dummy.__signature__ = inspect.Signature(positional + keyword, return_annotation=torch.Tensor)  # type: ignore[attr-defined]
    params = torch.library.infer_schema(dummy, mutates_args=()).rsplit(" -> ", 1)[0]
    return f"{params} -> {_return_schema(signature.return_annotation)}"


def _static_names(signature: inspect.Signature) -> set[str]:
    return {name for name, p in signature.parameters.items() if not _is_tensor(p.annotation)}


bound_names = _bound_names
signature_of = _signature
static_names = _static_names
