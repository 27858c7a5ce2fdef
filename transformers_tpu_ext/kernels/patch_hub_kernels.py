"""Hub kernels on TPU explain what they need: the ``transformers.integrations.hub_kernels`` entries.

On TPU, ``kernels`` (>= 0.17) loads kernels that wrap JAX/Pallas code, so ``jax`` must be installed
next to it. Without jax, Transformers 5.24 fails with a message about ``kernels`` alone (or, later,
deep inside the kernel). This patch checks first, when a Hub kernel is requested on TPU, and raises
``ImportError`` naming the install command: ``pip install "transformers[kernels]" jax``.

It wraps the two entries of ``transformers.integrations.hub_kernels`` through which a user asks for
a Hub kernel (Transformers 5.24), and applies as soon as that module is imported, so the names
bound from it are the checked ones:

- ``kernelize(model)``, also reached as ``from transformers import kernelize`` (Transformers' lazy
  module resolves that name from ``integrations.hub_kernels``, with or without
  ``transformers.modeling_utils`` imported): checked when the model is on a TPU.
- ``load_and_register_attn_kernel``, behind ``attn_implementation="org/kernel-repo"`` (and its
  flash-attention fallback; looked up at call time): checked when the host has a TPU, since the
  model has no device yet at that point.

``from_pretrained(..., use_kernels=True)`` / ``kernel_config=...`` / ``model.use_kernels = True``
go through ``PreTrainedModel.set_use_kernels``, in another module: patch ``use_kernels``.

Everywhere else (no TPU, jax installed, kernels not requested) the upstream call runs untouched.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from .. import backend
from ..core.wrapping import Wraps, fail_safe, user_error

NAME = "hub_kernels"
TARGET = "transformers.integrations.hub_kernels"
DISTRIBUTION = "transformers"

#: The ``kernels`` release from which Hub kernels on TPU wrap JAX/Pallas code.
KERNELS_TPU_MIN = "0.17"
#: What a user installs to run Hub kernels on TPU.
INSTALL = 'pip install "transformers[kernels]" jax'
MESSAGE = (
    "Hub kernels on TPU wrap JAX/Pallas code, so `jax` must be installed next to `kernels` "
    f"(kernels >= {KERNELS_TPU_MIN}), and jax is not installed. Install both with: {INSTALL} "
    "-- or load the model without use_kernels/kernel_config/a Hub attn_implementation."
)

_wraps = Wraps()


def jax_installed() -> bool:
    """Whether ``jax`` can be imported (found, not imported: importing jax is slow)."""
    return "jax" in sys.modules or importlib.util.find_spec("jax") is not None


def require_jax(what: str) -> None:
    """Raise the ``ImportError`` naming the install command when jax is missing."""
    if not jax_installed():
        raise user_error(ImportError(f"{what}: {MESSAGE}", name="jax"))


def _kernelize(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    model = args[0] if args else kwargs.get("model")
    if backend.is_tpu(getattr(model, "device", None)):
        require_jax(f"kernelize() on {model.device}")
    return wrapped(*args, **kwargs)


def _load_and_register_attn_kernel(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    requested = args[0] if args else kwargs.get("attn_implementation")
    if isinstance(requested, str) and backend.tpu_available():
        from transformers.integrations.hub_kernels import is_kernel

        name = requested.split("|")[1] if "|" in requested else requested
        if is_kernel(name):
            require_jax(f"attn_implementation={requested!r} on a TPU host")
    return wrapped(*args, **kwargs)


# A failure of ours in a check falls back to the upstream call; the ImportError above is the user's.
_kernelize_wrapper = fail_safe(_kernelize)
_load_and_register_attn_kernel_wrapper = fail_safe(_load_and_register_attn_kernel)


def apply(module: Any) -> None:
    _wraps.wrap(module, "load_and_register_attn_kernel", _load_and_register_attn_kernel_wrapper)
    _wraps.wrap(module, "kernelize", _kernelize_wrapper)


def revert() -> None:
    _wraps.unwrap_all()
