"""Accelerate: ``gather`` of TPU tensors on the TPU process group meets ``tpu_dist``'s shape rule.

``accelerate.utils.operations._gpu_gather`` (behind ``Accelerator.gather``, ``gather_for_metrics``,
``pad_across_processes`` and so the Trainer's ``evaluate()`` / ``predict()``) all-gathers each tensor
into a flat 1-D output of ``world x numel`` elements for every backend but gloo. torch_tpu's
``tpu_dist`` all-gathers into an output that is ``world x input`` on dim 0 (internals Q7), so every
gather of a tensor with two or more dimensions fails with several processes. On the TPU process
group each TPU tensor is gathered with the same one ``all_gather_into_tensor``, into an output of
the shape ``tpu_dist`` wants (:func:`multiprocess.gather_output_shape`), which is the shape upstream
returns; anything else (another backend, a host tensor) goes to upstream's code
(:func:`multiprocess.gather_path`).

``gather`` looks ``_gpu_gather`` up in the module when it runs, so one wrapper covers every caller.
Not ``fail_safe``: a collective that failed on one rank must not be retried as another collective
(the ranks would then wait on different operations); the wrapper decides before any collective,
and its decision depends only on facts every rank shares.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from . import multiprocess
from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps, warn_once

NAME = "accelerate_operations"
TARGET = "accelerate.utils.operations"
DISTRIBUTION = "accelerate"
RELIES_ON = (
    Signature("_gpu_gather", ("tensor",), positional=("tensor",)),  # looked up by gather() when it runs
    Signature("recursively_apply", ("error_on_other_type",), positional=("func", "data")),
    Attribute("accelerate.state:PartialState"),
)

_wraps = Wraps()


def _torch() -> Any:
    return sys.modules["torch"]


def _path(state: Any, tensor: Any) -> str:
    device = getattr(state, "device", None)
    path, _ = multiprocess.gather_path(
        backend=getattr(state, "backend", None),
        device_type=getattr(device, "type", None),
        tensor_device_type=getattr(getattr(tensor, "device", None), "type", None),
    )
    return path


def _gather_one(tensor: Any, world: int) -> Any:
    torch = _torch()
    if tensor.ndim == 0:
        tensor = tensor.clone()[None]
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    output = torch.empty(multiprocess.gather_output_shape(world, tuple(tensor.shape)), dtype=tensor.dtype, device=tensor.device)
    torch.distributed.all_gather_into_tensor(output, tensor)
    return output


def _gpu_gather(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for ``_gpu_gather(tensor)`` (a tensor or a nested structure of tensors)."""
    try:
        module = sys.modules[TARGET]
        from accelerate.state import PartialState

        state = PartialState()
        world = int(state.num_processes)
        data = args[0] if args else kwargs["tensor"]
        tensors: list[Any] = []
        module.recursively_apply(lambda t: tensors.append(t) or t, data, error_on_other_type=True)
        ours = bool(tensors) and all(_path(state, t) == multiprocess.GATHER_TPU for t in tensors)
    except Exception as error:  # noqa: BLE001 - decided before any collective: upstream's gather runs
        warn_once(f"choosing how to gather on the TPU failed ({type(error).__name__}: {error}); Accelerate gathers")
        ours = False
    if not ours:
        return wrapped(*args, **kwargs)
    return module.recursively_apply(lambda t: _gather_one(t, world), data, error_on_other_type=True)


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "_gpu_gather", _gpu_gather)


def revert() -> None:
    _wraps.unwrap_all()
