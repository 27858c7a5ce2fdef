"""Hub kernels on TPU explain what they need.

On TPU, ``kernels`` (>= 0.17) loads kernels that wrap JAX/Pallas code, so ``jax`` must be installed
next to it. Without jax, Transformers 5.24 fails with a message about ``kernels`` alone (or, later,
deep inside the kernel). This patch checks first, when a Hub kernel is requested on TPU, and raises
``ImportError`` naming the install command: ``pip install "transformers[kernels]" jax``.

Requests it covers (Transformers 5.24):

- ``from_pretrained(..., use_kernels=True)`` / ``kernel_config=...`` and ``model.use_kernels = True``:
  all go through ``PreTrainedModel.set_use_kernels``; checked when the model is on a TPU.
- ``attn_implementation="org/kernel-repo"`` (and its flash-attention fallback): goes through
  ``integrations.hub_kernels.load_and_register_attn_kernel`` (looked up at call time); checked when
  the host has a TPU, since the model has no device yet at that point.
- ``transformers.kernelize(model)`` / ``integrations.hub_kernels.kernelize``: checked when the model
  is on a TPU.

Everywhere else (no TPU, jax installed, kernels not requested) the upstream call runs untouched.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from .. import backend
from ._wrap import Wraps

NAME = "hub_kernels"
TARGET = "transformers.modeling_utils"
DISTRIBUTION = "transformers"

INSTALL = 'pip install "transformers[kernels]" jax'
MESSAGE = (
    "Hub kernels on TPU wrap JAX/Pallas code, so `jax` must be installed next to `kernels` "
    f"(kernels >= 0.17), and jax is not installed. Install both with: {INSTALL} "
    "-- or load the model without use_kernels/kernel_config/a Hub attn_implementation."
)

_wraps = Wraps()


def jax_installed() -> bool:
    """Whether ``jax`` can be imported (found, not imported: importing jax is slow)."""
    return "jax" in sys.modules or importlib.util.find_spec("jax") is not None


def _require_jax(what: str) -> None:
    if not jax_installed():
        raise ImportError(f"{what}: {MESSAGE}", name="jax")


def _set_use_kernels(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    use_kernels = args[0] if args else kwargs.get("use_kernels")
    if use_kernels and backend.is_tpu(getattr(instance, "device", None)):
        _require_jax(f"use_kernels=True on {instance.device}")
    return wrapped(*args, **kwargs)


def _kernelize(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    model = args[0] if args else kwargs.get("model")
    if backend.is_tpu(getattr(model, "device", None)):
        _require_jax(f"kernelize() on {model.device}")
    return wrapped(*args, **kwargs)


def _load_and_register_attn_kernel(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    requested = args[0] if args else kwargs.get("attn_implementation")
    if isinstance(requested, str) and backend.tpu_available():
        from transformers.integrations.hub_kernels import is_kernel

        name = requested.split("|")[1] if "|" in requested else requested
        if is_kernel(name):
            _require_jax(f"attn_implementation={requested!r} on a TPU host")
    return wrapped(*args, **kwargs)


def apply(module: Any) -> None:
    from transformers.integrations import hub_kernels

    _wraps.wrap(module, "PreTrainedModel.set_use_kernels", _set_use_kernels)
    _wraps.wrap(hub_kernels, "load_and_register_attn_kernel", _load_and_register_attn_kernel)
    _wraps.wrap(hub_kernels, "kernelize", _kernelize)


def revert() -> None:
    _wraps.unwrap_all()
