"""torch-tpu's own Python code, run on this TPU-less machine: the wheel's ``_internal/pallas/pallas.py`` (its
``jax_op`` registration and signature checks), loaded from its source with the C extension and the other
torch_tpu modules it imports stubbed (they are not needed to register an op, or to lower its JAX function
through the op's fake kernel).

``sources()`` finds the sources: ``TORCH_TPU_SOURCES=<a directory holding torch_tpu/>`` (e.g. the wheel
unpacked), else the installed ``torch_tpu`` (found, not imported). Without either, the tests that need them
skip, or fail under ``TORCH_TPU_SOURCES_REQUIRED=1`` (``scripts/check_torch_tpu.sh``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any
from unittest import mock

SOURCES_ENV = "TORCH_TPU_SOURCES"
PALLAS = Path("_internal", "pallas", "pallas.py")


def sources(relative: Path = PALLAS) -> Path:
    """The ``torch_tpu`` package directory holding ``relative`` (skips, or fails when required, without one)."""
    import pytest

    given = os.environ.get(SOURCES_ENV)
    if given:
        root = Path(given) / "torch_tpu"
        assert (root / relative).is_file(), f"{SOURCES_ENV}={given}: no torch_tpu/{relative} there"
        return root
    missing = pytest.fail if os.environ.get("TORCH_TPU_SOURCES_REQUIRED") else pytest.skip
    spec = importlib.util.find_spec("torch_tpu")
    if spec is None or not spec.submodule_search_locations:
        missing(f"torch_tpu is not installed (scripts/check_torch_tpu.sh installs it; or set {SOURCES_ENV})")
    root = Path(next(iter(spec.submodule_search_locations)))
    if not (root / relative).is_file():
        missing(f"this torch_tpu ({root}) ships no Python source for {relative}")
    return root


class CKernels:
    """The stub of ``torch_tpu._internal.pallas.tpu_torch_pallas`` (the C extension): records registrations."""

    def __init__(self) -> None:
        self.registered: dict[tuple[str, str], bytes] = {}

    def register_custom_kernel(self, name: str, fingerprint: str, serialized_mlir_module: bytes) -> None:
        self.registered[(name, fingerprint)] = serialized_mlir_module

    def lookup_custom_kernel(self, name: str, fingerprint: str) -> bool:
        return (name, fingerprint) in self.registered

    def call_custom_kernel(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the stubbed torch_tpu runs no kernel (no TPU here)")


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


def _passthrough(*args: Any, **kwargs: Any) -> Any:
    return lambda function: function


def load_pallas(root: Path | None = None) -> types.ModuleType:
    """The wheel's ``pallas.py`` as a fresh module (``torch_tpu_wheel_pallas``), its imports of torch_tpu
    stubbed; ``module.C`` is the stubbed C extension (:class:`CKernels`)."""
    root = root or sources()
    kernels = CKernels()
    stubs: dict[str, types.ModuleType] = {}
    packages = ["torch_tpu", "torch_tpu._internal", "torch_tpu._internal.device", "torch_tpu._internal.distributed",
                "torch_tpu._internal.pallas", "torch_tpu._internal.utils"]
    for name in packages:
        stubs[name] = _module(name, __path__=[])
    leaves = {
        "torch_tpu._internal.device._device_ops_backend": _module("_device_ops_backend", _get_local_device_attributes=dict),
        "torch_tpu._internal.distributed.device_mesh": _module("device_mesh", get_device_assignment=lambda group=None: []),
        "torch_tpu._internal.pallas._compat": _module("_compat", warn_deprecation_with_skip=lambda *a, **k: None),
        "torch_tpu._internal.pallas.tpu_torch_pallas": kernels,
        "torch_tpu._internal.pallas._mock_device": _module("_mock_device", _PallasDevice=object),
        "torch_tpu._internal.utils.annotations": _module("annotations", experimental=_passthrough, deprecated=_passthrough),
    }
    for name, leaf in leaves.items():
        parent, _, attribute = name.rpartition(".")
        setattr(stubs[parent], attribute, leaf)
        stubs[name] = leaf  # type: ignore[assignment]
    for name, make in (("absl", lambda: _module("absl", logging=_module("logging", debug=lambda *a, **k: None))),
                       ("frozendict", lambda: _module("frozendict", frozendict=lambda d: types.MappingProxyType(dict(d))))):
        if importlib.util.find_spec(name) is None:  # torch-tpu's dependencies, where it is not installed
            stubs[name] = make()
            if name == "absl":
                stubs["absl.logging"] = stubs["absl"].logging
    import jax.export  # noqa: F401 - imported before sys.modules is patched (patch.dict drops what comes in meanwhile)
    import numpy  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.library  # noqa: F401

    spec = importlib.util.spec_from_file_location("torch_tpu_wheel_pallas", root / PALLAS)
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(sys.modules, stubs):
        spec.loader.exec_module(module)
    module.C = kernels
    return module
