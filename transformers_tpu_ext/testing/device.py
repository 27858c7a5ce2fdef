"""The simulated ``tpu`` device: PyTorch's PrivateUse1 backend, its data kept in CPU tensors.

A tensor on the simulated TPU is a :class:`TpuTensor`, a wrapper subclass whose device is
``tpu:0`` and which holds a plain CPU tensor (``_cpu``). Every operation on it reaches
:meth:`TpuTensor.__torch_dispatch__`, which runs the operation on the CPU tensors and wraps the
result again (in-place and ``out=`` operations return the original wrapper). Factory operations
(``torch.empty(..., device="tpu")``) reach the PrivateUse1 dispatch key, where a Python fallback
builds the CPU tensor and wraps it.

The dispatcher also keeps the counters: distinct eager ``(op, shapes, dtypes)`` signatures
(torch_tpu compiles each eager operation once per input shape) and host↔device bytes. Nothing is
counted while a graph compiled by the ``"tpu"`` backend runs, nor while TorchDynamo traces.

Importing this module imports torch; it registers nothing until :func:`transformers_tpu_ext.testing.factories.register`
is called. Its pieces: :mod:`.device_state` (the dispatcher's process-wide state), :mod:`.op_facts` (per-operator
facts), :mod:`.device_storage` (device memory as torch_tpu shows it), :mod:`.factories` (the PrivateUse1 fallback).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from . import generators as _generators
from . import inference_views, report
from .compile_cache import CACHE as _COMPILE_CACHE
from .device_state import _CPU, DEVICE_MISMATCH, STATE, _fake_mode_active  # noqa: F401 - device.STATE, device._fake_mode_active
from .device_storage import _device_storage, _host_storage, _written  # noqa: F401 - device._device_storage
from .op_facts import _INFO, _SPECIAL, _info, _OpInfo  # noqa: F401 - device._SPECIAL, device._INFO

_aten = torch.ops.aten

__all__ = ["TpuTensor", "STATE"]

# ---------------------------------------------------------------------------------------------
# The wrapper tensor.


class TpuTensor(torch.Tensor):
    """A tensor on the simulated ``tpu:0``; its data is the CPU tensor ``_cpu``."""

    _cpu: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor | None = None, requires_grad: bool = True) -> Any:
        # A parameter on the TPU is a TpuTensor, so ``type(param)(value, requires_grad=...)``
        # (Accelerate's set_module_tensor_to_device, Transformers' loaders) must build a
        # parameter from ``value`` wherever it lives, as ``nn.Parameter`` does.
        return torch.nn.Parameter(data, requires_grad)

    @classmethod
    def _wrap_cpu(cls, cpu: torch.Tensor) -> TpuTensor:
        """The TPU tensor whose data is the CPU tensor ``cpu`` (no copy)."""
        self = torch.Tensor._make_wrapper_subclass(
            cls,
            cpu.size(),
            strides=cpu.stride(),
            storage_offset=cpu.storage_offset(),
            dtype=cpu.dtype,
            layout=cpu.layout,
            device=STATE.device,
            requires_grad=False,
        )
        self._cpu = cpu
        return self

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # noqa: D105
        inner = self._cpu
        if _fake_mode_active() or type(inner) is not torch.Tensor:
            return f"TpuTensor(shape={tuple(self.shape)}, dtype={self.dtype}, device='{self.device}')"
        body = repr(inner.detach())
        if body.endswith(")"):
            body = body[:-1] + f", device='{self.device}')"
        return body

    # What code outside torch sees of device memory is what torch_tpu shows (internals Q1): a real
    # storage on ``tpu`` whose data pointer is an opaque handle (a DeviceBufferRef* there), the same
    # for every tensor that shares the memory, and new after every in-place write. Nothing can be
    # read through it; torch's own paths (``storage.cpu()``, ``torch.save``) go through the
    # simulator's ``set_``/``copy_``. PyTorch's own machinery (deepcopy, TorchDynamo's
    # fakeification) keeps seeing the wrapper's own, empty storage; FSDP2 gets the data's storage,
    # which it resizes.
    def untyped_storage(self) -> Any:
        if _user_caller(self):
            return _device_storage(self._cpu.untyped_storage())
        if _fsdp_caller(self):
            return self._cpu.untyped_storage()
        return torch.Tensor.untyped_storage(self)

    def storage(self) -> Any:  # the legacy TypedStorage: the same handle as untyped_storage()
        if _user_caller(self):
            torch.storage._warn_typed_storage_removal(stacklevel=2)
            storage = _device_storage(self._cpu.untyped_storage())
            return torch.TypedStorage(wrap_storage=storage, dtype=self.dtype, _internal=True)
        return torch.Tensor.storage(self)

    def data_ptr(self) -> int:
        if _user_caller(self):
            inner = self._cpu
            return _device_storage(inner.untyped_storage()).data_ptr() + inner.storage_offset() * inner.element_size()
        return torch.Tensor.data_ptr(self)

    def tolist(self) -> Any:  # a device tensor's tolist() copies to the host
        return self.cpu().tolist()

    def numpy(self, *, force: bool = False) -> Any:
        if not force:
            raise TypeError(
                "can't convert tpu:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
                "tensor to host memory first."
            )
        return self.cpu().numpy()

    def __reduce_ex__(self, proto: int) -> Any:
        """Pickle (``torch.save``) as torch pickles a tensor with a device storage, which is what a
        torch_tpu tensor is: ``_rebuild_tensor_v2`` of its storage (location ``tpu:0``), whose bytes
        ``torch.save`` reads with ``storage.cpu()``. (The wrapper's own storage is empty, so
        torch's ``Tensor.__reduce_ex__`` cannot be used as is.)"""
        from collections import OrderedDict

        inner = self._cpu
        storage = _device_storage(inner.untyped_storage())
        args_tail = (inner.storage_offset(), tuple(inner.size()), inner.stride(), self.requires_grad, OrderedDict())
        if self.dtype in torch.storage._new_dtypes():
            return (torch._utils._rebuild_tensor_v3, (storage, *args_tail, self.dtype))
        typed = torch.storage.TypedStorage(wrap_storage=storage, dtype=self.dtype, _internal=True)
        return (torch._utils._rebuild_tensor_v2, (typed, *args_tail))

    # TorchDynamo / AOTAutograd see through the wrapper.
    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_cpu"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], ctx: Any, outer_size: Any, outer_stride: Any) -> TpuTensor:
        return TpuTensor._wrap_cpu(inner["_cpu"])

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return _dispatch(func, args, kwargs or {})


def _user_caller(t: TpuTensor) -> bool:
    if type(t._cpu) is not torch.Tensor or _get_mode(_FAKE) is not None:
        return False
    caller = sys._getframe(2).f_globals.get("__name__", "")
    return caller != "torch" and not caller.startswith("torch.")


#: Modules that free and re-allocate device memory through ``untyped_storage().resize_()``.
_STORAGE_RESIZERS = ("torch.distributed.fsdp.",)


def _fsdp_caller(t: TpuTensor) -> bool:
    """FSDP2 frees its all-gather buffers with ``untyped_storage().resize_(0)`` and re-allocates them
    the same way: it gets the data's storage, which can be resized (the wrapper's own is empty)."""
    if type(t._cpu) is not torch.Tensor or _get_mode(_FAKE) is not None:
        return False
    return sys._getframe(2).f_globals.get("__name__", "").startswith(_STORAGE_RESIZERS)


# ---------------------------------------------------------------------------------------------
# Device memory as torch_tpu shows it: storages whose data pointer is an opaque handle.

def _mark_written(info: _OpInfo, args: tuple, kwargs: dict) -> None:
    for index, name in info.written:
        value = args[index] if index < len(args) else kwargs.get(name)
        if isinstance(value, TpuTensor):
            _written(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, TpuTensor):
                    _written(item)
                elif isinstance(item, (list, tuple)):
                    for x in item:
                        if isinstance(x, TpuTensor):
                            _written(x)


def _is_tpu_wrapper(x: Any) -> bool:
    return x.__class__ is TpuTensor or isinstance(x, TpuTensor)


def _wrap(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        if isinstance(out, TpuTensor) or out.is_meta:  # ``empty_like(t, device="meta")`` stays on meta
            return out
        return TpuTensor._wrap_cpu(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap(o) for o in out)
    return out


def _host_view(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor on ``tpu`` (a FakeTensor made by a factory during tracing) seen as CPU."""
    mode = getattr(t, "fake_mode", None)
    if mode is not None:
        from torch._subclasses.fake_tensor import FakeTensor

        return FakeTensor(mode, t.to("meta"), _CPU)
    raise RuntimeError(f"simulated TPU: cannot use {type(t).__name__} on {t.device} here")


_get_mode = torch._C._get_dispatch_mode
_FAKE = torch._C._TorchDispatchModeKey.FAKE
_RESTRIDE_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
_PLAIN = frozenset({int, float, bool, type(None), str, torch.dtype, torch.layout, torch.memory_format})
#: Python scalars an eager program is keyed by (torch_tpu: "a compiled program is keyed by shapes, dtypes and
#: Python scalar values"): ``t + 1`` and ``t + 2`` are two programs.
_SCALARS = frozenset({int, float, bool})


def _scalar_key(value: Any) -> Any:
    """A Python number as a program key: its type too (``1``, ``1.0`` and ``True`` promote differently), and
    one key for NaN (which equals nothing, itself included)."""
    return (value.__class__, "nan" if value != value else value)


def _dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    info = _INFO.get(func)
    if info is None:
        info = _info(func)
    if info.special is not None:
        return info.special(args, kwargs)
    if info.refused is not None:
        raise RuntimeError(info.refused)
    tracing = _get_mode(_FAKE) is not None
    sig: list[Any] | None = [func] if (info.counted and not tracing and not STATE.in_graph) else None
    back: dict[int, Any] | None = {} if info.mutable else None
    given_kwargs = kwargs

    new_args = []
    for a in args:
        cls = a.__class__
        if cls is TpuTensor:  # _unwrap's first branch, inlined: this loop runs for every op
            inner = a._cpu
            if back is not None:
                back[id(inner)] = a
            if sig is not None:
                sig.append(inner.shape)
                sig.append(inner.dtype)
            new_args.append(inner)
        elif cls in _PLAIN:
            if sig is not None and cls in _SCALARS:
                sig.append(_scalar_key(a))  # torch_tpu keys a program by its Python scalars too
            new_args.append(a)
        else:
            if sig is not None and cls in (list, tuple) and all(x.__class__ in _SCALARS for x in a):
                sig.append(tuple(_scalar_key(x) for x in a))  # sizes, dims, repeats: a new value is a new program
            new_args.append(_unwrap(a, func, info, sig, back))
    if kwargs:
        kwargs = {k: (v if v.__class__ in _PLAIN else _unwrap(v, func, info, sig, back)) for k, v in kwargs.items()}
        if sig is not None:
            for k, v in kwargs.items():
                if v.__class__ in _SCALARS:
                    sig.append((k, _scalar_key(v)))
                elif v.__class__ in (list, tuple) and all(x.__class__ in _SCALARS for x in v):
                    sig.append((k, tuple(_scalar_key(x) for x in v)))
    if info.generator:
        kwargs = _generators.resolve(kwargs, STATE.generator, tracing)

    out = func(*new_args, **kwargs)
    if info.written and STATE.handles_issued:
        _mark_written(info, args, given_kwargs)

    if sig is not None:
        STATE.eager_ops += 1
        key = tuple(sig)
        if key not in STATE.seen:
            if _COMPILE_CACHE.miss("eager", key):  # False: loaded from the persistent compile cache
                STATE.eager_programs += 1
                report.compiled()
            STATE.seen.add(key)
        else:
            _COMPILE_CACHE.hits += 1
    if back is not None:
        return _map_back(out, back)
    if torch.is_inference_mode_enabled() and func.is_view:
        return inference_views.wrap_view(out, _wrap)
    if out.__class__ is torch.Tensor and not out.is_meta:
        return TpuTensor._wrap_cpu(out)
    return _wrap(out)


def _run_generic(func: Any, args: tuple, kwargs: dict) -> Any:
    """:func:`_dispatch` without ``func``'s special handler: for handlers that wrap the generic path
    (``random_ops``)."""
    info = _info(func)
    special, info.special = info.special, None
    try:
        return _dispatch(func, args, kwargs)
    finally:
        info.special = special


def _unwrap(a: Any, func: Any, info: _OpInfo, sig: list[Any] | None, back: dict[int, Any] | None, listed: bool = False) -> Any:
    if isinstance(a, torch.Tensor):
        if isinstance(a, TpuTensor):
            inner = a._cpu
            if back is not None:
                back[id(inner)] = a
            if sig is not None:
                sig.append(inner.shape)
                sig.append(inner.dtype)
            return inner
        dev = a.device.type
        if dev == "cpu":
            if info.mixed_ok or (info.host.indices and listed) or (info.host.scalars and not a.dim()):
                return a
            raise RuntimeError(f"{func}: {DEVICE_MISMATCH}")
        if dev == "tpu":  # a FakeTensor a factory made on "tpu" while TorchDynamo traces
            host = _host_view(a)
            if back is not None:
                back[id(host)] = a
            return host
        return a
    if isinstance(a, (list, tuple)) and any(isinstance(x, (torch.Tensor, list)) for x in a):
        # Tensor[] and Tensor[][] (the output lists of c10d's allgather_ / gather_)
        return type(a)(x if x is None else _unwrap(x, func, info, sig, back, True) for x in a)
    if isinstance(a, torch.device) and a.type == "tpu":
        return _CPU
    return a


def _local_scalar_dense(args: tuple, kwargs: dict) -> Any:
    inner = args[0]._cpu
    if type(inner) is torch.Tensor:
        STATE.d2h_bytes += inner.element_size()
    return _aten._local_scalar_dense.default(inner)


def _map_back(out: Any, back: dict[int, Any]) -> Any:
    if isinstance(out, torch.Tensor):
        orig = back.get(id(out))
        if orig is not None:
            if orig.shape != out.shape or orig.stride() != out.stride():
                # A metadata-mutating op (``unsqueeze_``, ``t_``) restrides the wrapper in place;
                # growth (``resize_``, an ``out=`` tensor too small) cannot be reflected.
                try:
                    _aten.as_strided_.default.redispatch(
                        _RESTRIDE_KEYS, orig, out.shape, out.stride(), out.storage_offset()
                    )
                    return orig
                except RuntimeError:
                    pass
                raise RuntimeError(
                    f"simulated TPU: the tpu tensor given to a mutating or out= operation changed "
                    f"shape {tuple(orig.shape)} -> {tuple(out.shape)}, which the simulator cannot "
                    f"reflect; allocate the output with its final shape"
                )
            return orig
        return _wrap(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_map_back(o, back) for o in out)
    return out


def _copy_(args: tuple, kwargs: dict) -> Any:
    dst, src = args[0], args[1]
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    dst_tpu, src_tpu = _is_tpu_wrapper(dst), _is_tpu_wrapper(src)
    d = dst._cpu if dst_tpu else dst
    s = src._cpu if src_tpu else src
    if not dst_tpu and d.device.type == "tpu":
        d = _host_view(d)
    if not src_tpu and s.device.type == "tpu":
        s = _host_view(s)
    if not _fake_mode_active() and type(d) is torch.Tensor and type(s) is torch.Tensor:
        if dst_tpu and not src_tpu:
            STATE.h2d_bytes += d.numel() * d.element_size()
        elif src_tpu and not dst_tpu:
            STATE.d2h_bytes += d.numel() * d.element_size()
    d.copy_(s, non_blocking)
    if dst_tpu and STATE.handles_issued:
        _written(dst)
    return dst


def _to_copy(args: tuple, kwargs: dict) -> Any:
    src = args[0]
    device = kwargs.get("device")
    target = "tpu" if device is None else torch.device(device).type
    target_tpu = target == "tpu"
    from_tpu = _is_tpu_wrapper(src)
    inner = src._cpu if from_tpu else src
    if inner.device.type == "tpu":
        inner = _host_view(inner)
    new_kwargs = dict(kwargs)
    if target not in ("tpu", "cpu"):
        # ``.to("meta")`` (Accelerate's offload hooks, ``init_empty_weights``) gives a meta tensor
        # and copies nothing, as on a real device.
        return _aten._to_copy.default(inner, **new_kwargs)
    new_kwargs["device"] = _CPU
    out = _aten._to_copy.default(inner, **new_kwargs)
    if target_tpu:
        if not from_tpu and not _fake_mode_active() and type(out) is torch.Tensor:
            STATE.h2d_bytes += out.numel() * out.element_size()
        return TpuTensor._wrap_cpu(out)
    if not _fake_mode_active() and type(out) is torch.Tensor:
        STATE.d2h_bytes += out.numel() * out.element_size()
    return out


def _set_storage(func: Any) -> Any:
    """``set_`` of a tpu tensor onto a device storage (torch_tpu registers ``set_.source_Storage``):
    how torch's own storage paths reach device memory. ``storage.cpu()`` (behind ``torch.save``) is
    ``empty(0, device=tpu).set_(storage)`` then a copy; ``torch.load`` rebuilds each tensor with
    ``empty(0, device=tpu).set_(storage, offset, size, stride)``."""

    def handler(args: tuple, kwargs: dict) -> Any:
        self = args[0]
        source = args[1] if len(args) > 1 else kwargs.get("source")
        host = _host_storage(source)
        if host is None or not _is_tpu_wrapper(self):
            return _run_generic(func, args, kwargs)
        dtype = self.dtype
        if len(args) > 2 or "storage_offset" in kwargs:
            offset = args[2] if len(args) > 2 else kwargs["storage_offset"]
            size = args[3] if len(args) > 3 else kwargs["size"]
            stride = args[4] if len(args) > 4 else kwargs.get("stride", ())
        else:
            offset, size, stride = 0, (host.nbytes() // dtype.itemsize,), ()
        inner = torch.empty(0, dtype=dtype)
        inner = inner.set_(host, offset, size, stride) if stride else inner.set_(host, offset, size)
        # The wrapper takes the new shape on an empty storage large enough for it.
        shell = torch.Tensor._make_wrapper_subclass(TpuTensor, (host.nbytes(),), dtype=torch.uint8, device=STATE.device)
        _aten.set_.source_Storage_storage_offset.redispatch(
            _META_KEYS, self, torch.Tensor.untyped_storage(shell), inner.storage_offset(), inner.size(), inner.stride()
        )
        self._cpu = inner
        return self

    return handler


_META_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


_SPECIAL.update(
    {
        _aten.copy_.default: _copy_,
        _aten._to_copy.default: _to_copy,
        _aten._local_scalar_dense.default: _local_scalar_dense,
        _aten.set_.source_Storage: _set_storage(_aten.set_.source_Storage),
        _aten.set_.source_Storage_storage_offset: _set_storage(_aten.set_.source_Storage_storage_offset),
    }
)
