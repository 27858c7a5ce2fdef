"""The int8 KV cache's format, as the decisions read it (pure: no torch); :mod:`.kv_cache` runs it.

``generation.config``/``generation.policy`` (``kv_cache_choice``), ``serving`` (``kv_cache_path``) and
``quantization.capacity`` (bytes per position) take these constants from here, not from the runtime.
"""

from __future__ import annotations

__all__ = ["FLOAT_DTYPES", "FORMATS", "QMAX", "SCALE_BYTES"]

#: The formats the ``kv_cache`` settings take (``None``: the model's dtype, as upstream).
FORMATS = ("int8",)
#: Model dtypes the int8 cache dequantizes to (a float model; never an integer or float8 one).
FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16"})
QMAX = 127.0
#: Bytes of one scale (float32): a position and key-value head costs ``head_dim + SCALE_BYTES`` bytes.
SCALE_BYTES = 4
