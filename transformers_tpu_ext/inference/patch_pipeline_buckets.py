"""Transformers: every pipeline's forward pass runs at a few static shapes on TPU.

``Pipeline.forward`` moves a batch (one input, or ``batch_size`` inputs that ``pad_collate_fn``
padded to their longest) to the device, calls ``_forward`` (which calls ``self.model(**inputs)``)
and moves the outputs back to the CPU for ``postprocess``. On TPU each new batch length compiles
new programs. Here the pipeline's model call is padded to a bucket and its outputs cut back to the
batch's own rows and lengths (:mod:`transformers_tpu_ext.inference.runtime`), wherever
:func:`transformers_tpu_ext.inference.policy.plan_call` proves the result unchanged: ``_forward``
and ``postprocess`` see exactly what they see unpadded. The padding is made from the host copy of
the inputs. Pipelines never read a KV cache, so a decoder's model call runs with ``use_cache=False``.
Only the pipelines of :data:`~transformers_tpu_ext.inference.policy.PIPELINES` (text generation
buckets its own calls in ``generate()``); pipelines whose model is not on the TPU, and every non-TPU
host, are upstream's.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import backend
from ..core.relies import Signature
from ..core.wrapping import Wraps, fail_safe

NAME = "pipeline_buckets"
TARGET = "transformers.pipelines.base"
DISTRIBUTION = "transformers"
RELIES_ON = (
    Signature("Pipeline.forward", ("model_inputs",), positional=("model_inputs",)),  # args[0] / model_inputs=
    Signature("Pipeline._forward"),  # what forward() calls, with the padded batch (each pipeline names its input)
)

_wraps = Wraps()


def _model_on_tpu(pipeline: Any) -> Any:
    import torch

    model = getattr(pipeline, "model", None)
    if not isinstance(model, torch.nn.Module):
        return None
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return None
    return model if device.type == backend.DEVICE_TYPE else None


def _forward(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    from . import media, policy, runtime

    model = _model_on_tpu(instance)
    if model is None or not policy.pipeline_path(type(instance).__name__):
        return wrapped(*args, **kwargs)
    kwargs = dict(kwargs)  # fail_safe falls back with the caller's own kwargs
    inputs = args[0] if args else kwargs.pop("model_inputs")
    if type(instance).__name__ in media.MEDIA_PIPELINES:  # images, audio: rows (and samples) padded
        from .media_calls import MediaCalls

        calls = runtime.for_model(model, drop_cache=True, kind=MediaCalls)
    else:
        calls = runtime.for_model(model, drop_cache=True)
    with calls, calls.sent(inputs) as sent:
        return wrapped(sent, *args[1:], **kwargs)


_guarded = fail_safe(_forward)


def _wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    if not backend.tpu_available():
        return wrapped(*args, **kwargs)
    return _guarded(wrapped, instance, args, kwargs)


def apply(module: Any) -> None:
    _wraps.wrap(module.Pipeline, "forward", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
