"""The ``"tpu"`` torch.compile backend of the simulated TPU, and inductor's refusal of TPU inputs.

Like torch_tpu's backend it rejects any ``mode`` (``TypeError: Unexpected keyword arguments``).
It counts one compiled graph per graph TorchDynamo hands it and runs the captured FX graph as
is; operations inside a compiled graph are not counted as eager programs.

Registration waits for ``torch._dynamo`` to be imported (a wrapt post-import hook), so installing
the simulator does not pay for importing TorchDynamo.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from .device import STATE

__all__ = ["INDUCTOR_REFUSAL", "register", "tpu_backend"]

INDUCTOR_REFUSAL = (
    "inductor cannot compile graphs on TPU tensors (torch_tpu 0.2.0 fails to register its "
    "Pallas kernels); use torch.compile(..., backend='tpu')"
)


def tpu_backend(gm: Any, example_inputs: Any, **kwargs: Any) -> Callable[..., Any]:
    if kwargs:
        raise TypeError(f"Unexpected keyword arguments: {kwargs}")
    from .instance import simulated_tpu

    sim = simulated_tpu()
    if sim is not None:
        sim._graphs_compiled += 1
    forward = gm.forward

    def run_compiled(*args: Any) -> Any:
        STATE.in_graph += 1
        try:
            return forward(*args)
        finally:
            STATE.in_graph -= 1

    return run_compiled


def _on_tpu(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return value.device.type == "tpu"
    if isinstance(value, (list, tuple)):
        return any(_on_tpu(v) for v in value)
    return False


def _refuse_inductor(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    inputs = args[1] if len(args) > 1 else kwargs.get("inputs_", ())
    if _on_tpu(list(inputs)):
        raise RuntimeError(INDUCTOR_REFUSAL)
    return wrapped(*args, **kwargs)


def _register_with_dynamo(dynamo: Any) -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if _COMPILER_FNS.get("tpu") is not tpu_backend:
        _COMPILER_FNS.pop("tpu", None)
        register_backend(tpu_backend, name="tpu")


_registered = False


def register() -> None:
    """Register the backend (now or when TorchDynamo is imported) and make inductor refuse TPU."""
    global _registered
    if _registered:
        return
    import torch
    import wrapt

    wrapt.wrap_function_wrapper(torch, "_TorchCompileInductorWrapper.__call__", _refuse_inductor)
    if "torch._dynamo" in sys.modules:
        _register_with_dynamo(sys.modules["torch._dynamo"])
    else:
        wrapt.register_post_import_hook(_register_with_dynamo, "torch._dynamo")
    _registered = True
