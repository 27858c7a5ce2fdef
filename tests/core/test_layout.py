"""The package's layout: one folder per capability, one registry, no import cycles, the map in the docs.

Static checks over the source tree (no torch, no Transformers imported): they run in milliseconds.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from transformers_tpu_ext import registry

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "transformers_tpu_ext"
NAME = "transformers_tpu_ext"

#: Glue (wrappers and the runtime they call) stays small; decisions go to pure modules.
GLUE_LINE_LIMIT = 400


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of the package that ``module`` imports, at module level or inside functions."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(NAME):
                continue
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith(NAME))
    return {name for name in found if name in modules and name != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_in_the_package():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", registry.REGISTRY)
def test_every_patch_lives_in_its_capability_folder_with_the_contract(name):
    module = importlib.import_module(registry.module_name(name))
    assert Path(module.__file__) == PACKAGE / registry.capability(name) / f"patch_{name}.py"
    assert module.NAME == name
    assert isinstance(module.TARGET, str) and module.TARGET
    assert module.DISTRIBUTION in {"transformers", "accelerate", "torch"}
    assert callable(module.apply) and callable(module.revert)


def test_every_patch_module_is_registered():
    on_disk = {path.stem.removeprefix("patch_") for path in PACKAGE.rglob("patch_*.py")}
    assert on_disk == set(registry.REGISTRY)


def test_every_subpackage_says_what_lives_there():
    for init in PACKAGE.glob("*/__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and len(docstring.splitlines()) >= 3, f"{init.parent.name}/__init__.py has no map of its folder"


def test_glue_modules_stay_small():
    glue = [p for p in PACKAGE.rglob("*.py") if p.stem.startswith(("patch_", "wrap_")) or p.stem == "runtime"]
    assert glue, "no glue module found"
    long = {str(p.relative_to(PACKAGE)): n for p in glue if (n := len(p.read_text().splitlines())) > GLUE_LINE_LIMIT}
    assert long == {}


def test_the_architecture_table_matches_the_registry():
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    documented: dict[str, tuple[str, str]] = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        folder = cells[1].strip("`/")
        for name, target in re.findall(r"`([a-z0-9_]+)`: `([a-z0-9_.]+)`", cells[2]):
            documented[name] = (folder, target)
    expected = {
        name: (registry.capability(name), importlib.import_module(registry.module_name(name)).TARGET)
        for name in registry.REGISTRY
    }
    assert documented == expected


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("transformers_tpu_ext.launch", "transformers_tpu_ext.cli.launch"),
    ],
)
def test_import_paths_the_docs_named_before_the_folders_still_import(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_documented_names_of_capability_packages():
    import transformers_tpu_ext as ext
    from transformers_tpu_ext import compilation, generation, serving, training
    from transformers_tpu_ext.generation.warmup import warmup_generate
    from transformers_tpu_ext.training.warmup import warmup as warmup_train

    assert callable(ext.warmup) and not hasattr(compilation, "warmup")  # one warmup, the work as argument, above the capabilities
    assert generation.warmup is warmup_generate and training.warmup is warmup_train
    assert callable(generation.configure) and callable(serving.configure) and callable(compilation.configure)
    assert training.BucketCollator.__module__ == "transformers_tpu_ext.training.collator"
    assert callable(training.warmup)
