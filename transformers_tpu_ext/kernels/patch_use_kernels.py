"""Hub kernels on TPU explain what they need: ``PreTrainedModel.set_use_kernels``.

``from_pretrained(..., use_kernels=True)`` / ``kernel_config=...`` and ``model.use_kernels = True``
all go through ``PreTrainedModel.set_use_kernels`` (Transformers 5.24), which calls the
``kernelize`` that ``transformers.modeling_utils`` bound at its own import. When the model is on a
TPU and jax is missing, the wrapper raises the ``ImportError`` of patch ``hub_kernels`` (naming
``pip install "transformers[kernels]" jax``) before Transformers looks for ``kernels``. Anywhere
else, or with ``use_kernels=False``, the upstream call runs untouched.
"""

from __future__ import annotations

from typing import Any

from .. import backend
from . import patch_hub_kernels as hub_kernels
from ..core.wrapping import Wraps, fail_safe

NAME = "use_kernels"
TARGET = "transformers.modeling_utils"
DISTRIBUTION = "transformers"

_wraps = Wraps()


def _set_use_kernels(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    use_kernels = args[0] if args else kwargs.get("use_kernels")
    if use_kernels and backend.is_tpu(getattr(instance, "device", None)):
        hub_kernels.require_jax(f"use_kernels=True on {instance.device}")
    return wrapped(*args, **kwargs)


_wrapper = fail_safe(_set_use_kernels)  # hub_kernels.require_jax's ImportError is the user's: it propagates


def apply(module: Any) -> None:
    _wraps.wrap(module, "PreTrainedModel.set_use_kernels", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
