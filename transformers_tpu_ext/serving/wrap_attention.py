"""The model's attention while a TPU continuous-batching manager lives, and its return (glue of ``patch_continuous_batching``).

A manager on the TPU path gives its model the dispatching attention (``"tpu_paged|sdpa"``...: the
paged kernel inside the manager's steps, the model's own attention everywhere else). The model gets
its own back from ``stop()`` (upstream), from ``destroy()`` of a manager that never started, and from
``generate_batch()`` however it ends: results, an error, or Ctrl-C during the warm-up or while stopping.
"""

from __future__ import annotations

import contextvars
from typing import Any

from . import policy as serving
from .plan import plan_of as _plan_of

__all__ = ["destroy", "forget", "generate_batch", "made", "restore_attention", "switch_attention",
           "use_tpu_attention", "user_attention"]

_registered: list[tuple[Any, str]] = []  # (registry, name) pairs we registered (for revert)
#: The TPU managers a ``generate_batch`` call made (each gives the model its attention back when the call ends).
_made: contextvars.ContextVar[list | None] = contextvars.ContextVar("tpu_ext_cb_made", default=None)


def _runtime() -> Any:
    from . import runtime

    return runtime



def made(manager: Any) -> None:
    """Record a TPU manager built inside a ``generate_batch`` call (nothing outside one)."""
    managers = _made.get()
    if managers is not None:
        managers.append(manager)


def forget() -> None:
    """Unregister the dispatching attentions (the patch's ``revert``)."""
    while _registered:
        mapping, name = _registered.pop()
        mapping._global_mapping.pop(name, None)


def user_attention(model: Any) -> str:
    """The model's attention implementation as the user set it (not the dispatcher of a live manager)."""
    current = str(model.config._attn_implementation)
    if current.startswith(_runtime().ATTENTION_NAME + "|"):
        return getattr(model, "_tpu_ext_attn_original", current)
    return current


def switch_attention(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    model = args[0] if args else kwargs["model"]
    restore_attention(model)  # a live or cached manager's dispatcher: upstream's check must see the user's
    result = wrapped(*args, **kwargs)
    if _plan_of(getattr(instance, "continuous_batching_config", None)) is not None:  # a cached manager, re-used
        use_tpu_attention(instance, model)
    return result


def use_tpu_attention(manager: Any, model: Any) -> None:
    """Give ``model`` the dispatching attention of its implementation (registered with its mask function)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    runtime = _runtime()
    current = str(model.config._attn_implementation)
    if current.startswith(runtime.ATTENTION_NAME + "|"):
        return
    fallback = serving.PAGED_FALLBACKS[current]
    name = runtime.attention_name(fallback)
    for mapping, function in (
        (ALL_ATTENTION_FUNCTIONS, runtime.dispatching_attention(fallback)),
        (ALL_MASK_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS[fallback]),
    ):
        if mapping._global_mapping.get(name) is not function:
            mapping._global_mapping[name] = function
            _registered.append((mapping, name))
    model._tpu_ext_attn_original = current
    model.set_attn_implementation(name)
    if manager._original_attn_impl is None:
        manager._original_attn_impl = current


def restore_attention(model: Any) -> None:
    """Give ``model`` back the attention it had before a TPU manager switched it (nothing if none did)."""
    original = getattr(model, "_tpu_ext_attn_original", None)
    if original is not None and str(model.config._attn_implementation).startswith(_runtime().ATTENTION_NAME + "|"):
        model.set_attn_implementation(original)


def generate_batch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Upstream's ``generate_batch``; whatever ends it (a result, an error, Ctrl-C during the warm-up or while
    stopping), the model has its own attention back and the managers it made are stopped."""
    made: list = []
    token = _made.set(made)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _made.reset(token)
        for manager in made:
            _give_back(manager)


def _give_back(manager: Any) -> None:
    """Stop ``manager`` if it still runs (an interrupted stop), then give its model its attention back."""
    try:
        if manager.is_running():
            manager.stop(block=True, timeout=10, hard_stop=True)
    finally:
        model = manager.model
        if not (getattr(model, "_cached_continuous_batching_manager", None) is manager and manager.is_running()):
            restore_attention(model)
            manager._original_attn_impl = None


def destroy(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    # Upstream restores the attention in stop(), which destroy() calls only for a running manager.
    if _plan_of(getattr(instance, "continuous_batching_config", None)) is not None and instance._original_attn_impl:
        model = instance.model
        if getattr(model, "_cached_continuous_batching_manager", None) is not instance:
            restore_attention(model)
            instance._original_attn_impl = None
    return result
