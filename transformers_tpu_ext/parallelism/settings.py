"""The variable of tensor parallelism, declared once (read by ``parallelism.tp_plans.rewrite_mode``).

Pure data; see ``transformers_tpu_ext.settings`` for the layer that parses and checks it.
"""

from __future__ import annotations

from ..settings.parser import Setting

__all__ = ["SETTINGS"]

SETTINGS: tuple[Setting, ...] = (
    Setting("TRANSFORMERS_TPU_EXT_TP_REWRITE", "choice", "`auto`",
            "when TP plans are rewritten at load time: on a TPU only, on any device (CPU/GPU clusters that want the "
            "fix), or never. See [tensor-parallelism.md](tensor-parallelism.md).", choices=("auto", "always", "never")),
)
