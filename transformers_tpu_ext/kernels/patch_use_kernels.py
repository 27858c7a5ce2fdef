"""Hub kernels on TPU: Transformers' default never fails a load or a step; a request says what it needs.

``from_pretrained(..., use_kernels=True)`` / ``kernel_config=...`` / ``kernels_mode=...``,
``model.use_kernels = True`` and ``model.train()`` of a kernelized model all go through
``PreTrainedModel.set_use_kernels``. Transformers 5.25 also calls it for a load that asked for nothing
(``use_kernels=None`` becomes ``True``). The wrappers here tell the two apart and apply
:func:`transformers_tpu_ext.kernels.policy.kernels_path`:

- ``PreTrainedModel.from_pretrained``: marks the load as Transformers' *default* when the caller passed
  none of ``use_kernels=True``, ``kernel_config``, ``kernels_mode`` (TRL's reference models, pipelines and
  ``device_map="auto"`` loads included);
- ``PreTrainedModel.train``: the re-kernelization ``train()``/``eval()`` triggers is a default exactly
  when the model's kernels were (the model remembers it);
- ``PreTrainedModel.set_use_kernels``: on a TPU, a default is skipped (no kernelization: the torch
  forwards, as with ``USE_HUB_KERNELS=0``; a model kernelized on the CPU gets them back), a request
  without jax raises the ``ImportError`` of patch ``hub_kernels`` naming the install command, and
  everything else is Transformers' call, untouched.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import backend
from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps, fail_safe
from . import patch_hub_kernels as hub_kernels
from . import policy

NAME = "use_kernels"
TARGET = "transformers.modeling_utils"
DISTRIBUTION = "transformers"
RELIES_ON = (
    Signature("PreTrainedModel.set_use_kernels", positional=("use_kernels", "kernel_config", "mode")),
    Signature("PreTrainedModel.from_pretrained", positional=("pretrained_model_name_or_path",)),
    Signature("PreTrainedModel.train", positional=("mode",)),
    Attribute("PreTrainedModel.use_kernels"),
)

logger = logging.getLogger("transformers_tpu_ext")

_wraps = Wraps()
_as_default = hub_kernels.deciding
#: Set on a model whose Hub kernels were Transformers' default, not the user's request.
_DEFAULT_MARK = "_tpu_ext_default_kernels"
_REQUESTS = ("kernel_config", "kernels_mode")


def _from_pretrained(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    requested = kwargs.get("use_kernels") is True or any(kwargs.get(name) is not None for name in _REQUESTS)
    if requested and _targets_tpu(kwargs.get("device_map")):
        # Refused before anything is read or fetched (a kernel_config registers its kernels before the weights).
        plan = policy.kernels_path(
            on_tpu=True, requested=True, enable=True, jax=hub_kernels.jax_installed(),
            tpu_kernels=hub_kernels.tpu_kernels_mapped(kwargs.get("kernel_config")),
        )
        if plan.path == policy.REFUSE:
            hub_kernels.require_jax(f"use_kernels=True with device_map={kwargs.get('device_map')!r} on a TPU host")
    with _as_default(not requested):
        return wrapped(*args, **kwargs)


def _targets_tpu(device_map: Any) -> bool:
    """Whether ``device_map`` puts weights on a TPU (``"auto"`` and an integer mean the chip on a TPU host)."""
    if device_map is None or not backend.tpu_available():
        return False
    values = device_map.values() if isinstance(device_map, dict) else [device_map]
    return any(
        backend.is_tpu(value) or value in ("auto", "balanced", "balanced_low_0", "sequential")
        or (isinstance(value, int) and not isinstance(value, bool))
        for value in values
    )


def _train(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not getattr(instance, _DEFAULT_MARK, False):
        return wrapped(*args, **kwargs)
    with _as_default(True):
        return wrapped(*args, **kwargs)


def _on_tpu(model: Any, device_map: Any) -> bool:
    if isinstance(device_map, dict) and any(backend.is_tpu(value) for value in device_map.values()):
        return True
    return backend.is_tpu(getattr(model, "device", None))


def _set_use_kernels(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    use_kernels = args[0] if args else kwargs.get("use_kernels")
    default = bool(hub_kernels.decided())
    if default and use_kernels:
        instance.__dict__[_DEFAULT_MARK] = True  # plain attribute: not a parameter, buffer or submodule
    elif use_kernels:
        instance.__dict__.pop(_DEFAULT_MARK, None)
    device_map = args[3] if len(args) > 3 else kwargs.get("device_map")
    kernel_config = args[1] if len(args) > 1 else kwargs.get("kernel_config")
    plan = policy.kernels_path(
        on_tpu=_on_tpu(instance, device_map),
        requested=not default,
        enable=bool(use_kernels),
        jax=hub_kernels.jax_installed(),
        tpu_kernels=hub_kernels.tpu_kernels_mapped(kernel_config if kernel_config is not None else getattr(instance, "kernel_config", None)),
    )
    if plan.path == policy.REFUSE:
        hub_kernels.require_jax(f"use_kernels=True on {instance.device}")
    if plan.path == policy.SKIP:
        logger.info("transformers-tpu-ext: %s: %s", type(instance).__name__, plan.reason)
        if getattr(instance, "use_kernels", False):  # kernelized elsewhere (CPU): the torch forwards back
            with _as_default(True):
                return wrapped(False)
        return None
    with _as_default(default):
        return wrapped(*args, **kwargs)


_wrapper = fail_safe(_set_use_kernels)  # hub_kernels.require_jax's ImportError is the user's: it propagates


def apply(module: Any) -> None:
    _wraps.wrap(module, "PreTrainedModel.from_pretrained", _from_pretrained)
    _wraps.wrap(module, "PreTrainedModel.train", _train)
    _wraps.wrap(module, "PreTrainedModel.set_use_kernels", _wrapper)


def revert() -> None:
    _wraps.unwrap_all()
