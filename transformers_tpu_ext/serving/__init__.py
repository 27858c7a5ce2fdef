"""Serving: Transformers' continuous batching on TPU, with a fixed set of compiled step shapes.

- :mod:`.policy` (pure): which managers take the TPU path (``paged_path``, a "safe when"
  predicate; the others are upstream's), the token and request ladders of a step, the step shapes
  a warm-up compiles, the paged KV cache sized from the chip's HBM, the settings (:func:`configure`).
- :mod:`.runtime`: the pieces a step runs with (the paged attention and the
  dispatcher that keeps the model's own attention outside the manager's steps, the warm-up,
  compile settings); :mod:`.step_io`: ``TPUBatchIO``, the padded step inputs.
- :mod:`.warm_up`: ``warmup_serve`` (``transformers_tpu_ext.warmup(model, work="serve")``), a manager warmed up.
- ``patch_continuous_batching``: the glue into ``generate_batch``, ``ContinuousBatchingManager``
  and ``transformers serve --continuous-batching``; ``patch_recompile_guard_serve``: the recompile guard
  (``compilation``) around each step and the warm-up.

See ``docs/serving.md``.
"""

from __future__ import annotations

from .policy import ServeSettings, configure, current, reset

__all__ = ["ServeSettings", "configure", "current", "reset"]
