"""The quantized matmuls torch_tpu 0.2.0 lacks or restricts, refused on the simulated TPU as on a chip.

From ``shared/reference/torch_tpu-0.2.0-internals.md`` (Q3, read from the wheel):

- no int8 or int4 matmul kernel: ``aten::_int_mm``, ``_weight_int8pack_mm``, ``_weight_int4pack_mm``
  (and the int4 packing and CPU variants) are not registered for the device. Eagerly, torch_tpu falls
  back to the CPU ("... is not implemented for TPU. Falling back to CPU", a host round trip per call);
  a compiled graph has no fallback. The simulator refuses both, the stricter model: a path that needs
  these kernels fails in tests as it would in a compiled decode step on a chip.
- ``_scaled_mm`` takes tensor-wise scales (one element each) or row-wise ``scale_a`` ``[M, 1]`` with
  per-column ``scale_b`` ``[1, N]`` (float32); ``_scaled_mm_v2`` the recipes TensorWise, RowWise and
  BlockWise1x32 (mxfp8). Neither takes ``use_fast_accum=True``. Other recipes (the 128x128 blocks of
  FineGrainedFP8 checkpoints, 1x128, 1x16) raise, with torch_tpu's wording.

A handler runs for tpu tensors only (CPU tensors never reach the simulator's dispatcher), eagerly and
inside graphs the ``"tpu"`` backend compiled (their operations run through the same dispatcher).
:func:`register` is called by the installer.
"""

from __future__ import annotations

from typing import Any

import torch

from . import device

__all__ = ["FAST_ACCUM_REFUSAL", "MISSING", "SCALED_MM_V2_RECIPES", "missing_kernel_message", "register"]

_aten = torch.ops.aten

#: aten operators torch_tpu 0.2.0 has no kernel for (int8/int4 matmuls and int4 packing).
MISSING = (
    "_int_mm",
    "_weight_int8pack_mm",
    "_weight_int4pack_mm",
    "_weight_int4pack_mm_for_cpu",
    "_weight_int4pack_mm_with_scales_and_zeros",
    "_convert_weight_to_int4pack",
    "_convert_weight_to_int4pack_for_cpu",
    "_dyn_quant_matmul_4bit",
    "_dyn_quant_pack_4bit_weight",
)

#: ``ScalingType`` values (``torch.nn.functional.ScalingType``) ``_scaled_mm_v2`` takes on TPU.
SCALED_MM_V2_RECIPES = {0: "TensorWise", 1: "RowWise", 3: "BlockWise1x32"}
_RECIPE_NAMES = {0: "TensorWise", 1: "RowWise", 2: "BlockWise1x16", 3: "BlockWise1x32", 4: "BlockWise1x128",
                 5: "BlockWise128x128"}

FAST_ACCUM_REFUSAL = "use_fast_accum=true is not supported yet on TPU"


def missing_kernel_message(name: str) -> str:
    return (
        f"aten::{name} is not implemented for TPU: torch_tpu 0.2.0 has no int8/int4 matmul kernel (eagerly a chip "
        "falls back to the CPU for each call; a compiled graph cannot run it). On a TPU, quantized weights run as "
        "plain operations the compiler fuses: TorchAoConfig(Int8WeightOnlyConfig()) or an FP8 checkpoint "
        "(see docs/quantization.md)"
    )


def _missing(name: str) -> Any:
    def refuse(args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError(missing_kernel_message(name))

    return refuse


_SCALED_MM_ARGS = ("self", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")


def _scaled_mm(func: Any) -> Any:
    def check(args: tuple, kwargs: dict) -> Any:
        bound = dict(zip(_SCALED_MM_ARGS, args), **kwargs)
        if bound.get("use_fast_accum"):
            raise RuntimeError(FAST_ACCUM_REFUSAL)
        a, b, sa, sb = bound["self"], bound["mat2"], bound["scale_a"], bound["scale_b"]
        tensorwise = sa.numel() == 1 and sb.numel() == 1
        rowwise = (
            tuple(sa.shape) == (a.shape[0], 1)
            and tuple(sb.shape) == (1, b.shape[1])
            and sa.dtype == sb.dtype == torch.float32
        )
        if not (tensorwise or rowwise):
            raise RuntimeError(
                "_scaled_mm on TPU supports TensorWise, RowWise, or BlockWise1x32 scaling; got scale_a of shape "
                f"{tuple(sa.shape)} and scale_b of shape {tuple(sb.shape)} for a {tuple(a.shape)} x {tuple(b.shape)} "
                "product"
            )
        return device._run_generic(func, args, kwargs)

    return check


_SCALED_MM_V2_ARGS = ("self", "mat2", "scale_a", "recipe_a", "swizzle_a", "scale_b", "recipe_b", "swizzle_b",
                      "bias", "out_dtype", "contraction_dims", "use_fast_accum")


def _scaled_mm_v2(func: Any) -> Any:
    def check(args: tuple, kwargs: dict) -> Any:
        bound = dict(zip(_SCALED_MM_V2_ARGS, args), **kwargs)
        if bound.get("use_fast_accum"):
            raise RuntimeError(FAST_ACCUM_REFUSAL)
        for side in ("a", "b"):
            recipes = [int(r) for r in bound.get(f"recipe_{side}") or ()]
            refused = [r for r in recipes if r not in SCALED_MM_V2_RECIPES]
            if refused:
                names = ", ".join(_RECIPE_NAMES.get(r, str(r)) for r in refused)
                raise RuntimeError(
                    f"_scaled_mm_v2 on TPU supports TensorWise, RowWise, or BlockWise1x32 scaling; got {names} for "
                    f"scale_{side}"
                )
        return device._run_generic(func, args, kwargs)

    return check


def _overloads(name: str) -> list[Any]:
    packet = getattr(_aten, name, None)
    return [] if packet is None else [getattr(packet, overload) for overload in packet.overloads()]


def register() -> None:
    """Install the refusals and recipe checks in the simulator's dispatcher (idempotent)."""
    handlers: dict[Any, Any] = {}
    for name in MISSING:
        for overload in _overloads(name):
            handlers[overload] = _missing(name)
    for overload in _overloads("_scaled_mm"):
        handlers[overload] = _scaled_mm(overload)
    for overload in _overloads("_scaled_mm_v2"):
        handlers[overload] = _scaled_mm_v2(overload)
    for func, handler in handlers.items():
        device._SPECIAL[func] = handler
        device._INFO.pop(func, None)  # recomputed with the special handler
