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
go through ``PreTrainedModel.set_use_kernels``, in another module: patch ``use_kernels``, which decides
those calls (Transformers' default or the user's request, :mod:`transformers_tpu_ext.kernels.policy`);
the ``kernelize`` they call passes here unchecked. A reset (``reset_kernels()``: an empty mapping) loads
nothing and passes too.

Everywhere else (no TPU, jax installed, kernels not requested) the upstream call runs untouched.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import sys
from typing import Any, Iterator

from .. import backend
from ..core.relies import Signature
from ..core.wrapping import Wraps, caller_module, fail_safe, user_error
from . import policy

NAME = "hub_kernels"
TARGET = "transformers.integrations.hub_kernels"
DISTRIBUTION = "transformers"
RELIES_ON = (
    Signature("kernelize", positional=("model",)),
    Signature("load_and_register_attn_kernel", positional=("attn_implementation",)),
    Signature("is_kernel"),
)

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
#: While patch ``use_kernels`` runs a ``set_use_kernels`` call it decided: ``True`` for Transformers' default,
#: ``False`` for the user's request; ``None`` outside.
_decided: contextvars.ContextVar[bool | None] = contextvars.ContextVar("tpu_ext_kernels_decided", default=None)


@contextlib.contextmanager
def deciding(default: bool) -> Iterator[None]:
    """Mark the calls inside as decided by patch ``use_kernels`` (``default``: Transformers' own default)."""
    token = _decided.set(default)
    try:
        yield
    finally:
        _decided.reset(token)


def decided() -> bool | None:
    """``True``/``False`` inside a call patch ``use_kernels`` decided (Transformers' default / a request)."""
    return _decided.get()


def jax_installed() -> bool:
    """Whether ``jax`` can be imported (found, not imported: importing jax is slow)."""
    return "jax" in sys.modules or importlib.util.find_spec("jax") is not None


def require_jax(what: str) -> None:
    """Raise the ``ImportError`` naming the install command when jax is missing."""
    if not jax_installed():
        raise user_error(ImportError(f"{what}: {MESSAGE}", name="jax"))


def tpu_kernels_mapped(kernel_config: Any) -> bool:
    """Whether a call with ``kernel_config`` (``None``: Transformers' own mapping) would load a TPU kernel: a
    ``kernel_config``'s mapping is made for the model's device; Transformers' mapping names one when one of its
    layers has a ``tpu`` entry. A mapping that cannot be read counts as none (the call is then upstream's)."""
    if kernel_config is not None:
        return bool(getattr(kernel_config, "kernel_mapping", True))
    try:
        from transformers.integrations import hub_kernels

        mapping = hub_kernels.get_kernel_mapping_transformers()
    except Exception:  # noqa: BLE001 - another release's layout: not recognised
        return False
    return any("tpu" in {str(getattr(d, "type", d)) for d in devices} for devices in mapping.values())


def _is_reset(kernel_config: Any) -> bool:
    """``reset_kernels()``'s call: an empty mapping that inherits nothing loads no kernel."""
    return kernel_config is not None and not getattr(kernel_config, "kernel_mapping", True) and not getattr(
        kernel_config, "inherit_mapping", True
    )


def _kernelize(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    # Transformers' own call (set_use_kernels, reset_kernels: patch use_kernels decides those), or a name
    # Transformers bound from this module before revert() (transformers.modeling_utils.kernelize): upstream's.
    if not _wraps or caller_module().startswith("transformers."):
        return wrapped(*args, **kwargs)
    model = args[0] if args else kwargs.get("model")
    kernel_config = args[2] if len(args) > 2 else kwargs.get("kernel_config")
    plan = policy.kernels_path(
        on_tpu=backend.is_tpu(getattr(model, "device", None)),
        requested=True,
        enable=not _is_reset(kernel_config),
        jax=jax_installed(),
        tpu_kernels=tpu_kernels_mapped(kernel_config if kernel_config is not None else getattr(model, "kernel_config", None)),
    )
    if plan.path == policy.REFUSE:
        require_jax(f"kernelize() on {model.device}")
    return wrapped(*args, **kwargs)


def _load_and_register_attn_kernel(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    requested = args[0] if args else kwargs.get("attn_implementation")
    if _wraps and isinstance(requested, str) and backend.tpu_available():
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
