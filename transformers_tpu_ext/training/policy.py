"""Training on TPU: the decisions, as plain functions over plain data (no torch, no transformers).

The patches (``patch_accelerate_state``, ``patch_accelerate_dataclasses``, ``patch_accelerate_prepare``,
``torch_ddp.py``, ``transformers_training_args.py``, ``transformers_trainer.py``) only glue these
into Accelerate and Transformers. See ``docs/training.md``.

- **Process group.** One process per chip, every process bound to ``tpu:0``; the collectives go
  through ``tpu_dist`` (alias ``tpu``). A backend that cannot reduce TPU tensors is refused.
- **Replicas.** Several processes that each train a model no data-parallel wrapper synchronises
  would diverge silently: refused, with what to do.
- **Compile.** ``torch_compile=True`` means the ``tpu`` backend on TPU; backends and modes the TPU
  backend rejects are adapted with one warning.
- **Optimizer.** A compiled program is keyed by Python scalars as well as shapes: the learning rate
  (changed by every schedule step) and Adam's step count become device tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "COMPILE_BACKEND",
    "PROCESS_GROUP_BACKENDS",
    "UnsupportedBackend",
    "adapt_compile",
    "compiles_optimizer_step",
    "optimizer_overrides",
    "process_group_backend",
    "replica_problem",
    "wrapper_kind",
]

#: The process-group backends torch_tpu registers (``tpu`` is an alias of ``tpu_dist``).
PROCESS_GROUP_BACKENDS: tuple[str, ...] = ("tpu_dist", "tpu")
#: The compile backend torch_tpu registers.
COMPILE_BACKEND = "tpu"

_LAUNCH_HINT = (
    "launch one process per chip with `transformers-tpu launch --nproc_per_node=N script.py` "
    "(or torchrun after torch.tpu.distributed.set_tpu_launch_env())"
)


class UnsupportedBackend(ValueError):
    """A process-group backend that cannot reduce TPU tensors was requested."""


def process_group_backend(requested: str | None) -> str:
    """The process-group backend for TPU training, given the one the user asked for (or ``None``).

    Raises :class:`UnsupportedBackend` (a ``ValueError``) for a backend that cannot reduce TPU
    tensors (``nccl``, ``gloo``, ...).
    """
    if requested is None or requested in PROCESS_GROUP_BACKENDS:
        return requested or PROCESS_GROUP_BACKENDS[0]
    raise UnsupportedBackend(
        f"ddp_backend/backend={requested!r} cannot reduce TPU tensors: on TPU the process group is "
        f"'tpu_dist'. Leave the backend unset (or pass 'tpu_dist')."
    )


def wrapper_kind(class_names: Iterable[str], has_dtensor: bool) -> str | None:
    """What synchronises a prepared model's replicas, from its wrappers' class names (outermost first).

    ``"ddp"`` (DistributedDataParallel), ``"fsdp"`` (FSDP2: ``fully_shard`` classes, or DTensor
    parameters such as tensor parallelism), ``"fsdp1"`` (FullyShardedDataParallel), or ``None``.
    """
    for name in class_names:
        if name == "DistributedDataParallel":
            return "ddp"
        if name == "FullyShardedDataParallel":
            return "fsdp1"
        if name.startswith("FSDP"):  # fully_shard's dynamic FSDP<Module> classes
            return "fsdp"
    return "fsdp" if has_dtensor else None


def replica_problem(
    *,
    world_size: int,
    num_processes: int,
    wrapper: str | None,
    trainable: bool,
) -> str | None:
    """Why training this prepared model would run replicas that silently diverge, or ``None``.

    ``world_size`` is what the launcher announced (``WORLD_SIZE``), ``num_processes`` what Accelerate
    set up, ``wrapper`` what :func:`wrapper_kind` found, ``trainable`` whether any parameter
    requires a gradient.
    """
    if not trainable:
        return None
    if world_size > 1 and num_processes == 1:
        return (
            f"{world_size} processes were launched (WORLD_SIZE={world_size}) but Accelerate set up a "
            "single-process run: every process would train its own copy of the model on the whole "
            f"dataset. Start the processes with LOCAL_RANK set: {_LAUNCH_HINT}."
        )
    if num_processes > 1 and wrapper is None:
        return (
            f"{num_processes} processes would train unsynchronised replicas: the model is not wrapped "
            "for data parallelism (DDP or FSDP2) on the 'tpu_dist' process group, so gradients would "
            "never be all-reduced. Let Accelerate prepare the model (accelerator.prepare(model) / "
            "Trainer) in a run started with "
            f"{_LAUNCH_HINT}, without device_map or ACCELERATE_BYPASS_DEVICE_MAP."
        )
    if num_processes > 1 and wrapper == "fsdp1":
        return (
            "FSDP1 (FullyShardedDataParallel) is not supported on TPU: use FSDP2 "
            "(fsdp_version=2 in the FSDP plugin / fsdp_config, i.e. torch's fully_shard) or DDP."
        )
    return None


def adapt_compile(backend: str | None, mode: str | None) -> tuple[str, str | None, list[str]]:
    """The ``(backend, mode)`` to compile with on TPU, and a note for each change made.

    ``None`` means "not set": the ``tpu`` backend. The TPU backend rejects inductor (and other GPU
    backends) and any ``mode`` but ``"default"``: those are replaced, each with a note.
    """
    notes: list[str] = []
    wanted = (backend or "").lower()
    if wanted in ("", COMPILE_BACKEND):
        new_backend = COMPILE_BACKEND
    else:
        new_backend = COMPILE_BACKEND
        notes.append(
            f"torch_compile_backend={backend!r} cannot compile TPU graphs; using the {COMPILE_BACKEND!r} backend"
        )
    new_mode = mode
    if mode not in (None, "default"):
        new_mode = None
        notes.append(f"torch_compile_mode={mode!r} is not supported by the TPU compile backend; using the default mode")
    return new_backend, new_mode, notes


#: Optimizer defaults that move the per-step Python scalars onto the device, when the class has them.
_CAPTURABLE = "capturable"


def optimizer_overrides(defaults: Mapping[str, Any], *, lr_is_tensor: bool, sharded: bool = False) -> dict[str, Any]:
    """The per-group settings that keep an optimizer step free of changing Python scalars.

    - ``capturable=True`` where the optimizer offers it (Adam, AdamW, ...): the step count and bias
      corrections stay device tensors instead of host floats.
    - a tensor learning rate (``{"lr": "tensor"}``) where the optimizer is capturable, so a schedule
      updates it in place (``LRScheduler`` fills a tensor ``lr``) instead of passing a new float.

    Optimizers without ``capturable`` (SGD, Adafactor, ...) are left as they are, and so are the
    optimizers of sharded (FSDP2, DTensor) parameters: DTensor has no sharding rule for the tensor-lr
    overloads of the fused kernels.
    """
    if _CAPTURABLE not in defaults or sharded:
        return {}
    overrides: dict[str, Any] = {}
    if not defaults.get(_CAPTURABLE):
        overrides[_CAPTURABLE] = True
    if not lr_is_tensor:
        overrides["lr"] = "tensor"
    return overrides


def compiles_optimizer_step(defaults: Mapping[str, Any]) -> bool:
    """Whether ``torch_compile`` should compile this optimizer's step with the ``tpu`` backend.

    Capturable, non-fused optimizers: their step is many small per-parameter kernels that one
    compiled program replaces, and (capturable, tensor learning rate) nothing in it changes from a
    step to the next. A fused optimizer's step is already one kernel (TorchDynamo runs it eagerly).
    """
    return bool(defaults.get(_CAPTURABLE)) and not defaults.get("fused")
