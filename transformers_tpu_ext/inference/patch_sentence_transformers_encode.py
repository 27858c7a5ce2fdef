"""sentence-transformers: ``SentenceTransformer(..., device="tpu").encode(texts)`` at a few static shapes, unwrapped.

``encode()`` sorts the texts by length, tokenizes each batch padded to its longest and runs the
model's whole forward (Transformer, Pooling, Dense, Normalize) on the device: on TPU a new program
for almost every batch. Here an ``encode()`` of a model on the TPU runs inside
:func:`transformers_tpu_ext.inference.bucketed` (:mod:`.encoders`: the whole forward padded to a
bucket, pooling under the mask, outputs cut back), as if the user had written ``with
bucketed(model):`` around it. Models :func:`~.policy.encoder_facts` does not recognise run as they
are (the hooks leave their calls alone); a model not on the TPU, a multi-process pool, and every
non-TPU host are upstream's.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import backend
from ..core.relies import Signature
from ..core.wrapping import Wraps, fail_safe

NAME = "sentence_transformers_encode"
TARGET = "sentence_transformers.sentence_transformer.model"
DISTRIBUTION = "transformers"  # sentence-transformers is an optional extra (`embeddings`): its model holds a Transformers one
RELIES_ON = (
    Signature("SentenceTransformer.encode", ("pool", "device")),  # read by name: a pool or another device is upstream's
)

_wraps = Wraps()


def _on_tpu(model: Any) -> bool:
    try:
        return next(model.parameters()).device.type == backend.DEVICE_TYPE
    except (StopIteration, AttributeError, TypeError):
        return False


def _encode(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    from . import bucketed

    if not _on_tpu(instance) or kwargs.get("pool") is not None or kwargs.get("device") not in (None, backend.DEVICE_TYPE):
        return wrapped(*args, **kwargs)
    with bucketed(instance):
        return wrapped(*args, **kwargs)


_guarded = fail_safe(_encode)


def _wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    if not backend.tpu_available():
        return wrapped(*args, **kwargs)
    return _guarded(wrapped, instance, args, kwargs)


def apply(module: Any) -> None:
    _wraps.wrap(module.SentenceTransformer, "encode", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
