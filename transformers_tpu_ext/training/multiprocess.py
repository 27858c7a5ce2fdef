"""Runs of several processes, one per chip: the decisions, as plain functions over plain data.

The patches ``accelerate_operations`` (gathers) and ``torch_optimizer`` (the replica check at an
optimizer's first step) only glue these into Accelerate and PyTorch. See ``docs/training.md``.

- **Gathers.** torch_tpu's process group all-gathers into an output that is ``world x input`` on
  dim 0 (``shared/reference/torch_tpu-0.2.0-internals.md`` Q7). Accelerate's ``gather`` (behind
  ``gather_for_metrics``, ``pad_across_processes`` and the Trainer's evaluation) hands any backend
  but gloo a flat 1-D output of ``world x numel`` elements: right for NCCL, refused by ``tpu_dist``
  for every input of two or more dimensions. On the TPU process group a TPU tensor is gathered into
  an output of the shape ``tpu_dist`` wants, which is also the shape upstream returns.
- **Replicas at the first step.** ``accelerator.prepare(model)`` already refuses a model no
  data-parallel wrapper synchronises; a model moved to the chip by hand never goes through it. An
  optimizer whose trainable TPU parameters are neither in a ``DistributedDataParallel`` nor sharded
  (DTensor: FSDP2, tensor parallelism) would update replicas that diverge: refused at its first
  ``step()``, before any update.
"""

from __future__ import annotations

from collections.abc import Sequence

from .policy import PROCESS_GROUP_BACKENDS

__all__ = [
    "GATHER_TPU",
    "GATHER_UPSTREAM",
    "REPLICA_CHECK_PATCH",
    "gather_output_shape",
    "gather_path",
    "step_replica_problem",
]

#: :func:`gather_path`'s answers: the TPU's own all-gather, or Accelerate's code untouched.
GATHER_TPU = "tpu"
GATHER_UPSTREAM = "upstream"

#: The patch that checks replicas at the first step (its name disables it).
REPLICA_CHECK_PATCH = "torch_optimizer"


def gather_path(*, backend: str | None, device_type: str | None, tensor_device_type: str | None) -> tuple[str, str]:
    """How to all-gather one tensor in Accelerate's ``gather``, and why.

    ``backend`` is Accelerate's process-group backend (``PartialState.backend``), ``device_type``
    the type of Accelerate's device, ``tensor_device_type`` the tensor's. Returns
    ``(GATHER_TPU, reason)`` for a TPU tensor on the TPU process group, else
    ``(GATHER_UPSTREAM, reason)``.
    """
    if backend not in PROCESS_GROUP_BACKENDS:
        return GATHER_UPSTREAM, f"the process group is {backend!r}, not the TPU's"
    if device_type != "tpu" or tensor_device_type != "tpu":
        return GATHER_UPSTREAM, f"the tensor is on {tensor_device_type!r} and the process's device is {device_type!r}"
    return GATHER_TPU, "tpu_dist all-gathers into an output of world x input on dim 0"


def gather_output_shape(world: int, shape: Sequence[int]) -> tuple[int, ...]:
    """The output of an all-gather of a tensor of ``shape`` over ``world`` processes (rank 0's rows
    first): ``world x input`` on dim 0; a 0-dim tensor counts as one row. Upstream's
    ``view(-1, *shape[1:])`` of its flat output has the same shape."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    rows, rest = (shape[0], tuple(shape[1:])) if len(shape) else (1, ())
    return (world * int(rows), *rest)


def step_replica_problem(*, world_size: int, backend: str | None, trainable: int, unsynchronised: int, optimizer: str) -> str | None:
    """Why an optimizer's step would update replicas that diverge, or ``None``.

    ``world_size`` and ``backend`` describe the initialised process group (``world_size`` 1 when
    there is none); ``trainable`` counts the optimizer's parameters that require a gradient and live
    on the TPU, ``unsynchronised`` those of them neither in a ``DistributedDataParallel`` nor
    sharded (DTensor). ``optimizer`` is the optimizer's class name.
    """
    if world_size <= 1 or backend not in PROCESS_GROUP_BACKENDS or unsynchronised == 0:
        return None
    return (
        f"{world_size} processes would train unsynchronised replicas: {unsynchronised} of the {trainable} "
        f"trainable TPU parameters of this {optimizer} are in no DistributedDataParallel or FSDP2 model, so "
        "their gradients are never all-reduced and every process would update its own copy. Pass the model to "
        "accelerator.prepare() (or wrap it in DistributedDataParallel) before training. If your code "
        "all-reduces the gradients itself, turn this check off with "
        f"TRANSFORMERS_TPU_EXT_DISABLE={REPLICA_CHECK_PATCH}."
    )
