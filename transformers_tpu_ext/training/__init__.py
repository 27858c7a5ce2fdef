"""Training: unmodified ``Trainer`` and Accelerate code trains on the TPU, one chip or many.

The decisions (pure modules, no torch, no Transformers):

- :mod:`.policy`: the device and the distributed set-up (process group, replica checks, DDP/FSDP),
  the compile backend, which optimizer steps are adapted (``optimizer_plan``);
- :mod:`.batch_facts`: the facts a batch plan is decided from (``ModelFacts``, ``SourceFacts``) and the plan;
- :mod:`.buckets`: the static shapes of training batches (sequence ladder, padded rows, what is padded
  with what, and which batches are left alone: ``plan_batch``); :mod:`.bucket_settings` (the ladder and the
  variables), :mod:`.layouts` (a library trainer's own keys, grouped into the lengths they are padded to);
- :mod:`.losses`: the library trainers' losses read and proven to ignore padding (``library_loss``), and
  :func:`ignores_padding`, the way to declare a loss of your own padding-safe;
- :mod:`.multiprocess`: runs of several processes (gathers on ``tpu_dist``, the replica check at an
  optimizer's first step);
- :mod:`.paths`: the tables of docs/training.md, rendered from the predicates.

The runtime: :mod:`.facts` reads the predicates' plain facts off models, collators and Trainers;
:mod:`.optimizer` runs an optimizer's step as its plan says. The public helpers (:mod:`.collator`):
:class:`BucketCollator` (batches of static shapes, :class:`PaddedBatch` and :func:`original_of`: what a
padded batch was); :mod:`.warm_up`: :func:`warmup` (compile every bucket before training; :mod:`.warm_state`
puts back what its steps change); :mod:`.host_counts` (count-shaped tensors of a library trainer's step on
the host).

The glue, one patch per target: ``patch_accelerate_state`` (``PartialState`` finds the TPU),
``patch_accelerate_dataclasses`` (``TorchDynamoPlugin(backend="tpu")``), ``patch_accelerate_prepare``
(no unsynchronised replicas; the optimizer step adapted), ``patch_accelerate_operations`` (gathers on
``tpu_dist``), ``patch_accelerate_rng`` (``save_state()`` / ``load_state()`` and ``synchronize_rng_state``
keep the TPU's random state through the public generators), ``patch_torch_ddp`` (DDP of a TPU module), ``patch_torch_optimizer`` (no step of
replicas nothing synchronises), ``patch_transformers_training_args`` (``torch_compile=True``) and
``patch_transformers_trainer`` (bucketed data loaders, evaluation outputs cut back, complete
checkpoints); ``patch_trainer_losses`` (a library trainer's count-shaped tensors on the host, a loss declared
with :func:`ignores_padding` checked on its first batch); ``patch_recompile_guard_train`` runs each training
step inside the recompile guard (``compilation``). See ``docs/training.md``.
"""

from __future__ import annotations

from .collator import BucketCollator, PaddedBatch, original_of
from .losses import ignores_padding
from .warm_up import warmup

__all__ = ["BucketCollator", "PaddedBatch", "ignores_padding", "original_of", "warmup"]
