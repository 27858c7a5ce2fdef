"""A kernel that fails after the manager was made (glue of ``patch_continuous_batching``).

``ragged.choose`` registers and runs the kernel when the manager is made; what it cannot see (a step's
shapes traced, lowered and compiled inside the step's program, during the warm-up or the first steps
of a manager started without one) fails in ``ModelRunner.compute_batch``. There, on the kernel path,
an error that came from the kernel (``ragged.failed_here``) sends the manager to the plain-PyTorch
attention for good, with one warning: the cache's pages are rewritten in that path's layout (with
int8 pages, their scales per position), the step's inputs are made again for it and the step runs
again (its keys and values are written again to the same slots). The requests in flight go on. Any
other error is upstream's to handle, as before.
"""

from __future__ import annotations

import logging
from typing import Any

from . import ragged

__all__ = ["compute_batch", "fall_back"]

logger = logging.getLogger("transformers_tpu_ext")


def compute_batch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    io = getattr(instance, "inputs_and_outputs", None)
    plan = getattr(io, "plan", None)
    if plan is None or plan.attention != "ragged" or not hasattr(io, "refill_present"):
        return wrapped(*args, **kwargs)
    try:
        return wrapped(*args, **kwargs)
    except Exception as error:
        if not ragged.failed_here(error):
            raise
        fall_back(io, error, warming_up=getattr(instance, "_tpu_ext_warming_up", False))
    model = args[0] if args else kwargs["model"]
    return wrapped(model, io.get_model_kwargs(use_padding=True))


def fall_back(io: Any, error: BaseException, warming_up: bool = False) -> None:
    """Move ``io``'s manager from the kernel to the plain-PyTorch attention (its cache, plan, this step's inputs)."""
    from ..compilation import recompile_limit
    from ..core.wrapping import warn_once

    plan, allocator = io.plan, io.allocator
    ragged.to_present_layout(allocator)
    head_scales = getattr(allocator, "_tpu_ext_kv_head_scales", None)
    if head_scales is not None:
        allocator._tpu_ext_kv_scales = ragged.present_scales(allocator, head_scales)
    plan.attention, plan.kernel_variant = "paged", None
    recompile_limit.require("serve", 2 * len(plan.shapes))  # the kernel's graphs, then the present path's
    io.refill_present()
    when = "while precompiling the serving steps" if warming_up else "in a serving step"
    memory = ""
    free = plan.cache.budget - plan.cache.cache_bytes if plan.cache is not None else None
    if plan.present_step_bytes and free is not None and plan.present_step_bytes > free:
        memory = (
            f"; the cache was sized for the kernel, and a step of this attention needs {plan.present_step_bytes} bytes "
            f"where {free} are free: should the chip run out of memory, restart with TRANSFORMERS_TPU_EXT_SERVE_ATTENTION=paged"
        )
    compiles = "" if warming_up else "; its step shapes compile as they come"
    warn_once(
        f"the ragged paged attention kernel failed {when} ({type(error).__name__}: {str(error)[:500]}); TPU serving "
        f"runs the plain-PyTorch paged attention from now on (each token reads max_len keys), the requests in flight "
        f"go on{compiles}{memory}"
    )
