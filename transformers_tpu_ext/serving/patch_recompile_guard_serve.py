"""Patch: the recompile guard around continuous-batching steps on TPU (``ContinuousBatchProcessor``).

- ``_generation_step``: one step of the manager's loop (on its thread) runs inside
  :func:`recompile.guarded` (``work="serve"``) when the model is on a TPU;
- ``warmup``: the manager's warm-up (``manager.warmup()``, or ``start()`` when nothing warmed it up)
  runs inside :func:`recompile.warming_up`; when it ends, serving is in steady state.

The report names the step's tokens and requests, its padded shape, and the serving settings that
set the shapes (:func:`guard.serve_advice`).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..compilation import guard, recompile
from ..backend import is_tpu
from ..core.relies import Signature
from ..core.wrapping import Wraps, fail_safe

NAME = "recompile_guard_serve"
TARGET = "transformers.generation.continuous_batching.continuous_api"
DISTRIBUTION = "transformers"
RELIES_ON = (
    Signature("ContinuousBatchProcessor._generation_step", ("model",), positional=("model",)),
    Signature("ContinuousBatchProcessor.warmup", ("model",), positional=("model",)),
)

_wraps = Wraps()


def apply(module: Any) -> None:
    processor = module.ContinuousBatchProcessor
    _wraps.wrap(processor, "_generation_step", _step)
    _wraps.wrap(processor, "warmup", _warmup)


def revert() -> None:
    _wraps.unwrap_all()


def _model(args: tuple, kwargs: Mapping[str, Any]) -> Any:
    return args[0] if args else kwargs.get("model")


@fail_safe
def _step(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    model = _model(args, kwargs)
    if not is_tpu(getattr(model, "device", None)):
        return wrapped(*args, **kwargs)
    with recompile.guarded("serve", model, lambda covered: _facts(instance)):
        return wrapped(*args, **kwargs)


@fail_safe
def _warmup(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    model = _model(args, kwargs)
    if not is_tpu(getattr(model, "device", None)):
        return wrapped(*args, **kwargs)
    plan = getattr(getattr(instance, "inputs_and_outputs", None), "plan", None)
    covered = {"shapes": [tuple(s) for s in getattr(plan, "shapes", ())]}
    with recompile.warming_up("serve", model, covered):
        return wrapped(*args, **kwargs)


def _facts(processor: Any) -> recompile.CallFacts:
    io = processor.inputs_and_outputs
    requests = len(getattr(io, "requests_in_batch", ()) or ())
    plan = getattr(io, "plan", None)
    shapes = [tuple(s) for s in getattr(plan, "shapes", ())]
    q, s = getattr(io, "num_q_tokens", None), getattr(io, "num_request_in_batch", None)
    shape = None
    if plan is not None and q is not None:
        from . import policy as serving

        shape = serving.step_shape(max(1, int(q)), max(1, int(s or requests or 1)), plan.token_buckets, plan.request_buckets)
    call = f"a step of {requests} request{'s' if requests != 1 else ''}"
    if shape is not None:
        call += f" (padded to tokens={shape[0]}, requests={shape[1]})"
    return recompile.CallFacts(call=call, advice=guard.serve_advice(int(q or 0), requests, shape, shapes), signature=shape)
