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


@pytest.fixture
def legacy_device_apis(monkeypatch):
    """``TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1`` for one test (torch_tpu reads it once, at import): the
    simulated ``torch.tpu``'s internal names warn once instead of raising, counting from this test."""
    from transformers_tpu_ext.testing import internal_apis

    monkeypatch.setattr(internal_apis, "STRICT", False)
    monkeypatch.setattr(internal_apis, "_warned", set())
    return internal_apis
