"""The variable of placement (HBM kept free), declared once.

Pure data; see ``transformers_tpu_ext.settings`` for the layer that parses and checks it.
"""

from __future__ import annotations

from ..settings.parser import Setting

__all__ = ["SETTINGS"]

SETTINGS: tuple[Setting, ...] = (
    Setting("TRANSFORMERS_TPU_EXT_HBM_HEADROOM", "text", "10 % of HBM, at least 1 GiB, at most half",
            "HBM kept free for the static KV cache and compiled programs. A user's `max_memory={\"tpu\": ...}` "
            "always wins. See [placement.md](placement.md).", values="`4GiB`, `20%`, `0.2`, `0`"),
)
