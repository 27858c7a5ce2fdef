"""Transformers: ``TrainingArguments(torch_compile=True)`` compiles with the ``tpu`` backend on TPU.

``TrainingArguments.__post_init__`` picks ``torch_compile_backend="inductor"`` unless the host has
an HPU or a Neuron device; inductor cannot compile TPU graphs (torch_tpu 0.2.0 fails to register
its Pallas kernels), and the TPU backend rejects every ``torch_compile_mode`` but the default. On a
TPU host (and not ``use_cpu``), before upstream's ``__post_init__`` runs, a requested compilation
gets the ``tpu`` backend; an explicit backend or mode the TPU cannot run is replaced with one
warning (:func:`training_policy.adapt_compile`). The ``accelerate_dataclasses`` patch makes Accelerate
accept ``"tpu"``. Every sequence bucket is a recompilation of the model's compiled frames: TorchDynamo's
recompile limit (8) is raised to the plugin's floor (``compilation.recompile_limit``; ``warmup()`` raises
it to what its buckets need), so that a ninth bucket does not run op by op. Off TPU nothing changes.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import backend
from . import policy as training_policy
from ..compilation import recompile_limit
from ..core.relies import Attribute, Default, Signature
from ..core.wrapping import Wraps, fail_safe, warn_once

NAME = "transformers_training_args"
TARGET = "transformers.training_args"
DISTRIBUTION = "transformers"
RELIES_ON = (
    Signature("TrainingArguments.__post_init__"),
    Attribute("TrainingArguments.torch_compile"),
    Attribute("TrainingArguments.use_cpu"),
    # An unset backend and mode (None) ask for no compilation: a value set asks for one (and gets the tpu backend).
    Default("TrainingArguments.__init__", "torch_compile_backend", None),
    Default("TrainingArguments.__init__", "torch_compile_mode", None),
)

_wraps = Wraps()


def _compile_for_tpu(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    wants_compile = (
        getattr(instance, "torch_compile", False)
        or getattr(instance, "torch_compile_backend", None) is not None
        or getattr(instance, "torch_compile_mode", None) is not None
    )
    if wants_compile and not getattr(instance, "use_cpu", False) and backend.tpu_available():
        compile_backend, mode, notes = training_policy.adapt_compile(
            instance.torch_compile_backend, instance.torch_compile_mode
        )
        for note in notes:
            warn_once(f"TrainingArguments on TPU: {note}")
        instance.torch_compile = True
        instance.torch_compile_backend = compile_backend
        instance.torch_compile_mode = mode
        recompile_limit.require("train", 0)
    return wrapped(*args, **kwargs)


def apply(module: Any) -> None:
    if _wraps:
        return
    _wraps.wrap(module, "TrainingArguments.__post_init__", fail_safe(_compile_for_tpu))


def revert() -> None:
    _wraps.unwrap_all()
    recompile_limit.release("train")
