"""Count-shaped tensors of a library trainer's step, kept on the host (runtime).

A TPU compiles a program per input shape. A few lines of TRL's losses and metrics make tensors whose
length is a *count* in the data, not a shape of the batch: ``x[completion_mask.bool()].sum()`` (DPO's and
KTO's ``logits/*``, DPO's ``loss_type="sft"``), ``torch.nonzero(labels)`` and ``index_select`` by it (KTO
splits its rows into chosen and rejected), ``eos_idx[is_eos.any(1)] = ...`` and ``lengths[~is_truncated]``
(GRPO's completions). Every operation on such a tensor compiles again for each count not seen before:
tiny programs, but a run that pads every batch to a bucket still never reaches a steady state.

:class:`HostCounts` (a ``TorchFunctionMode``, active while a known library trainer's step runs on the TPU)
runs them on the host instead, where a new length costs nothing:

- a **selection** (a boolean index, ``nonzero``, ``masked_select``, ``argwhere``, one-argument ``where``) of
  a device tensor, written in the library's own code (the caller's file is in its package: the model's
  forward and everything else is left alone), is computed on a host copy (a transfer, no program);
- an operation on such a host tensor runs on the host too, device tensors among its arguments copied
  there; a result with no dimension (a sum, a mean, a count) goes back to the device, where what follows
  (``gather_for_metrics``, ``.item()``, the loss's backward) has the shapes of every step; ``.to(device)``
  moves a host tensor as asked;
- ``device_tensor[host_index] = host_values`` is done on a host copy written back (a transfer);
- an empty tensor the library sends to the device (a count of zero: KTO's batch without a chosen row)
  stays on the host.

The values are the CPU's (a CPU run computes them the same way), gradients included: ``.cpu()`` and
``.to(device)`` are differentiable, so a loss term computed on the host (KTO's, DPO's ``sft``) sends its
gradient back to the device as a transfer. Nothing happens while TorchDynamo traces (a compiled model's
forward runs as compiled).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["HostCounts", "host_counts"]

#: Marks a tensor this mode made on the host: the device its values stand for.
_DEVICE = "_tpu_ext_host_count_of"


#: The operations whose result has a length counted in the data.
_SELECTIONS = frozenset({
    torch.Tensor.__getitem__, torch.nonzero, torch.Tensor.nonzero, torch.masked_select, torch.Tensor.masked_select,
    torch.argwhere, torch.Tensor.argwhere, torch.where,
})
#: Moves the caller asks for: a host tensor goes where it is sent.
_MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda})
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def host_counts(package: str) -> Any:
    """A :class:`HostCounts` mode for selections written in ``package`` (e.g. ``"trl"``), or ``None`` if it is
    not imported."""
    module = sys.modules.get(package)
    path = getattr(module, "__file__", None)
    if not path:
        return None
    return HostCounts((os.path.dirname(os.path.abspath(path)) + os.sep,))


class HostCounts(TorchFunctionMode):
    """See the module's docstring. ``dirs``: the directories whose code's selections go to the host."""

    def __init__(self, dirs: Iterable[str]) -> None:
        super().__init__()
        self.dirs = tuple(dirs)
        self.made = 0  # host tensors made: until then every other operation passes straight through

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            return func(*args, **kwargs)
        if func in _SELECTIONS and self._selects(func, args, kwargs) and self._from_library(sys._getframe(1)):
            return self._on_host(func, args, kwargs, _device(args))
        if func in _MOVES and _empty_to_device(args, kwargs) is not None and self._from_library(sys._getframe(1)):
            return self._mark(args[0], _empty_to_device(args, kwargs))  # a count of zero stays on the host
        if self.made:
            device = _host_device(args, kwargs)
            if device is not None:
                return self._with_host(func, args, kwargs, device)
        return func(*args, **kwargs)

    # -- which calls ---------------------------------------------------------------------------------

    def _selects(self, func: Any, args: tuple, kwargs: dict) -> bool:
        tensor = args[0] if args else None
        if not isinstance(tensor, torch.Tensor) or tensor.device.type == "cpu":
            return False
        if func is torch.Tensor.__getitem__:
            index = args[1] if len(args) > 1 else None
            parts = index if isinstance(index, tuple) else (index,)
            if not any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
                return False
        elif func is torch.where and (len(args) + len(kwargs)) != 1:
            return False  # where(cond, a, b) keeps its shape
        return True

    def _from_library(self, frame: Any) -> bool:
        """Whether the code that called (the first frame outside torch) is the library's."""
        while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
            frame = frame.f_back
        return frame is not None and frame.f_code.co_filename.startswith(self.dirs)

    # -- on the host ---------------------------------------------------------------------------------

    def _on_host(self, func: Any, args: tuple, kwargs: dict, device: Any) -> Any:
        out = func(*_to_host(args), **_to_host(kwargs))
        return self._mark(out, device)

    def _with_host(self, func: Any, args: tuple, kwargs: dict, device: Any) -> Any:
        if func in _MOVES:
            return func(*args, **kwargs)  # moved where the caller asks
        if func is torch.Tensor.__setitem__ and _is_device(args[0]):
            target = args[0]
            if target.requires_grad:
                return func(target, *_to_device(args[1:], device), **kwargs)  # upstream's, a program per count
            host = target.detach().cpu()
            host.__setitem__(*_to_host(args[1:]))
            with torch.no_grad():
                target.copy_(host)
            return None
        out = func(*_to_host(args), **_to_host(kwargs))
        return self._mark(out, device)

    def _mark(self, out: Any, device: Any) -> Any:
        if isinstance(out, torch.Tensor):
            if out.dim() == 0:
                return out.to(device)  # a sum, a mean, a count: back where the step continues
            setattr(out, _DEVICE, device)
            self.made += 1
            return out
        if isinstance(out, (tuple, list)):
            return type(out)(self._mark(o, device) for o in out)
        return out


def _empty_to_device(args: tuple, kwargs: dict) -> Any:
    """The device an empty host tensor is sent to (``torch.Tensor([]).to(device)``, KTO's batch without a
    chosen or rejected row), or ``None``."""
    tensor = args[0] if args else None
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or tensor.numel() != 0:
        return None
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    if isinstance(target, str):
        target = torch.device(target)
    return target if isinstance(target, torch.device) and target.type != "cpu" else None


def _is_device(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type != "cpu"


def _device(args: tuple) -> Any:
    return args[0].device


def _host_device(args: Any, kwargs: dict) -> Any:
    """The device a host tensor among ``args`` / ``kwargs`` (one level of lists and tuples) stands for."""
    for value in (*args, *kwargs.values()):
        found = getattr(value, _DEVICE, None)
        if found is not None:
            return found
        if isinstance(value, (list, tuple)):
            for item in value:
                found = getattr(item, _DEVICE, None)
                if found is not None:
                    return found
    return None


def _to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu() if value.device.type != "cpu" else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, torch.device) and value.type != "cpu":
        return torch.device("cpu")
    return value


def _to_device(value: Any, device: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device) if getattr(value, _DEVICE, None) is not None else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    return value
