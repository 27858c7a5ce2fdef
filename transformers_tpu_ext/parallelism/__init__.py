"""Tensor parallelism: ``DistributedConfig(tp_size=N)`` works for models the default plan fails on.

- :mod:`.tp_plans` (pure): plan rewriting (key-value heads not divisible by ``tp_size``, tied
  embeddings), the public registry of rewriters (``register_rewriter``), the plan checks.
- :mod:`.heads` (pure): head counts of a config, the attention blocks of a plan, the KV-head replication
  layout (also importable from :mod:`.tp_plans`).
- ``patch_tp_plan_rewrite``: hands each load's effective plan to :mod:`.tp_plans`, logs the rewrites.
- ``patch_tp_kv_cache``: sizes the static KV cache for the heads a rank holds after a rewrite.

Launching one process per chip is ``transformers-tpu launch`` (:mod:`transformers_tpu_ext.cli.launch`);
which process counts a chip generation runs is :mod:`transformers_tpu_ext.core.topology`.
See ``docs/tensor-parallelism.md``.
"""
