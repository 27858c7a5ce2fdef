"""The variables of training on TPU, declared once (read and checked by ``training.buckets.settings``, listed in the docs' table).

Pure data; see ``transformers_tpu_ext.settings`` for the layer that parses and checks them.
"""

from __future__ import annotations

from ..settings.parser import Setting

__all__ = ["SETTINGS"]

SETTINGS: tuple[Setting, ...] = (
    Setting("TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS", "text", "`1`",
            "pad the Trainer's batches on TPU to the default sequence ladder (`1`), not at all (`0`), or to these "
            "lengths. See [training.md](training.md#static-shapes-what-is-padded-and-why).",
            values="`1`, `0`, `128,256,512`", field="buckets"),
    Setting("TRANSFORMERS_TPU_EXT_TRAIN_STEPS_PER_OCTAVE", "integer", "2",
            "rungs per doubling of the default ladder (16, 32, 48, 64, 96, 128, ...)", field="steps_per_octave"),
    Setting("TRANSFORMERS_TPU_EXT_TRAIN_REUSE", "number", "1.5",
            "a batch whose rung was never used may run in a used rung up to this much longer; `1` turns reuse off",
            field="reuse"),
)

