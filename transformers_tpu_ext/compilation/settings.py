"""The variables of the compilation service (the persistent cache, the recompile guard), declared once.

Pure data; see ``transformers_tpu_ext.settings`` for the layer that parses and checks them.
"""

from __future__ import annotations

from ..settings.parser import Setting

__all__ = ["SETTINGS"]

SETTINGS: tuple[Setting, ...] = (
    Setting("TRANSFORMERS_TPU_EXT_COMPILE_CACHE", "text", "`auto`",
            "torch_tpu's persistent compile cache (`TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT`, set only when you did "
            "not set it): by default on a TPU VM, under the Hugging Face cache; an on word also elsewhere (the "
            "simulated TPU); an off word never; a directory: that one. A near miss of a word (`of`) is an error, "
            "never a directory. See [compile-cache.md](compile-cache.md#the-persistent-compile-cache).",
            values="`auto`, `on`, `off`, a directory"),
    Setting("TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE", "choice", "`warn`",
            "what the recompile guard does when a program compiles in steady state (after a warm-up, or after the "
            "settle period)", choices=("warn", "error", "ignore"), field="on_recompile"),
    Setting("TRANSFORMERS_TPU_EXT_COMPILE_RECOMPILE_SETTLE", "integer", "20",
            "calls without a new program after which a work that was not warmed up is in steady state (`0`: from "
            "the first call)", field="settle"),
)
