"""pytest plugin (``pytest11`` entry point): the ``simulated_tpu`` fixture.

Importing this module installs nothing and does not import torch; the simulated TPU is installed
the first time a test asks for the fixture.
"""

from __future__ import annotations

import sys
from typing import Any, Iterator

import pytest


@pytest.fixture
def simulated_tpu() -> Iterator[Any]:
    """The simulated TPU (installed once per process), with zeroed counters and the default
    configuration (4 v6e chips); after the test, its configuration is restored and
    TorchDynamo's caches are reset, so every test counts compiled graphs from scratch."""
    from . import install

    sim = install()
    sim.reset_config()
    sim.reset_counters()
    _reset_dynamo()
    try:
        yield sim
    finally:
        sim.reset_config()
        sim.reset_counters()
        _reset_dynamo()


def _reset_dynamo() -> None:
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
