"""``torch.tensor(data)`` / ``torch.as_tensor(data)`` whose nested data holds TPU tensors, on the simulated TPU.

PyTorch builds such a tensor by reading every element with ``item()`` (``recursive_store``); on a chip that is
torch_tpu's C++ ``_local_scalar_dense``, a device-to-host read per element. PyTorch calls it there with the
Python dispatcher excluded, and a Python backend's kernel is then not found: ``func != nullptr INTERNAL ASSERT
FAILED`` (``python_dispatch.cpp``). Qwen2-VL's ``get_rope_index`` does exactly this
(``torch.tensor([llm_positions.max() + 1 - n, ...], device=...)``), so every forward of the Qwen-VL family
failed on the simulated TPU and not on a chip.

The simulator reads those elements on the host first (``.cpu()``: the same device-to-host bytes, counted) and
hands PyTorch the host values; data without TPU tensors goes to PyTorch untouched.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["register"]

_registered = False


def _holds_tpu(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return data.device.type == "tpu"
    if isinstance(data, (list, tuple)):
        return any(_holds_tpu(item) for item in data)
    return False


def _on_host(data: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return data.cpu() if data.device.type == "tpu" else data
    if isinstance(data, (list, tuple)):
        return type(data)(_on_host(item) for item in data)
    return data


def _wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    data = args[0] if args else kwargs.get("data")
    if not isinstance(data, (list, tuple)) or not _holds_tpu(data):
        return wrapped(*args, **kwargs)
    if args:
        return wrapped(_on_host(data), *args[1:], **kwargs)
    return wrapped(**{**kwargs, "data": _on_host(data)})


def register() -> None:
    """Wrap ``torch.tensor`` and ``torch.as_tensor`` (once per process)."""
    global _registered
    if _registered:
        return
    import wrapt

    wrapt.wrap_function_wrapper(torch, "tensor", _wrapper)
    wrapt.wrap_function_wrapper(torch, "as_tensor", _wrapper)
    _registered = True
