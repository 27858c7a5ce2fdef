"""Transformers: the ``Trainer`` keeps TPU shapes static and its checkpoints complete.

On TPU (the Trainer's device is ``tpu``), and only there:

- ``Trainer._get_dataloader`` (behind the train, eval and test loaders): the loader's collate
  function is wrapped in :class:`transformers_tpu_ext.training.BucketCollator`, with the facts of the
  Trainer's model and loop (:mod:`.facts`), so batches come in a few sequence-length buckets where
  :func:`transformers_tpu_ext.training.buckets.plan_batch` proves it exact, and a partial training
  batch is completed with ignored rows (evaluation keeps its real rows); other batches are left as
  the collator made them. ``TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS=0`` turns it off.
- ``Trainer.prediction_step`` (also behind ``Seq2SeqTrainer``'s, which calls it): the per-position
  outputs and labels of a padded evaluation batch are cut back to the collator's lengths, so
  ``evaluate()`` / ``predict()`` return a CPU run's shapes. ``Trainer._track_num_input_tokens``:
  ``include_num_input_tokens_seen`` counts the collator's tokens (the batch cropped back to its
  rows, lengths and own mask), not the padding.
- ``Trainer._save_rng_state`` / ``_load_rng_state``: the TPU's random state is saved next to the
  others (``tpu_state[_<rank>].pth``, a host tensor: the file loads without torch_tpu) and restored
  on resume, through the public ``torch.tpu.default_generators`` (``torch.tpu.get_rng_state`` is
  internal to torch_tpu). Apart from it, each rank's sequence buckets already used
  (``tpu_buckets[_<rank>].json``), restored with the optimizer (``_load_optimizer_and_scheduler``),
  before the first batch of the resumed run is padded: it pads its batches as the interrupted run
  did (a bucket's reuse depends on the buckets used before), so dropout draws the same numbers. Each
  file is written under its own guard: a failure to save one does not lose the other. (Checkpoints
  of earlier releases kept the buckets in ``tpu_state*.pth``; they are still read.)
- ``Trainer._save_checkpoint`` and ``Trainer.save_model``: with several processes, every rank
  synchronises its chip first (``torch.accelerator.synchronize()``), so the host reads the main
  process alone does while saving never wait on work the other ranks have not issued.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, Callable

from .. import backend
from . import buckets as batch_buckets
from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps, fail_safe, warn_once

NAME = "transformers_trainer"
TARGET = "transformers.trainer"
DISTRIBUTION = "transformers"
RELIES_ON = (
    # _bucket reads args[2] / batch_size=, args[4] / is_training=.
    Signature(
        "Trainer._get_dataloader",
        ("batch_size", "is_training"),
        positional=("dataset", "description", "batch_size", "sampler_fn", "is_training"),
    ),
    Signature("Trainer.prediction_step", ("inputs",), positional=("model", "inputs")),
    Signature("Trainer._track_num_input_tokens", ("inputs",), positional=("inputs",)),  # in every supported release
    Signature("Trainer._save_rng_state", ("output_dir",), positional=("output_dir",)),
    Signature("Trainer._load_rng_state", ("checkpoint",), positional=("checkpoint",)),
    Signature("Trainer._load_optimizer_and_scheduler", ("checkpoint",), positional=("checkpoint",)),
    Signature("Trainer._save_checkpoint"),
    Signature("Trainer.save_model"),
    Attribute("Trainer.compute_loss"),  # the batch facts tell upstream's loss and prediction step from others
    Attribute("TrainingArguments.device"),
    Attribute("TrainingArguments.world_size"),
    Attribute("TrainingArguments.process_index"),
)

logger = logging.getLogger("transformers_tpu_ext")

_wraps = Wraps()

#: Saved next to each checkpoint's other random states (``tpu_state_<rank>.pth`` with several processes).
STATE_FILE = "tpu_state.pth"
#: The sequence buckets already used (``tpu_buckets_<rank>.json`` with several processes).
BUCKETS_FILE = "tpu_buckets.json"
BUCKETS = "_tpu_ext_bucket_lengths"
#: The training collator (a ``BucketCollator``) under the train loader: the first batch's check of a declared
#: loss (``patch_trainer_losses``) pads with it.
TRAIN_COLLATOR = "_tpu_ext_train_collator"


def _torch() -> Any:
    return sys.modules["torch"]


def trains_on_tpu(trainer: Any) -> bool:
    args = getattr(trainer, "args", None)
    return backend.tpu_available() and backend.is_tpu(getattr(args, "device", None))


def _pad_token_id(trainer: Any) -> int | None:
    for owner in (getattr(trainer, "processing_class", None), getattr(getattr(trainer, "model", None), "config", None)):
        pad = getattr(owner, "pad_token_id", None)
        if isinstance(pad, int):
            return pad
    return None


def _after(what: str, function: Callable[..., Any], *args: Any) -> None:
    """Run our own post-processing; a failure of ours is one warning, never the user's error."""
    try:
        function(*args)
    except Exception as error:  # noqa: BLE001
        warn_once(f"{what} failed ({type(error).__name__}: {error}); continuing without it")


def _get_dataloader(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for ``_get_dataloader(dataset, description, batch_size, sampler_fn=None, is_training=False, ...)``."""
    loader = wrapped(*args, **kwargs)
    if trains_on_tpu(instance):
        _after("bucketing the Trainer's batches", _bucket, instance, loader, args, kwargs)
    return loader


def _bucket(instance: Any, loader: Any, args: tuple, kwargs: dict) -> None:
    settings = batch_buckets.settings()
    from .collator import BucketCollator
    from .facts import model_facts, source_facts

    # Accelerate's DataLoaderShard adapts a DataLoader of its own, which is the one that collates.
    loader = vars(loader).get("base_dataloader", loader)
    collate = getattr(loader, "collate_fn", None)
    if not settings.enabled or collate is None or isinstance(collate, BucketCollator):
        return
    batch_size = args[2] if len(args) > 2 else kwargs.get("batch_size")
    is_training = bool(args[4] if len(args) > 4 else kwargs.get("is_training", False))
    used = instance.__dict__.setdefault(BUCKETS, set())
    loader.collate_fn = collator = BucketCollator(
        collate,
        batch_size=batch_size,
        pad_token_id=_pad_token_id(instance),
        pad_rows=is_training,
        settings=settings,
        used=used,
        model=model_facts(instance.model),
        source=source_facts(instance, collate, is_training),
    )
    if is_training:
        instance.__dict__[TRAIN_COLLATOR] = collator


def _prediction_step(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for ``prediction_step(model, inputs, prediction_loss_only, ignore_keys=None)``: the
    per-position outputs and labels of a padded batch, cut back to the collator's lengths."""
    from .collator import PaddedBatch, original_of

    inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
    result = wrapped(*args, **kwargs)
    if not isinstance(inputs, PaddedBatch) or not isinstance(result, tuple) or len(result) != 3:
        return result
    original = original_of(inputs)
    if original is None:
        warn_once("an evaluation batch lost what it was before padding: its outputs keep the padded length")
        return result
    if not original["cut"]:
        return result
    loss, logits, labels = result
    try:
        return loss, _cut(logits, original["cut"]), _cut(labels, original["cut"])
    except Exception as error:  # noqa: BLE001 - ours: the padded outputs, with a warning
        warn_once(f"cutting evaluation outputs back failed ({type(error).__name__}: {error})")
        return result


def _cut(value: Any, sides: tuple[tuple[int, int], ...]) -> Any:
    """Every tensor whose axis 1 has a side's padded length, cut back to that side's length."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        length = batch_buckets.cut_length(value.shape, sides)
        return value if length is None else value[:, :length]
    if isinstance(value, (tuple, list)):
        return type(value)(_cut(v, sides) for v in value)
    return value


def _track_num_input_tokens(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for ``_track_num_input_tokens(inputs)``: the collator's tokens are counted, not the padding."""
    from .collator import crop, original_of

    inputs = args[0] if args else kwargs.get("inputs")
    original = original_of(inputs)
    if original is None:
        return wrapped(*args, **kwargs)
    return wrapped(crop(inputs, original))


def _rank_file(trainer: Any, directory: str, name: str) -> str:
    world = getattr(trainer.args, "world_size", 1)
    stem, dot, suffix = name.rpartition(".")
    if world > 1:
        name = f"{stem}_{trainer.args.process_index}{dot}{suffix}"
    return os.path.join(directory, name)


def _save_rng_state(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    if trains_on_tpu(instance):
        output_dir = args[0] if args else kwargs["output_dir"]
        _after("saving the TPU random state", _save_tpu_rng, instance, output_dir)
        _after("saving the sequence buckets used", _save_buckets, instance, output_dir)
    return result


def _save_tpu_rng(trainer: Any, output_dir: str) -> None:
    state = backend.rng_state()
    if isinstance(state, _torch().Tensor):
        state = state.cpu()  # loadable where torch_tpu is not installed
    _torch().save({"tpu": state}, _rank_file(trainer, output_dir, STATE_FILE))


def _save_buckets(trainer: Any, output_dir: str) -> None:
    used = sorted(int(length) for length in trainer.__dict__.get(BUCKETS, ()))
    with open(_rank_file(trainer, output_dir, BUCKETS_FILE), "w") as file:
        json.dump({"bucket_lengths": used}, file)


def _load_rng_state(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    checkpoint = args[0] if args else kwargs.get("checkpoint")
    if checkpoint is None or not trains_on_tpu(instance):
        return result
    _after("restoring the TPU random state", _load_tpu_rng, instance, checkpoint)
    return result


def _load_tpu_rng(trainer: Any, checkpoint: str) -> None:
    path = _rank_file(trainer, checkpoint, STATE_FILE)
    if os.path.isfile(path):
        backend.set_rng_state(_torch().load(path, weights_only=True, map_location="cpu")["tpu"])
    else:
        warn_once(f"no TPU random state in {checkpoint}: random numbers on the TPU will not continue the interrupted run's")


def _load_optimizer_and_scheduler(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Resuming: the buckets used before the checkpoint are known before the first batch is padded."""
    result = wrapped(*args, **kwargs)
    checkpoint = args[0] if args else kwargs.get("checkpoint")
    if checkpoint is not None and trains_on_tpu(instance):
        _after("restoring the sequence buckets", _load_buckets, instance, checkpoint)
    return result


def _load_buckets(trainer: Any, checkpoint: str) -> None:
    path, legacy = _rank_file(trainer, checkpoint, BUCKETS_FILE), _rank_file(trainer, checkpoint, STATE_FILE)
    if os.path.isfile(path):
        with open(path) as file:
            lengths = json.load(file)["bucket_lengths"]
    elif os.path.isfile(legacy):  # written by an earlier release, next to the random state
        lengths = _torch().load(legacy, weights_only=True, map_location="cpu").get("bucket_lengths", ())
    else:
        return
    used = trainer.__dict__.setdefault(BUCKETS, set())
    used.clear()
    used.update(int(length) for length in lengths)


def _synchronized(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    if trains_on_tpu(instance) and getattr(instance.args, "world_size", 1) > 1:
        _torch().accelerator.synchronize()
    return wrapped(*args, **kwargs)


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "Trainer._get_dataloader", fail_safe(_get_dataloader))
    _wraps.wrap(module, "Trainer.prediction_step", fail_safe(_prediction_step))
    if hasattr(module.Trainer, "_track_num_input_tokens"):  # Transformers >= 4.57
        _wraps.wrap(module, "Trainer._track_num_input_tokens", fail_safe(_track_num_input_tokens))
    _wraps.wrap(module, "Trainer._save_rng_state", fail_safe(_save_rng_state))
    _wraps.wrap(module, "Trainer._load_rng_state", fail_safe(_load_rng_state))
    _wraps.wrap(module, "Trainer._load_optimizer_and_scheduler", fail_safe(_load_optimizer_and_scheduler))
    _wraps.wrap(module, "Trainer._save_checkpoint", fail_safe(_synchronized))
    _wraps.wrap(module, "Trainer.save_model", fail_safe(_synchronized))


def revert() -> None:
    _wraps.unwrap_all()
