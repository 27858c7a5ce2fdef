"""The simulator's table of torch_tpu's internal ``torch.tpu`` names, against the wheel's own sources.

No simulated TPU here: ``scripts/check_torch_tpu.sh`` runs this file in its venv, where torch-tpu is
installed (and the simulator cannot be). There the wheel's ``torch_tpu/_internal/device/_device_module.py``
is read with ``ast`` (never imported): every ``@annotations.internal_or_experimental(internal_when=
get_torch_version() >= (a, b), prefer=..., strict=_STRICT_INTERNAL_DEVICE_APIS)`` gives a name, a
threshold and a replacement, which must be :data:`INTERNAL_APIS`. ``TORCH_TPU_SOURCES=<a directory
holding torch_tpu/>`` points at unpacked sources instead of the installed package (e.g. the wheel
unpacked in ``/tmp/wheel/src``); without either, those tests are skipped (they fail instead under
``TORCH_TPU_SOURCES_REQUIRED=1``, as ``scripts/check_torch_tpu.sh`` runs them).
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

import pytest

from transformers_tpu_ext.testing import internal_apis
from transformers_tpu_ext.testing.internal_apis import ALLOW_ENV, FRAMEWORK_PACKAGES, INTERNAL_APIS, InternalAPI

SOURCES_ENV = "TORCH_TPU_SOURCES"
DEVICE_MODULE = Path("_internal", "device", "_device_module.py")
ANNOTATIONS = Path("_internal", "utils", "annotations.py")


# --- the table's rules (pure) ------------------------------------------------------------------


def test_torch_release_decides_which_names_are_internal():
    assert internal_apis.internal_names((2, 10, 1)) == frozenset()
    at_2_11 = {"current_device", "current_stream", "device", "device_count", "is_available", "set_device", "set_stream", "synchronize"}
    assert internal_apis.internal_names((2, 11, 0)) == internal_apis.internal_names((2, 12, 1)) == at_2_11
    assert internal_apis.internal_names((2, 13, 0)) == at_2_11 | {"get_rng_state", "initial_seed"}
    assert internal_apis.internal_names((2, 15)) == set(INTERNAL_APIS)


def test_torch_versions_are_read_as_torch_tpu_reads_them():
    assert internal_apis.parse_version("2.13.0+cpu") == (2, 13, 0)
    assert internal_apis.parse_version("2.14.0a0+git1234") == (2, 14, 0)
    assert internal_apis.parse_version("2.12.0.dev20260101") == (2, 12, 0)


@pytest.mark.parametrize(
    "module, framework",
    [
        ("torch", True), ("torch.random", True), ("torch.accelerator", True), ("torch_tpu._internal.x", True),
        ("transformers_tpu_ext.testing.tpu_module", True), ("transformers_tpu_ext.testing", True),
        ("torchvision", False), ("torch_tpu_extra", False), ("accelerate.checkpointing", False),
        ("transformers_tpu_ext.backend", False), ("transformers_tpu_ext.testing_extra", False), ("__main__", False),
        (None, False), ("", False),
    ],
)
def test_framework_callers_are_torch_torch_tpu_and_the_simulator(module, framework):
    assert internal_apis.is_framework_module(module) is framework


# --- against the wheel --------------------------------------------------------------------------


def _sources() -> Path:
    given = os.environ.get(SOURCES_ENV)
    if given:
        root = Path(given) / "torch_tpu"
        assert (root / DEVICE_MODULE).is_file(), f"{SOURCES_ENV}={given}: no torch_tpu/{DEVICE_MODULE} there"
        return root
    # scripts/check_torch_tpu.sh sets TORCH_TPU_SOURCES_REQUIRED=1: there a skip would hide the check.
    missing = pytest.fail if os.environ.get("TORCH_TPU_SOURCES_REQUIRED") else pytest.skip
    spec = importlib.util.find_spec("torch_tpu")  # found, not imported
    if spec is None or not spec.submodule_search_locations:
        missing(f"torch_tpu is not installed (scripts/check_torch_tpu.sh installs it; or set {SOURCES_ENV})")
    root = Path(next(iter(spec.submodule_search_locations)))
    if not (root / DEVICE_MODULE).is_file():
        missing(f"this torch_tpu ({root}) ships no Python source for {DEVICE_MODULE}")
    return root


def _decorator_name(node: ast.expr) -> str | None:
    func = node.func if isinstance(node, ast.Call) else node
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _threshold(node: ast.expr) -> tuple[int, ...]:
    """``get_torch_version() >= (a, b)`` -> ``(a, b)``."""
    assert isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.GtE), ast.dump(node)
    assert isinstance(node.left, ast.Call) and _decorator_name(node.left) == "get_torch_version", ast.dump(node)
    return tuple(ast.literal_eval(node.comparators[0]))


def wheel_internal_apis(source: str) -> dict[str, tuple[InternalAPI, str, str]]:
    """``torch.tpu`` name -> (threshold and replacement, the decorated object's name, its ``strict=``)."""
    tree = ast.parse(source)
    # Decorated classes are exposed under another name in a class body (``device = _DeviceContext``).
    aliases = {
        stmt.value.id: stmt.targets[0].id
        for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
        for stmt in cls.body
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
        and isinstance(stmt.value, ast.Name)
    }
    found: dict[str, tuple[InternalAPI, str, str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call) and _decorator_name(decorator) == "internal_or_experimental"):
                continue
            keywords = {k.arg: k.value for k in decorator.keywords}
            name = aliases.get(node.name, node.name) if isinstance(node, ast.ClassDef) else node.name
            assert name not in found, f"{name} decorated twice"
            since = _threshold(keywords["internal_when"])
            found[name] = (
                InternalAPI(since, ast.literal_eval(keywords["prefer"])),  # type: ignore[arg-type]
                node.name,
                ast.unparse(keywords.get("strict", ast.Constant(True))),
            )
    return found


def test_the_table_is_the_wheels():
    root = _sources()
    wheel = wheel_internal_apis((root / DEVICE_MODULE).read_text())
    assert {name: api for name, (api, _, _) in wheel.items()} == dict(INTERNAL_APIS)
    # torch.tpu.device is torch_tpu's class _DeviceContext (its error names it so; so does the simulator's).
    assert {name: obj for name, (_, obj, _) in wheel.items() if name != obj} == {"device": "_DeviceContext"}
    assert {strict for _, _, strict in wheel.values()} == {"_STRICT_INTERNAL_DEVICE_APIS"}


def test_the_legacy_switch_and_the_framework_are_the_wheels():
    root = _sources()
    device_module = ast.parse((root / DEVICE_MODULE).read_text())
    strict = next(
        node.value for node in ast.walk(device_module)
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and "_STRICT_INTERNAL_DEVICE_APIS" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
    )
    assert ast.unparse(strict).startswith("not ") and repr(ALLOW_ENV) in ast.unparse(strict).replace('"', "'")
    annotations = ast.parse((root / ANNOTATIONS).read_text())
    packages = next(
        ast.literal_eval(node.value) for node in ast.walk(annotations)
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "_FRAMEWORK_PACKAGES"
    )
    assert tuple(packages) == FRAMEWORK_PACKAGES[:2]


def test_the_parser_reads_a_decorated_method_and_class():
    source = '''
class _Ctx:
    pass

@annotations.internal_or_experimental(internal_when=get_torch_version() >= (2, 11), prefer="torch.accelerator.x", strict=S, experimental_msg="m")
class _Ctx2:
    pass

class Module:
    device = _Ctx2
    @classmethod
    @annotations.internal_or_experimental(internal_when=get_torch_version() >= (2, 13), prefer="torch.accelerator.random.y", strict=S, experimental_msg="m")
    def y(cls):
        pass
    @classmethod
    @experimental("not internal")
    def z(cls):
        pass
'''
    assert wheel_internal_apis(source) == {
        "device": (InternalAPI((2, 11), "torch.accelerator.x"), "_Ctx2", "S"),
        "y": (InternalAPI((2, 13), "torch.accelerator.random.y"), "y", "S"),
    }
