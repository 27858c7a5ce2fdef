"""Serving's warm-up: a continuous-batching manager with every step shape compiled
(``transformers_tpu_ext.warmup(model, work="serve", ...)``); the step shapes themselves are compiled by
:func:`transformers_tpu_ext.serving.runtime.warmup`, which the recompile guard's serve patch marks.
"""

from __future__ import annotations

from typing import Any

__all__ = ["warmup_serve"]


def warmup_serve(
    model: Any,
    *,
    generation_config: Any = None,
    continuous_batching_config: Any = None,
    workload_hints: Any = None,
) -> Any:
    """A continuous-batching manager for ``model`` with every step shape compiled (not started).

    Use it as the service's manager (``manager.start()``), so the programs are the ones it runs; the
    shapes come from the serving settings (``docs/serving.md#settings``).
    """
    manager = model.init_continuous_batching(
        generation_config=generation_config,
        continuous_batching_config=continuous_batching_config,
        workload_hints=workload_hints,
    )
    manager.warmup()  # the recompile guard's serve patch marks it
    return manager
