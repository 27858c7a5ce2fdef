"""The training tests: one thread per test (a loaded 2-core machine runs these tiny models ten times
slower with two), and Accelerate's process-wide state and the TPU's cache-only mode reset after each."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def one_thread():
    try:
        import torch
    except ImportError:  # pragma: no cover - the tests that need torch skip themselves
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    cache_only = getattr(getattr(torch, "tpu", None), "_set_cache_only", None)
    if callable(cache_only):  # a test that failed in cache-only mode leaves no later test in it
        cache_only(False)
    try:
        import _training

        _training.reset_accelerate()
    except ImportError:  # pragma: no cover - accelerate missing
        pass
