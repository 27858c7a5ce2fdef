"""The ``"tpu"`` torch.compile backend of the simulated TPU, and inductor's refusal of TPU inputs.

Like torch_tpu's backend it rejects any ``mode`` (``TypeError: Unexpected keyword arguments``).
Each graph TorchDynamo hands it is a program the process does not hold yet: the compile cache
(:mod:`.compile_cache`) loads it from the persistent tier when an earlier process of the same
release stored it (keyed by the graph's code and its inputs' shapes, strides and dtypes), and
otherwise it is compiled and counted. The captured FX graph then runs as is; operations inside a
compiled graph are not counted as eager programs, and each run after the first is a cache hit.

Registration waits for ``torch._dynamo`` to be imported (a wrapt post-import hook), so installing
the simulator does not pay for importing TorchDynamo.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from . import report
from .compile_cache import CACHE
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
    if CACHE.miss("graph", lambda: _graph_key(gm, example_inputs)) and sim is not None:
        sim._graphs_compiled += 1
        report.compiled()
    forward = gm.forward
    runs = [0]

    def run_compiled(*args: Any) -> Any:
        if runs[0]:
            CACHE.hits += 1  # the first run used the program just compiled (or loaded): its miss
        runs[0] += 1
        STATE.graph_calls += 1
        STATE.in_graph += 1
        try:
            return forward(*args)
        finally:
            STATE.in_graph -= 1

    return run_compiled


def _graph_key(gm: Any, example_inputs: Any) -> str:
    """What identifies a compiled graph across processes: its code and its inputs' metadata."""
    inputs = []
    for value in example_inputs:
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            stride = tuple(value.stride()) if hasattr(value, "stride") else ()
            inputs.append(f"{value.dtype}{tuple(value.shape)}/{stride}@{value.device.type}")
        else:
            inputs.append(repr(value))
    return f"graph of {len(inputs)} inputs: {', '.join(inputs)}\n{gm.code.strip()}"


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


#: The simulator's modules that run inside PyTorch's dispatch (tensor operations, factories, transfers,
#: storages, random draws, autocast): torch_tpu's are C++, which TorchDynamo never sees. TorchDynamo
#: skips them: an eager stretch of a compiled function (after a graph break) runs them as the chip
#: runs its kernels, instead of converting their frames (a half-built ``TpuTensor`` failed there).
DISPATCH_MODULES = (
    "device", "device_state", "device_storage", "factories", "op_facts", "mixing", "generators", "random_ops",
    "foreach", "inference_views", "autocast", "pinned", "quantized_ops", "compile_cache", "counters",
)


def _register_with_dynamo(dynamo: Any) -> None:
    from torch._dynamo import trace_rules
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if _COMPILER_FNS.get("tpu") is not tpu_backend:
        _COMPILER_FNS.pop("tpu", None)
        register_backend(tpu_backend, name="tpu")
    package = __name__.rpartition(".")[0]
    for name in DISPATCH_MODULES:
        trace_rules.add(f"{package}.{name}")


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
