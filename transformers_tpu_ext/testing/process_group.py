"""The simulated ``tpu_dist`` process-group backend: gloo on the tpu tensors' CPU data.

torch_tpu registers the ``torch.distributed`` backends ``"tpu_dist"`` and ``"tpu"``, and Transformers
maps the ``tpu`` device to ``"tpu_dist"`` (``DISTRIBUTED_BACKEND_MAP``) when it initialises
``torch.distributed`` for ``DistributedConfig(tp_size=N)``. The simulator registers both names at
install; each group they create is a ``ProcessGroupGloo``.

A collective on tpu tensors (``dist.all_reduce``, DTensor's functional collectives) is an operator
like any other to the simulator's dispatcher: it runs on the tensors' CPU data, which gloo reduces or
gathers in place, so the result is in the tpu tensors given, as with a device backend. Because the
data reaches gloo as CPU tensors, the groups serve ``cpu`` tensors too, which a real ``tpu_dist`` may
not.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BACKENDS", "register"]

#: The backend names torch_tpu registers.
BACKENDS = ("tpu_dist", "tpu")


def _create(store: Any, rank: int, world_size: int, timeout: Any) -> Any:
    from torch.distributed import ProcessGroupGloo

    return ProcessGroupGloo(store, rank, world_size, timeout)


def register() -> bool:
    """Register :data:`BACKENDS` with ``torch.distributed`` (idempotent); False where it cannot."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return False
    for name in BACKENDS:
        if name not in dist.Backend.backend_list:
            dist.Backend.register_backend(name, _create, devices=["tpu", "cpu"])
    return True
