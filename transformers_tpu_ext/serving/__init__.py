"""Serving: Transformers' continuous batching on TPU, with a fixed set of compiled step shapes.

- :mod:`.policy` (pure): which managers take the TPU path (``paged_path``, a "safe when"
  predicate; the others are upstream's) and int8 pages (``kv_cache_path``); it re-exports the rest
  of the policy, each in a pure module of its own: :mod:`.shapes` (the token and request ladders of
  a step, the step shapes a warm-up compiles), :mod:`.memory` (the paged KV cache sized from the
  chip's HBM), :mod:`.plan` (a manager's plan and step statistics), :mod:`.settings` (the
  ``TRANSFORMERS_TPU_EXT_SERVE_*`` variables, declared once, and :func:`configure`).
- :mod:`.runtime`: the pieces a step runs with (the paged attention and the
  dispatcher that keeps the model's own attention outside the manager's steps, the warm-up,
  compile settings); :mod:`.step_io`: ``TPUBatchIO``, the padded step inputs.
- :mod:`.warm_up`: ``warmup_serve`` (``transformers_tpu_ext.warmup(model, work="serve")``), a manager warmed up.
- :mod:`.tensor_parallel` (pure): which tensor-parallel models serve on TPU (``tp_path``) and the
  heads each chip computes and caches.
- :mod:`.sampling` (pure): when a manager's temperature, top-k and top-p are per-request tensors of
  the step (``per_request_path``) rather than numbers compiled into its programs.
- ``patch_continuous_batching``: the glue into ``generate_batch``, ``ContinuousBatchingManager``
  and ``transformers serve --continuous-batching``; ``wrap_attention``: the model's attention while a
  manager lives, given back on every exit path; ``wrap_cache``: the paged cache (one full-attention
  group, int8 pages, sized from the HBM); ``wrap_requests``: the requests a manager accepts;
  ``patch_recompile_guard_serve``: the recompile guard
  (``compilation``) around each step and the warm-up.

See ``docs/serving.md``.
"""

from __future__ import annotations

from .settings import ServeSettings, configure, current, reset

__all__ = ["ServeSettings", "configure", "current", "reset"]
