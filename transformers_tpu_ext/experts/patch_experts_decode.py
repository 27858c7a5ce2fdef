"""Patch of ``GenerationMixin._optimize_model_for_decode``: keep the kernel through decoding on TPU.

Transformers 5.25's ``generate()`` switches every ``grouped_mm`` experts implementation to ``batched_mm`` for its
decode steps on every device but CPU (and MPS), because a grouped matmul of a few rows is slow on GPUs;
``batched_mm`` copies each selected expert's weights once per (token, expert) pair. On TPU, where the experts take
JAX's grouped matmul (``experts.policy.experts_path``), a decode step reads each selected expert's weights once:
``experts.policy.decode_switch`` keeps ``grouped_mm`` there. Anywhere else (off TPU, no kernel) upstream switches
as before.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from ..core.relies import Signature
from ..core.wrapping import Wraps, fail_safe

NAME = "experts_decode"
TARGET = "transformers.generation.utils"
DISTRIBUTION = "transformers"
RELIES_ON = (Signature("GenerationMixin._optimize_model_for_decode"),)

logger = logging.getLogger("transformers_tpu_ext")

_wraps = Wraps()


@fail_safe
def _optimize_for_decode(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    from ..backend import is_tpu

    implementations = getattr(instance, "get_experts_implementation", None)  # PreTrainedModel's
    if not is_tpu(getattr(instance, "device", None)) or implementations is None or "grouped_mm" not in implementations().values():
        return wrapped(*args, **kwargs)
    from . import policy, runtime

    facts = runtime.model_facts(instance)
    switch, why = policy.decode_switch(facts) if facts is not None else (True, "no experts module found")
    logger.debug("transformers-tpu-ext: decoding experts: %s", why)
    return wrapped(*args, **kwargs) if switch else contextlib.nullcontext()


def apply(module: Any) -> None:
    _wraps.wrap(module, "GenerationMixin._optimize_model_for_decode", _optimize_for_decode)


def revert() -> None:
    _wraps.unwrap_all()
