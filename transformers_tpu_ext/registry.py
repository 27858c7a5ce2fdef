"""The registry of patches: every patch the plugin can apply, with its capability, in one list.

A patch named ``NAME`` of capability ``CAPABILITY`` is the module
``transformers_tpu_ext.<CAPABILITY>.patch_<NAME>``, which exposes the patch contract:

- ``NAME``: the patch's public name (what ``status()``, ``active_patches()``, ``transformers-tpu
  doctor`` and ``TRANSFORMERS_TPU_EXT_DISABLE`` use). These names are stable: users have them in
  scripts.
- ``TARGET``: the dotted name of the module whose import triggers ``apply``.
- ``DISTRIBUTION``: the distribution whose version gates the patch (ranges in ``requirements.txt``).
- ``RELIES_ON``: what the patch relies on in its target (``core.relies``: signatures, attributes, defaults),
  checked before ``apply``; a mismatch makes the patch stand aside with one warning naming the release.
- ``apply(module)``: install the wrappers (``module`` is the imported ``TARGET``).
- ``revert()``: restore the exact originals, guard for guard.

A patch module imports nothing from its target at import time. Adding a patch is one new module in
its capability's folder plus one line below. Patches are armed, and reverted in reverse, in this order.
"""

from __future__ import annotations

import importlib.util
from types import MappingProxyType
from typing import Mapping

__all__ = ["CAPABILITIES", "PATCHES", "REGISTRY", "capability", "installed", "module_name"]

#: Patch name -> capability (the subpackage holding the patch and the decisions it applies).
PATCHES: Mapping[str, str] = MappingProxyType(
    {
        "accelerate_memory": "placement",
        "accelerate_offload": "placement",
        "transformers_device_map": "placement",
        "transformers_pipeline": "placement",
        "transformers_tied_weights": "placement",
        "peft_load": "placement",
        "hub_kernels": "kernels",
        "use_kernels": "kernels",
        "generation": "generation",
        "tp_plan_rewrite": "parallelism",
        "tp_kv_cache": "parallelism",
        "continuous_batching": "serving",
        "quantizers": "quantization",
        "finegrained_fp8": "quantization",
        "torch_ddp": "training",
        "torch_optimizer": "training",
        "accelerate_state": "training",
        "accelerate_operations": "training",
        "accelerate_dataclasses": "training",
        "accelerate_prepare": "training",
        "transformers_training_args": "training",
        "transformers_trainer": "training",
        "recompile_guard_generate": "generation",
        "whisper_generate": "generation",
        "recompile_guard_serve": "serving",
        "recompile_guard_train": "training",
        "pipeline_buckets": "inference",
        "trl_grpo": "training",
        "lm_eval_hf": "inference",
        "sentence_transformers_encode": "inference",
        "accelerate_rng": "training",
        "trainer_losses": "training",
        "experts": "experts",
        "experts_decode": "experts",
    }
)

#: Every patch name, in the order patches are armed.
REGISTRY: tuple[str, ...] = tuple(PATCHES)

#: Every capability, in the order of its first patch; ``compilation`` (a service below the others: the
#: compile cache, the recompile guard, TorchDynamo's recompile limit) has settings and no patch of its own.
CAPABILITIES: tuple[str, ...] = (
    "placement", "kernels", "generation", "parallelism", "serving", "quantization", "training", "compilation", "inference",
    "experts",
)


def capability(name: str) -> str:
    """The capability of the patch ``name`` (``KeyError`` for an unknown name)."""
    return PATCHES[name]


def module_name(name: str) -> str:
    """The dotted name of the module implementing the patch ``name``."""
    return f"{__package__}.{PATCHES[name]}.patch_{name}"


def installed(target: str) -> bool:
    """Whether the distribution of the dotted module ``target`` is installed (TRL is an optional extra: a
    patch whose target is TRL's waits for an import that never comes when TRL is absent)."""
    return importlib.util.find_spec(target.partition(".")[0]) is not None
