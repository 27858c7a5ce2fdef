"""Patch of Transformers' experts interface: the ``grouped_mm`` experts on TPU through JAX's megablox kernel.

Transformers 5.25 dispatches every mixture-of-experts layer's experts through ``ALL_EXPERTS_FUNCTIONS``
(``transformers.integrations.moe.ExpertsInterface``), by the name in ``config._experts_implementation``
(``"grouped_mm"`` unless the user asks for another). This patch registers, through the interface's own
``ExpertsInterface.register``, a ``"grouped_mm"`` that runs the kernel path on TPU where
``experts.policy.experts_path`` allows it and calls Transformers' ``grouped_mm_experts_forward`` itself everywhere
else (``experts.runtime.dispatching_experts``). ``revert()`` registers Transformers' function again, unless
someone registered another ``"grouped_mm"`` since (then theirs stays). Other implementations (``batched_mm``,
``eager``, Hub kernels, FP8 experts) are untouched.
"""

from __future__ import annotations

from typing import Any

from ..core.relies import Attribute, Signature

NAME = "experts"
TARGET = "transformers.integrations.moe"
DISTRIBUTION = "transformers"
RELIES_ON = (
    Signature("ExpertsInterface.register", positional=("key", "value")),
    Signature("ExpertsInterface.get_interface", positional=("experts_implementation", "default")),
    Attribute("ALL_EXPERTS_FUNCTIONS"),
    # What the kernel path reads of an experts module and its call (use_experts_implementation's attributes).
    Signature("grouped_mm_experts_forward", positional=("self", "hidden_states", "top_k_index", "top_k_weights")),
    Signature("use_experts_implementation", ("is_concatenated", "is_transposed", "has_bias", "has_gate", "has_post_expert_norm")),
)

KEY = "grouped_mm"

_registered: list[tuple[Any, Any, Any]] = []  # (interface class, Transformers' function, ours)


def apply(module: Any) -> None:
    from . import runtime

    if _registered:
        return
    interface = module.ExpertsInterface
    original = interface._global_mapping[KEY]
    ours = runtime.dispatching_experts(original)
    interface.register(KEY, ours)
    _registered.append((interface, original, ours))


def revert() -> None:
    while _registered:
        interface, original, ours = _registered.pop()
        if interface._global_mapping.get(KEY) is ours:
            interface.register(KEY, original)
