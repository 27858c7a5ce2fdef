"""TRL: ``GRPOTrainer`` builds its batches at static shapes on TPU.

``GRPOTrainer`` generates completions and pads prompts (left) and completions (right) itself, with
TRL's ``pad``, to the longest of each generation batch; every new length compiles a new forward,
backward and loss, and the ops after ``generate()`` compile once per generated length. On TPU, while
``GRPOTrainer._generate_and_score_completions`` builds a batch and only where
:func:`transformers_tpu_ext.training.grpo.grpo_path` proves the result unchanged (decided once per
trainer, said once in the log when it is not):

- TRL's ``pad`` (the name ``trl.trainer.grpo_trainer`` calls) pads left-padded prompts to a rung of
  the training ladder and right-padded completions to ``max_completion_length``, through its own
  ``pad_to_multiple_of`` (the rung is a multiple of itself: no copy of TRL's function);
- ``GRPOTrainer._generate_single_turn``: TRL's generation config asks for the static cache when it asks
  for none (its ``disable_compile=True`` alone gives Transformers' dynamic cache, a program per decode
  length), restored after the call;
- ``GenerationMixin.generate`` (the call TRL makes for its completions) returns
  ``max_completion_length`` new columns, the pad token after the stop, padded on the host (a
  transfer, no program). Outside a GRPO batch both wrappers call the original at once.

``training.warmup()`` runs one step per prompt rung under :func:`warming_prompts` (the prompts padded,
or cut from the left, to that rung).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterator
from typing import Any, Callable

from ..core.relies import Attribute, Default, Signature
from ..core.wrapping import Wraps, fail_safe, warn_once

NAME = "trl_grpo"
TARGET = "trl.trainer.grpo_trainer"
DISTRIBUTION = "transformers"  # TRL's own versions are checked by the loss predicate (training/losses.py)
#: TRL's ``pad(tensors, padding_value=0, padding_side="right", pad_to_multiple_of=None)``.
_PAD_ARGS = ("tensors", "padding_value", "padding_side", "pad_to_multiple_of")
RELIES_ON = (
    Signature("GRPOTrainer._generate_and_score_completions"),
    Signature("GRPOTrainer._generate_single_turn"),
    # TRL's pad, as bound here (_PAD_ARGS, positional or by name; an absent padding_side is "right").
    Signature("pad", _PAD_ARGS, positional=_PAD_ARGS),
    Default("pad", "padding_side", "right"),
    # The trainer's settings the plan reads (GRPOTrainer copies them from its GRPOConfig).
    Attribute("GRPOConfig.max_completion_length"),
    Attribute("GRPOConfig.pad_to_multiple_of"),
    Attribute("GRPOConfig.top_entropy_quantile"),
    Attribute("GRPOConfig.use_vllm"),
    Attribute("GRPOConfig.use_transformers_continuous_batching"),
    Signature("transformers.generation.utils:GenerationMixin.generate", positional=("inputs",)),  # or input_ids=
)

_wraps = Wraps()

#: The plan of the GRPO batch being built (and its trainer), or ``None``.
_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("transformers_tpu_ext_grpo", default=None)
#: Inside TRL's ``_generate_single_turn`` (the one ``generate()`` whose output is padded).
_GENERATING: contextvars.ContextVar[bool] = contextvars.ContextVar("transformers_tpu_ext_grpo_generating", default=False)
#: The prompt length of a warm-up step (``warming_prompts``), or ``None``.
_WARMING: contextvars.ContextVar[Any] = contextvars.ContextVar("transformers_tpu_ext_grpo_warming", default=None)
_PLAN = "_tpu_ext_grpo_plan"
_USED = "_tpu_ext_grpo_prompt_lengths"


def _plan(trainer: Any) -> Any:
    """The trainer's :class:`~transformers_tpu_ext.training.grpo.GRPOPlan` (decided once), or ``None``."""
    if _PLAN in trainer.__dict__:
        return trainer.__dict__[_PLAN]
    from .patch_transformers_trainer import trains_on_tpu

    plan = None
    if trains_on_tpu(trainer):
        from . import buckets, grpo
        from .facts import grpo_facts

        settings = buckets.settings()
        if settings.enabled:
            plan = grpo.grpo_path(grpo_facts(trainer), ladder=settings.ladder, reuse=settings.reuse)
            if isinstance(plan, str):
                warn_once(f"GRPOTrainer batches left as TRL makes them: {plan}")
                plan = None
    trainer.__dict__[_PLAN] = plan
    return plan


def plan(trainer: Any) -> Any:
    """The trainer's :class:`~transformers_tpu_ext.training.grpo.GRPOPlan` on TPU, or ``None`` (left as TRL makes it)."""
    return _plan(trainer)


@contextlib.contextmanager
def warming_prompts(length: int, truncated: bool = False) -> Iterator[None]:
    """A warm-up step's prompts: cut to their last ``length - 1`` tokens and padded on the left to ``length``
    (the shapes of a batch whose longest prompt needs that rung, with a padding column as such batches
    have: ``generate()`` gives a batch without one the next rung; the tokens do not matter). ``truncated``:
    no completion stops (every generated token is replaced by one that is not a stop), the batch whose
    metrics take TRL's other branch (no terminated completion: ``completions/*_terminated_length`` of zeros)."""
    token = _WARMING.set((length, truncated))
    try:
        yield
    finally:
        _WARMING.reset(token)


def _generate_and_score_completions(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    plan = _plan(instance)
    if plan is None:
        return wrapped(*args, **kwargs)
    token = _ACTIVE.set((plan, instance))
    try:
        return wrapped(*args, **kwargs)
    finally:
        _ACTIVE.reset(token)


def _generate_single_turn(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for TRL's one ``generate()`` call: marked, and with the static cache when the plan says so."""
    active = _ACTIVE.get()
    if active is None:
        return wrapped(*args, **kwargs)
    config = getattr(instance, "generation_config", None)
    if active[0].static_cache and config is not None and getattr(config, "cache_implementation", None) is None:
        static = copy.deepcopy(config)
        static.cache_implementation = "static"  # the plugin's generate(): buckets and static shapes, still eager
        instance.generation_config = static
    token = _GENERATING.set(True)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _GENERATING.reset(token)
        if config is not None:
            instance.generation_config = config


def _pad(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for TRL's ``pad(tensors, padding_value=0, padding_side="right", pad_to_multiple_of=None)``."""
    active = _ACTIVE.get()
    if active is None:
        return wrapped(*args, **kwargs)
    from . import grpo

    plan, trainer = active
    call = dict(zip(_PAD_ARGS, args), **kwargs)
    tensors = call.get("tensors") or []
    longest = max((t.shape[0] for t in tensors), default=0)
    if call.get("padding_side", "right") == "left":
        used = trainer.__dict__.setdefault(_USED, set())
        warming = (_WARMING.get() or (None,))[0]
        if warming is not None:  # one column short, as a batch of that rung has (generate() keeps its buckets)
            tensors = call["tensors"] = [t[-max(warming - 1, 1):] for t in tensors]
            longest = max((t.shape[0] for t in tensors), default=0)
        target = warming or grpo.prompt_length(longest, plan, used)
        used.add(target)
    else:
        target = plan.completion_length
    if not tensors or longest > target:
        return wrapped(*args, **kwargs)
    call["pad_to_multiple_of"] = target  # longest <= target: exactly target columns
    return wrapped(**call)


def _generate(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """Wrapper for ``GenerationMixin.generate``: in a GRPO batch, the output has ``max_completion_length`` new columns."""
    result = wrapped(*args, **kwargs)
    active = _ACTIVE.get()
    if active is None or not _GENERATING.get():
        return result
    from .facts import unwrap

    ids = kwargs.get("input_ids", args[0] if args else None)
    if unwrap(instance) is not unwrap(active[1].model) or not hasattr(result, "shape") or getattr(ids, "dim", lambda: 0)() != 2 or result.dim() != 2:
        return result
    plan, trainer = active
    want = ids.shape[1] + plan.max_new_tokens
    missing = want - result.shape[1]
    if missing <= 0 and not (_WARMING.get() or (None, False))[1]:
        return result
    import torch.nn.functional as F

    pad_id = trainer._tokenizer.pad_token_id
    host = F.pad(result.cpu(), (0, max(missing, 0)), value=pad_id)  # on the host: a transfer, no program
    if (_WARMING.get() or (None, False))[1]:
        stops = {*getattr(trainer, "eos_token_ids", ()), pad_id}
        host[:, ids.shape[1]:] = next(t for t in range(len(stops) + 1) if t not in stops)
    return host.to(result.device)


def apply(module: Any) -> None:
    if _wraps:
        return
    from transformers.generation import utils as generation

    _wraps.wrap(module, "GRPOTrainer._generate_and_score_completions", fail_safe(_generate_and_score_completions))
    _wraps.wrap(module, "GRPOTrainer._generate_single_turn", fail_safe(_generate_single_turn))
    _wraps.wrap(module, "pad", fail_safe(_pad))
    _wraps.wrap(generation, "GenerationMixin.generate", fail_safe(_generate))


def revert() -> None:
    _wraps.unwrap_all()
