"""pytest plugin (``pytest11`` entry point): the ``simulated_tpu``, ``no_new_programs`` and ``cache_only`` fixtures.

Importing this module installs nothing and does not import torch; the simulated TPU is installed
the first time a test asks for the fixture.

Scope: the simulator cannot be uninstalled (PyTorch renames its PrivateUse1 backend once per
process), so the fixture *parks* it after each test: until a test asks for the fixture again (or
calls ``testing.install()``), the process sees no TPU (``torch.accelerator.is_available()`` is
False, ``device_count()`` 0), as if it had not been installed. A test that does not ask for the
fixture therefore sees the same machine whether it runs before or after one that does. When the
simulator was installed before the fixture first ran (``TRANSFORMERS_TPU_EXT_SIMULATE`` for the
whole run, or your own ``testing.install()`` in a conftest), it is yours: the fixture never parks it.
"""

from __future__ import annotations

import sys
from typing import Any, Iterator

import pytest

#: Whether the fixture installed the simulator (and so parks it between tests); None until first use.
_owned: bool | None = None


@pytest.fixture
def simulated_tpu() -> Iterator[Any]:
    """The simulated TPU (installed once per process), with zeroed counters and the default
    configuration (4 v6e chips); after the test, its configuration is restored, TorchDynamo's
    caches are reset (so every test counts compiled graphs from scratch), and the simulator is
    parked (hidden) until the next test that asks for it, unless it was installed before the fixture."""
    global _owned
    from . import install, is_installed

    if _owned is None:
        _owned = not is_installed()
    sim = install()  # unparks it
    sim.reset_config()
    sim.reset_counters()
    _reset_dynamo()
    try:
        yield sim
    finally:
        sim.reset_config()
        sim.reset_counters()
        _reset_dynamo()
        if _owned:
            sim.park()


def _reset_dynamo() -> None:
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


@pytest.fixture
def no_new_programs() -> Any:
    """``testing.no_new_programs``: a context manager failing the test when its block makes the TPU
    compile a program the process did not hold (steady state). Works on the simulated TPU (ask for
    ``simulated_tpu`` too) and on torch_tpu::

        def test_service_is_warm(simulated_tpu, no_new_programs):
            warmup(model, max_prompt_length=64, max_new_tokens=16)
            with no_new_programs("requests within the warmed-up buckets"):
                serve_some_requests(model)
    """
    from .programs import no_new_programs as context

    return context


@pytest.fixture
def cache_only() -> Any:
    """``testing.cache_only``: a context manager running its block in torch_tpu's cache-only mode,
    failing the test at the first program the process does not hold (graphs and eager operations)::

        def test_service_is_warm(simulated_tpu, cache_only):
            warmup(model, max_prompt_length=64, max_new_tokens=16)
            with cache_only("requests within the warmed-up buckets"):
                serve_some_requests(model)
    """
    from .programs import cache_only as context

    return context
