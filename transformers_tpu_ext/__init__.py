"""transformers-tpu-ext: plain Hugging Face Transformers code, correct and fast on Cloud TPUs.

Importing this package activates the plugin; so does merely having it installed (torch calls its
``torch.backends`` entry point at the end of ``import torch``). On a machine without a TPU it
changes nothing. See ``docs/architecture.md``.
"""

from __future__ import annotations

from typing import Any

from . import log as _log

_log.setup()  # before anything logs: the plugin's logger follows Transformers' verbosity

from ._version import __version__  # noqa: E402
from .activation import (  # noqa: E402
    TransformersTPUExtWarning,
    activate,
    active_patches,
    deactivate,
    is_active,
    skipped_patches,
    status,
)

__all__ = [
    "TransformersTPUExtWarning",
    "__version__",
    "activate",
    "active_patches",
    "deactivate",
    "is_active",
    "skipped_patches",
    "status",
    "warmup",
]


#: The works :func:`warmup` compiles ahead (each capability's warm-up is in its own folder:
#: ``generation/warm_up.py``, ``serving/warm_up.py``, ``training/warm_up.py``, ``inference/warm_up.py``).
WORKS = ("generate", "serve", "train", "infer")


def _is_trainer(target: Any) -> bool:
    return any(cls.__name__ == "Trainer" for cls in type(target).__mro__)


def warmup(target: Any, work: str | None = None, **options: Any) -> Any:
    """Precompile ``work`` for ``target`` (a model, or a ``Trainer`` for ``"train"``): one warmup for
    every work, ``"generate"`` (the default for a model), ``"serve"``, ``"train"`` (the default for a ``Trainer``),
    ``"infer"`` (batch inference: a model, a pipeline, a ``SentenceTransformer`` or an lm-eval ``HFLM``).
    Each tells the recompile guard that its work is warmed up; see ``docs/compile-cache.md``.

    ``warmup(model, max_prompt_length=512, max_new_tokens=128, max_batch_size=8)`` (generate),
    ``warmup(model, work="serve", generation_config=...)``, ``warmup(trainer, max_length=512)`` (train),
    ``warmup(pipe, work="infer", max_length=128, max_batch_size=8)`` (every padded forward's bucket).
    """
    if work is None:
        work = "train" if _is_trainer(target) else "generate"
    if work not in WORKS:
        raise ValueError(f"warmup(work={work!r}): choose one of {', '.join(map(repr, WORKS))}")
    if work == "train":
        if not _is_trainer(target):
            raise TypeError("warmup(..., work='train') takes the Trainer (warmup(trainer, max_length=...))")
        from .training.warm_up import warmup_train

        return warmup_train(target, **options)
    if _is_trainer(target):
        raise TypeError(f"warmup(trainer, work={work!r}): pass the model (trainer.model) for {work!r}")
    if work == "infer":
        from .inference.warm_up import warmup_infer

        return warmup_infer(target, **options)
    if work == "serve":
        from .serving.warm_up import warmup_serve

        return warmup_serve(target, **options)
    from .generation.warm_up import warmup_generate

    return warmup_generate(target, **options)


def _bootstrap() -> None:
    """Activate at import; a failure of ours is one warning, never a failed import."""
    try:
        activate()
    except Exception as error:  # noqa: BLE001
        try:
            deactivate()
        except Exception:  # noqa: BLE001
            pass
        _log.warn(
            f"transformers-tpu-ext could not activate ({type(error).__name__}: {error}); "
            "Transformers runs unpatched.",
            stacklevel=2,
        )


_bootstrap()


def _simulate_without_autoload() -> None:
    """``TRANSFORMERS_TPU_EXT_SIMULATE`` under ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``: the entry point that
    installs the simulated TPU at ``import torch`` does not run, so importing the package does it."""
    import os

    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "1":
        from . import _autoload

        _autoload.load()  # never raises: a problem is one warning


_simulate_without_autoload()
