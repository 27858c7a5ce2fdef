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
- **Optimizer.** A compiled program is keyed by Python scalars as well as shapes: during the step
  of Adam/AdamW (and only of those: the implementations proven exact at every learning rate), the
  learning rate and the step count are device tensors (:func:`optimizer_plan`); every other
  optimizer runs as the user made it.
- **Mixed precision.** ``fp16=True`` / ``mixed_precision="fp16"`` trains in bf16 on TPU, with one
  warning naming ``bf16=True`` (:func:`mixed_precision`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "COMPILE_BACKEND",
    "PROCESS_GROUP_BACKENDS",
    "UnsupportedBackend",
    "adapt_compile",
    "mixed_precision",
    "ADAPT",
    "EXACT_OPTIMIZERS",
    "LEAVE",
    "OptimizerPlan",
    "optimizer_plan",
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


#: Optimizers whose step the plugin may adapt, by exact class (``module.qualname``; a subclass may
#: change the update, so it is not proven). Adam/AdamW: the fused kernel multiplies by a tensor
#: learning rate, and the capturable foreach step computes its step size as
#: ``1 / ((beta1**t - 1) / lr)``, which IEEE arithmetic takes to -0 at lr 0 (parameters unchanged,
#: tested bitwise at lr 0 and at the end of a linear decay). The capturable single-tensor step
#: divides by the learning rate (NaN where a second moment is 0, pytorch#97004): never chosen. An
#: optimizer joins this list with its own lr-0 / end-of-decay test.
EXACT_OPTIMIZERS: tuple[str, ...] = ("torch.optim.adam.Adam", "torch.optim.adamw.AdamW")

#: The actions of an :class:`OptimizerPlan`.
ADAPT, LEAVE = "adapt", "leave"


@dataclass(frozen=True)
class OptimizerPlan:
    """How the step of one param group runs on TPU.

    ``action`` is ``"adapt"`` or ``"leave"`` (the step runs as the user made it). An adapted group
    holds, during ``step()`` only, a device tensor learning rate filled from its float
    (``tensor_lr``) and the values of ``settings`` (e.g. ``{"capturable": True, "foreach": True}``);
    outside the step it is what the user made (a float ``lr``, their ``capturable`` and ``foreach``),
    so schedules, logs and checkpoints see what a CPU run has. ``compile_step``: compiling the step
    with the ``tpu`` backend is exact for this group. ``reason`` is the log line and the docs' cell.
    """

    action: str
    reason: str
    tensor_lr: bool = False
    settings: Mapping[str, Any] = field(default_factory=dict)
    compile_step: bool = False


def optimizer_plan(kind: str, group: Mapping[str, Any], *, sharded: bool = False, on_device: bool = True) -> OptimizerPlan:
    """How the step of a param group of the optimizer class ``kind`` (``module.qualname``) runs on TPU.

    ``group`` holds the group's hyperparameters as they are (``lr``, ``foreach``, ``fused``,
    ``differentiable``, ...); ``sharded``: its parameters are DTensors (FSDP2, tensor parallelism);
    ``on_device``: every parameter of the group is a dense floating-point tensor on the chip.

    A compiled program is keyed by Python scalars: a scheduled float learning rate recompiles a
    compiled step at every step. A device tensor learning rate is an input instead, but only some
    step implementations are exact with it at every learning rate, 0 included (the start of a
    warm-up, the end of a linear decay): those are adapted; every other step runs as made.
    """
    if sharded:
        return OptimizerPlan(LEAVE, "sharded (DTensor) parameters: DTensor has no rule for the tensor-learning-rate kernels")
    if kind not in EXACT_OPTIMIZERS:
        return OptimizerPlan(LEAVE, "not an optimizer known to be exact with a tensor learning rate (only torch.optim.Adam and AdamW are)")
    if group.get("differentiable"):
        return OptimizerPlan(LEAVE, "differentiable=True: autograd through the step")
    if isinstance(group.get("lr"), bool) or not isinstance(group.get("lr"), (int, float)):
        return OptimizerPlan(LEAVE, "the learning rate is not a Python number (your own tensor)")
    if not on_device:
        return OptimizerPlan(LEAVE, "parameters that are not all dense floating-point tensors on the TPU")
    if group.get("fused"):
        return OptimizerPlan(ADAPT, "fused=True: the fused kernel multiplies by a tensor learning rate", tensor_lr=True)
    if group.get("foreach") is False:
        return OptimizerPlan(
            LEAVE,
            "foreach=False: a single-tensor step with a tensor learning rate divides by it (NaN at lr 0); "
            "a compiled step would recompile when the learning rate changes, so it is not compiled "
            "(pass foreach=True or fused=True)",
        )
    return OptimizerPlan(
        ADAPT,
        "foreach (torch's default on a device): capturable, with a tensor learning rate and step count",
        tensor_lr=True,
        settings={"foreach": True, "capturable": True},
        compile_step=True,
    )


#: The warning of :func:`mixed_precision` (one line, naming what to write instead).
FP16_NOTE = (
    "fp16 mixed precision (fp16=True / mixed_precision='fp16') trains in bf16 on TPU: a TPU computes in bf16 "
    "and has no fp16 loss scaling (GradScaler), and bf16 keeps fp32's range so it needs none; "
    "pass bf16=True (mixed_precision='bf16') to say so and silence this warning"
)


def mixed_precision(requested: str | None, *, on_tpu: bool, deepspeed: bool = False) -> tuple[str | None, str | None]:
    """The mixed precision to train with, given the one Accelerate resolved (argument or
    ``ACCELERATE_MIXED_PRECISION``), and the warning when it differs.

    On TPU, ``"fp16"`` becomes ``"bf16"``: upstream refuses fp16 on any device it does not list
    ("fp16 mixed precision requires a device in (...)"), torch_tpu has no GradScaler kernels, and a
    GPU script's ``fp16=True`` asks for 16-bit mixed precision, which on a TPU is bf16. Everything
    else (``"no"``, ``"bf16"``, ``"fp8"``, DeepSpeed's own config, any other device) is left as requested.
    """
    if on_tpu and not deepspeed and isinstance(requested, str) and requested.lower() == "fp16":
        return "bf16", FP16_NOTE
    return requested, None
