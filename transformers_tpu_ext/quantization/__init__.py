"""Models that fit: quantized weights, the int8 KV cache and the fit report on TPU.

- :mod:`.policy` (pure): which path a quantized load or product takes on a TPU (FineGrainedFP8 kept
  8-bit, bitsandbytes refused with the TPU alternative, what each torchao config does), with reasons.
- :mod:`.capacity` (pure): bytes of weights and KV cache per chip in bf16 / int8 / FP8, which chip
  generations and counts hold a model, and its decode ceilings (:func:`.capacity.fit`).
- :mod:`.runtime`: the torch-level pieces (FP8 dequantization in the graph, bytes resident on the TPU
  counting quantized tensors by their inner tensors, counting a config on the meta device) and
  :func:`fit_report`, the Python side of ``transformers-tpu doctor --fit``.
- :mod:`.kv_cache`: the opt-in int8 KV cache (int8 keys/values, a float32 scale per position and
  key-value head): the static layer ``generate()`` uses, and the paged cache's quantize-on-write.
- ``patch_quantizers`` (``transformers.quantizers.auto``) and ``patch_finegrained_fp8``
  (``transformers.integrations.finegrained_fp8``): the glue.

See ``docs/quantization.md``.
"""

from __future__ import annotations

from typing import Any

from .capacity import CHIPS, KV_FORMATS, WEIGHT_FORMATS, FitReport, ModelCounts, fit

__all__ = ["CHIPS", "KV_FORMATS", "WEIGHT_FORMATS", "FitReport", "ModelCounts", "fit", "fit_report"]


def fit_report(model_or_config: Any, **kwargs: Any) -> list[FitReport]:
    """:func:`.runtime.fit_report` (imports torch and Transformers when called)."""
    from .runtime import fit_report as _fit_report

    return _fit_report(model_or_config, **kwargs)
