"""Patch of Transformers' quantizers (``transformers.quantizers.auto``): quantized loads on a TPU host.

``validate_environment`` runs first in ``from_pretrained`` (``get_hf_quantizer``, with the user's
``device_map``), before any weight is read, and again once the device map is inferred. Thin wrappers,
each deciding through :mod:`.policy`:

- ``FineGrainedFP8HfQuantizer``: without a GPU, upstream dequantizes an FP8 checkpoint to bf16 (twice
  the HBM) and refuses ``FineGrainedFP8Config()`` on a bf16 checkpoint ("No GPU or XPU found"). Where
  :func:`.policy.fp8_path` says so (a TPU, a ``device_map`` that puts the weights there, float scales),
  the check returns without dequantizing: the float8 weights and their block scales load onto the TPU,
  and ``patch_finegrained_fp8`` runs their products.
- ``Bnb8BitHfQuantizer`` / ``Bnb4BitHfQuantizer``: bitsandbytes has no TPU backend; on a TPU host, unless
  every weight stays on the host, one ``ValueError`` names the TPU alternative (:data:`.policy.BNB_MESSAGE`).
  No silent mapping to another format: LLM.int8 and NF4 compute other numbers.
- ``TorchAoHfQuantizer``: a torchao config other than int8 weight-only is said once in the log
  (:func:`.policy.torchao_note`), then upstream runs.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import backend
from ..core.relies import Signature
from ..core.wrapping import Wraps, fail_safe, user_error, warn_once
from . import policy

NAME = "quantizers"
TARGET = "transformers.quantizers.auto"
DISTRIBUTION = "transformers"
RELIES_ON = (
    # get_hf_quantizer calls validate_environment(device_map=..., ...): the wrappers read device_map=.
    Signature("FineGrainedFP8HfQuantizer.validate_environment", ("device_map",)),
    Signature("Bnb8BitHfQuantizer.validate_environment", ("device_map",)),
    Signature("Bnb4BitHfQuantizer.validate_environment", ("device_map",)),
    Signature("TorchAoHfQuantizer.validate_environment"),
    # The FP8 facts: config.dequantize, and scale_fmt / expert_dtype (read with "float" / "fp8" when absent).
    Signature("FineGrainedFP8Config", ("dequantize", "scale_fmt", "expert_dtype")),
    Signature("TorchAoConfig", ("quant_type",), positional=("quant_type",)),
)

logger = logging.getLogger("transformers_tpu_ext")

_wraps = Wraps()


def _gpu() -> bool:
    import torch

    xpu = getattr(torch, "xpu", None)
    return bool(torch.cuda.is_available() or (xpu is not None and xpu.is_available()))


@fail_safe
def _fp8_validate(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    config = instance.quantization_config
    facts = policy.Fp8Facts(
        tpu=backend.tpu_available(),
        device_map=policy.device_map_kind(kwargs.get("device_map")),
        pre_quantized=bool(instance.pre_quantized),
        dequantize=bool(config.dequantize),
        scale_fmt=str(getattr(config, "scale_fmt", "float")),
        expert_dtype=str(getattr(config, "expert_dtype", "fp8")),
        gpu=_gpu(),
    )
    decision = policy.fp8_path(facts)
    if getattr(instance, "_tpu_ext_fp8", False):
        # The second check, with the inferred device map: the float8 weights were kept for the TPU already.
        if decision.tpu:
            return None
        raise user_error(ValueError(policy.fp8_kept_problem(decision)))
    if not decision.tpu:
        if facts.tpu and facts.device_map == policy.DeviceMap.NONE and not facts.dequantize:
            warn_once(f"FP8 model on a TPU host: {decision.reason}")
        elif facts.tpu:
            logger.info("transformers-tpu-ext: FP8 load left to Transformers: %s", decision.reason)
        return wrapped(*args, **kwargs)
    from transformers.utils import is_accelerate_available

    if not is_accelerate_available():  # upstream's first check, kept
        return wrapped(*args, **kwargs)
    instance._tpu_ext_fp8 = True
    logger.info("transformers-tpu-ext: FP8 weights kept 8-bit on the TPU (%s)", decision.reason)
    return None


def _bnb_validate(what: str) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        decision = policy.bnb_path(
            tpu=backend.tpu_available(), device_map=policy.device_map_kind(kwargs.get("device_map"))
        )
        if decision.path == "refuse":
            raise user_error(ValueError(policy.BNB_MESSAGE.format(what=what)))
        return wrapped(*args, **kwargs)

    wrapper.__qualname__ = f"_bnb_validate[{what}]"
    return wrapper


_bnb8 = _bnb_validate("load_in_8bit")
_bnb4 = _bnb_validate("load_in_4bit")


def _torchao_validate(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    quant_type = getattr(instance.quantization_config, "quant_type", None)
    name = quant_type if isinstance(quant_type, str) else type(quant_type).__name__
    note = policy.torchao_note(name, tpu=backend.tpu_available())
    if note is not None and not note.tpu:
        warn_once(f"torchao {name} on TPU: {note.reason}")
    return result


def apply(module: Any) -> None:
    _wraps.wrap(module.FineGrainedFP8HfQuantizer, "validate_environment", _fp8_validate)
    _wraps.wrap(module.Bnb8BitHfQuantizer, "validate_environment", _bnb8)
    _wraps.wrap(module.Bnb4BitHfQuantizer, "validate_environment", _bnb4)
    _wraps.wrap(module.TorchAoHfQuantizer, "validate_environment", _torchao_validate)


def revert() -> None:
    _wraps.unwrap_all()
