"""Patch of ``transformers.integrations.finegrained_fp8``: FP8 products of weights on a TPU.

``FP8Linear.forward``, ``FP8LinearFunction.forward`` (the training path, whose backward is upstream's) and
the eager ``FP8Experts`` loop call the module global ``fp8_linear``, which needs DeepGEMM or the Hub's
Triton kernel. It is rebound to :func:`_make_fp8_linear`'s plain function: a call that
:func:`.policy.fp8_linear_path` accepts (a float8 weight on the TPU with float scales) runs
:func:`.runtime.fp8_linear` (dequantize inside the graph, then a bf16 product); any other goes to
upstream's function.

A rebinding, not a wrapt wrapper: ``fp8_linear`` is called inside the compiled decode step, and
TorchDynamo traces the function a wrapt wrapper wraps, skipping the wrapper. The decision is taken at
trace time (``torch.compiler.assume_constant_result``), so the graph holds only the chosen path.
"""

from __future__ import annotations

import functools
from typing import Any

from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps
from . import policy

NAME = "finegrained_fp8"
TARGET = "transformers.integrations.finegrained_fp8"
DISTRIBUTION = "transformers"
RELIES_ON = (
    # The rebound fp8_linear reads args[0] / block_size= after the first three, and passes everything on to
    # runtime.fp8_linear, which takes upstream's parameters in upstream's order.
    Signature(
        "fp8_linear",
        ("block_size", "bias", "activation_scale", "allow_deepgemm"),
        positional=("input", "weight", "weight_scale_inv", "block_size", "bias", "activation_scale", "allow_deepgemm"),
    ),
    Attribute("FP8Linear.forward"),  # a caller of the module global fp8_linear
)

_wraps = Wraps()


@functools.lru_cache(maxsize=256)
def _tpu_path(device: str, weight_dtype: str, scale_dtype: str, weight_dims: int, scale_dims: int,
              block_size: tuple | None) -> bool:
    facts = policy.Fp8LinearFacts(device, weight_dtype, scale_dtype, weight_dims, scale_dims, block_size)
    return policy.fp8_linear_path(facts).tpu


def _make_fp8_linear(upstream: Any) -> Any:
    import torch

    decide = torch.compiler.assume_constant_result(_tpu_path)

    def fp8_linear(input: Any, weight: Any, weight_scale_inv: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        block_size = args[0] if args else kwargs.get("block_size")
        tpu = decide(
            weight.device.type,
            str(weight.dtype).removeprefix("torch."),
            str(weight_scale_inv.dtype).removeprefix("torch."),
            weight.dim(),
            weight_scale_inv.dim(),
            None if block_size is None else tuple(block_size),
        )
        if tpu:
            from .runtime import fp8_linear as tpu_fp8_linear

            return tpu_fp8_linear(input, weight, weight_scale_inv, *args, **kwargs)
        return upstream(input, weight, weight_scale_inv, *args, **kwargs)

    fp8_linear.__wrapped__ = upstream
    fp8_linear.__doc__ = upstream.__doc__
    fp8_linear._tpu_ext = True
    return fp8_linear


def apply(module: Any) -> None:
    if getattr(module.fp8_linear, "_tpu_ext", False):
        return
    _wraps.replace(module, "fp8_linear", _make_fp8_linear(module.fp8_linear))


def revert() -> None:
    _wraps.unwrap_all()
