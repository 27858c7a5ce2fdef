"""Shared fixtures of the simulator's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def plugin_patches_off():
    """The plugin's patches off for a module's tests: they test the simulated device, not the plugin."""
    import transformers_tpu_ext as ext

    was_active = ext.is_active()
    ext.deactivate()
    yield
    if was_active:
        ext.activate()
