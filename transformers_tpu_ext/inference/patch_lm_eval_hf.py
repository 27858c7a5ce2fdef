"""lm-eval: ``--model hf`` (``HFLM``) evaluates a causal LM on TPU at a few static shapes.

lm-eval's Hugging Face backend builds every batch itself: ``_loglikelihood_tokens`` (behind
``loglikelihood`` and ``loglikelihood_rolling``) makes one tensor per request on the model's device,
right-pads them to the batch's longest, calls ``_model_call(inps)`` (``self.model(inps).logits``),
then takes ``log_softmax``, slices, ``argmax`` and ``gather`` per request; ``generate_until`` calls
``generate()``. On TPU every one of those shapes is a new program, so it never reaches a steady state.
Here, where :func:`~transformers_tpu_ext.inference.policy.lm_eval_path` accepts the model:

- ``HFLM``'s own device (its bookkeeping) is the CPU, the model stays on the TPU. ``device="tpu"``
  (``--model_args pretrained=...,device=tpu``, which lm-eval 0.4 does not know and would replace by the
  CPU) loads the model as for the CPU, then moves it to the TPU;
- ``_model_call`` runs the model bucketed (:class:`~.runtime.Bucketed`: rows and length padded on the
  host, ``use_cache=False``) and returns the logits cut back to the batch's own shape, on the host;
- ``generate_until`` hands ``generate()`` host tensors, which the ``generation`` patch buckets.

Every other ``HFLM`` (a seq2seq backend, several processes, a model not on the TPU, an lm-eval release
outside :data:`~transformers_tpu_ext.inference.policy.LM_EVAL_SUPPORTED`) runs as upstream's.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from .. import backend
from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps, fail_safe

NAME = "lm_eval_hf"
TARGET = "lm_eval.models.huggingface"
DISTRIBUTION = "transformers"  # lm-eval is an optional extra: its own range is checked by the predicate
RELIES_ON = (
    Signature("HFLM.__init__", ("pretrained", "device"), positional=("pretrained",)),  # args[0] / pretrained=, device=
    Signature("HFLM._model_call", positional=("inps",)),  # a causal LM's call: inps alone
    Attribute("HFLM.model"),
    Attribute("HFLM.device"),  # a property over _device, which the patch sets
)

_wraps = Wraps()
logger = logging.getLogger("transformers_tpu_ext")
_ON_HOST = "_transformers_tpu_ext_on_host"  # set on an HFLM whose bookkeeping this patch moved to the host


def _version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("lm_eval")
    except metadata.PackageNotFoundError:
        return None


def _device_type(model: Any) -> str | None:
    try:
        return next(model.parameters()).device.type
    except (StopIteration, AttributeError, TypeError):
        return None


def _asks_for_tpu(device: Any) -> bool:
    return isinstance(device, str) and device.split(":")[0] == backend.DEVICE_TYPE


def _init(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    import torch

    to_tpu = _asks_for_tpu(kwargs.get("device")) and isinstance(args[0] if args else kwargs.get("pretrained"), str)
    if to_tpu:
        kwargs = {**kwargs, "device": "cpu"}  # lm-eval 0.4 knows no "tpu" and would fall back to the CPU
    wrapped(*args, **kwargs)
    model = getattr(instance, "_model", None)
    if to_tpu and model is not None:
        model.to(backend.DEVICE_TYPE)
    try:
        reason = _path(instance)
    except Exception as error:  # noqa: BLE001 - a bug of ours leaves upstream's HFLM as it is
        reason = f"the plugin failed to read the model ({type(error).__name__}: {error})"
    if reason is None:
        instance._device = torch.device("cpu")  # lm-eval's per-request tensors and slices stay on the host
        setattr(instance, _ON_HOST, True)
    elif _device_type(model) == backend.DEVICE_TYPE:
        logger.info("transformers-tpu-ext: lm-eval's HFLM runs as upstream's: %s", reason)


def _path(instance: Any) -> str | None:
    from . import policy

    accelerator = getattr(instance, "accelerator", None)
    return policy.lm_eval_path(
        _version(),
        backend=getattr(instance, "backend", None),
        model_device=_device_type(getattr(instance, "_model", None)),
        processes=getattr(accelerator, "num_processes", 1) if accelerator is not None else 1,
        parallelize=bool(getattr(getattr(instance, "_model", None), "hf_device_map", None)),
    )


def _model_call(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    from . import runtime

    if not getattr(instance, _ON_HOST, False) or len(args) + len(kwargs) != 1:
        return wrapped(*args, **kwargs)  # seq2seq (attn_mask, labels) or an HFLM left as upstream's
    model = instance.model
    with runtime.for_model(model, drop_cache=True, positional_ids=True):
        logits = wrapped(*args, **kwargs)
    return logits.to(instance.device)


def _wrapper(hook: Callable[..., Any]) -> Callable[..., Any]:
    guarded = fail_safe(hook)

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        if not backend.tpu_available():
            return wrapped(*args, **kwargs)
        return guarded(wrapped, instance, args, kwargs)

    return wrapper


def apply(module: Any) -> None:
    _wraps.wrap(module.HFLM, "__init__", _wrapper(_init))
    _wraps.wrap(module.HFLM, "_model_call", _wrapper(_model_call))


def revert() -> None:
    _wraps.unwrap_all()
