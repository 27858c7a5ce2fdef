"""torch's foreach implementations for simulated TPU tensors, as a chip's tensors get them.

torch chooses between its per-tensor loops and its ``_foreach_*`` (multi-tensor) implementations by
device *and* tensor type: ``torch.optim.optimizer._default_to_fused_or_foreach`` (the default of
Adam, AdamW, SGD, ...) and ``torch.utils._foreach_utils._has_foreach_support`` (``clip_grad_norm_``,
``clip_grad_value_``) accept only ``type(t) in _foreach_supported_types``, i.e. plain tensors and
parameters. A torch_tpu tensor is a plain tensor of a privateuse1 device, which is in torch's foreach
device list: on a chip, ``torch.optim.AdamW()`` takes the foreach step. A simulated tensor is a
:class:`~transformers_tpu_ext.testing.device.TpuTensor` (a parameter on the simulator *is* one), so
without this module the simulator would run the single-tensor step where a chip runs the foreach one:
a different code path than the chip's, hiding what only the chip's path does (and showing what only
the other one does).

:func:`register` appends :class:`TpuTensor` to both lists, once.
"""

from __future__ import annotations

from .device import TpuTensor

__all__ = ["register", "registered"]


def _lists() -> list[list[type]]:
    import torch.optim.optimizer as optimizer
    import torch.utils._foreach_utils as foreach_utils

    return [optimizer._foreach_supported_types, foreach_utils._foreach_supported_types]


def register() -> None:
    """Let simulated TPU tensors take torch's foreach implementations, as a chip's tensors do."""
    for types in _lists():
        if TpuTensor not in types:
            types.append(TpuTensor)


def registered() -> bool:
    """Whether :func:`register` ran (both lists hold :class:`TpuTensor`)."""
    return all(TpuTensor in types for types in _lists())

