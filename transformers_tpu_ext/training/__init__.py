"""Training: unmodified ``Trainer`` and Accelerate code trains on the TPU, one chip or many.

The decisions (pure modules, no torch, no Transformers):

- :mod:`.policy`: the device and the distributed set-up (process group, replica checks, DDP/FSDP),
  the compile backend, which optimizer steps are adapted (``optimizer_plan``);
- :mod:`.batch_facts`: the facts a batch plan is decided from (``ModelFacts``, ``SourceFacts``) and the plan;
- :mod:`.buckets`: the static shapes of training batches (sequence ladder, padded rows, what is padded
  with what, and which batches are left alone: ``plan_batch``);
- :mod:`.multiprocess`: runs of several processes (gathers on ``tpu_dist``, the replica check at an
  optimizer's first step);
- :mod:`.paths`: the tables of docs/training.md, rendered from the predicates.

The runtime: :mod:`.facts` reads the predicates' plain facts off models, collators and Trainers;
:mod:`.optimizer` runs an optimizer's step as its plan says. The public helpers (:mod:`.collator`):
:class:`BucketCollator` (batches of static shapes, :class:`PaddedBatch` and :func:`original_of`: what a
padded batch was); :mod:`.warm_up`: :func:`warmup` (compile every bucket before training).

The glue, one patch per target: ``patch_accelerate_state`` (``PartialState`` finds the TPU),
``patch_accelerate_dataclasses`` (``TorchDynamoPlugin(backend="tpu")``), ``patch_accelerate_prepare``
(no unsynchronised replicas; the optimizer step adapted), ``patch_accelerate_operations`` (gathers on
``tpu_dist``), ``patch_accelerate_rng`` (``save_state()`` / ``load_state()`` and ``synchronize_rng_state``
keep the TPU's random state through the public generators), ``patch_torch_ddp`` (DDP of a TPU module), ``patch_torch_optimizer`` (no step of
replicas nothing synchronises), ``patch_transformers_training_args`` (``torch_compile=True``) and
``patch_transformers_trainer`` (bucketed data loaders, evaluation outputs cut back, complete
checkpoints); ``patch_recompile_guard_train`` runs each training step inside the recompile guard (``compilation``). See ``docs/training.md``.
"""

from __future__ import annotations

from .collator import BucketCollator, PaddedBatch, original_of
from .warm_up import warmup

__all__ = ["BucketCollator", "PaddedBatch", "original_of", "warmup"]
