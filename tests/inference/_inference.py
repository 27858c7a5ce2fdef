"""Helpers of the batch-inference tests: cache-only mode, comparing pipeline results with the CPU's."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

import torch

from transformers_tpu_ext.testing.programs import no_new_programs

TOLERANCE = 1e-5


@contextlib.contextmanager
def steady(what: str) -> Iterator[None]:
    """The block compiles nothing: cache-only mode (a new program raises) and no new cache miss."""
    torch.tpu._set_cache_only(True)
    try:
        with no_new_programs(what):
            yield
    finally:
        torch.tpu._set_cache_only(False)


def assert_same(ours: Any, cpu: Any, path: str = "result", tolerance: float = TOLERANCE) -> None:
    """Same structure, keys, order, labels and strings; numbers within ``tolerance`` (:data:`TOLERANCE`)."""
    if isinstance(cpu, dict):
        assert isinstance(ours, dict) and list(ours) == list(cpu), f"{path}: keys {list(ours)} != {list(cpu)}"
        for key in cpu:
            assert_same(ours[key], cpu[key], f"{path}[{key!r}]", tolerance)
    elif isinstance(cpu, (list, tuple)):
        assert isinstance(ours, (list, tuple)) and len(ours) == len(cpu), f"{path}: {len(ours)} items != {len(cpu)}"
        for index, (a, b) in enumerate(zip(ours, cpu)):
            assert_same(a, b, f"{path}[{index}]", tolerance)
    elif hasattr(cpu, "shape") and not isinstance(cpu, (int, float)) and getattr(cpu, "ndim", 0):
        assert tuple(ours.shape) == tuple(cpu.shape), f"{path}: shape {tuple(ours.shape)} != {tuple(cpu.shape)}"
        assert float(abs(torch.as_tensor(ours) - torch.as_tensor(cpu)).max()) <= tolerance, path
    elif isinstance(cpu, float) or type(cpu).__name__.startswith("float"):
        assert math.isclose(float(ours), float(cpu), abs_tol=tolerance), f"{path}: {ours} != {cpu}"
    else:
        assert ours == cpu, f"{path}: {ours!r} != {cpu!r}"
