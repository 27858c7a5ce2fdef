"""Mixture-of-experts layers on TPU: their experts through JAX's megablox grouped matmul.

- ``policy``: which experts calls take the kernel path (``experts_path``), the kernel's tiling, the docs' table.
- ``patch_experts``: registers the ``"grouped_mm"`` experts implementation that dispatches (Transformers'
  ``ExpertsInterface``); ``patch_experts_decode``: ``generate()`` keeps it for decoding where the kernel runs.
- ``runtime``: the dispatcher and the kernel path's forward; ``kernel``: the kernel as torch ops (``jax_op``),
  with their backward.
"""
