"""The registry of patches.

Each entry names a module of this package exposing the patch contract:

- ``NAME``: the patch's public name (what ``active_patches()`` and ``TRANSFORMERS_TPU_EXT_DISABLE``
  use); it is the module's name.
- ``TARGET``: the dotted name of the module whose import triggers ``apply``.
- ``DISTRIBUTION``: the distribution whose version gates the patch (ranges in ``requirements.txt``).
- ``apply(module)``: install the wrappers (``module`` is the imported ``TARGET``).
- ``revert()``: restore the exact originals, guard for guard.

A patch module imports nothing from its target at import time. Adding a patch is one new module
plus one line below.
"""

from __future__ import annotations

REGISTRY: tuple[str, ...] = (
    "accelerate_memory",
    "accelerate_offload",
    "transformers_device_map",
    "transformers_tied_weights",
    "transformers_pipeline_device",
    "hub_kernels",
    "use_kernels",
    "generation",
    "tp_plan_rewrite",
    "tp_kv_cache",
)
