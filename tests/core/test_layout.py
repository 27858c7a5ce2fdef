"""The package's layout: one folder per capability, one registry, no import cycles, the map in the docs.

Static checks over the source tree (no torch, no Transformers imported): they run in milliseconds.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
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


def _imports(module: str, path: Path, modules: dict[str, Path], tree: ast.AST | None = None) -> set[str]:
    """Every module of the package that ``module`` imports, at module level or inside functions
    (or in ``tree``, some of its statements)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree if tree is not None else ast.parse(path.read_text())):
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
    from transformers_tpu_ext.generation.warm_up import warmup_generate
    from transformers_tpu_ext.training.warm_up import warmup as warmup_train

    assert callable(ext.warmup) and not hasattr(compilation, "warmup")  # one warmup, the work as argument, above the capabilities
    assert generation.warmup is warmup_generate and training.warmup is warmup_train
    assert callable(generation.configure) and callable(serving.configure) and callable(compilation.configure)
    assert training.BucketCollator.__module__ == "transformers_tpu_ext.training.collator"
    assert callable(training.warmup)


def test_every_capability_with_a_patch_is_a_capability_of_the_registry():
    assert set(registry.PATCHES.values()) <= set(registry.CAPABILITIES)
    assert all((PACKAGE / name / "__init__.py").is_file() for name in registry.CAPABILITIES)


# -------------------------------------------------------------------------------------------------
# Layers: a module imports (at module level or inside a function) only its own layer or lower ones.

#: The package's layers, lowest first, with the top-level names (modules and folders) each holds.
#: ``compilation/`` is a service below the capabilities: they call it (the compile cache, the recompile
#: guard, TorchDynamo's recompile limit); each capability's warm-up and guard glue is in its own folder.
#: A module takes the layer of its most specific entry: ``settings.parser`` (the one parser the
#: capabilities declare their settings with) is core; ``settings`` (which checks every capability's
#: settings at activation) sits with the entry points.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("core", frozenset({"_version", "log", "config", "registry", "backend", "ladders", "core", "settings.parser"})),
    ("compilation", frozenset({"compilation"})),
    (
        "capabilities",
        frozenset({"placement", "kernels", "parallelism", "quantization", "generation", "serving", "training", "inference",
                   "experts"}),
    ),
    ("simulated TPU", frozenset({"testing"})),
    ("entry points", frozenset({"activation", "settings", "cli", "launch", "_autoload", "__init__"})),
)


def _top(module: str) -> str:
    parts = module.split(".")
    if ".".join(parts[1:3]) in _layer_of():
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else "__init__"


def _layer_of() -> dict[str, int]:
    return {name: index for index, (_, names) in enumerate(LAYERS) for name in names}


def _upward(graph: dict[str, set[str]], layer_of: dict[str, int]) -> list[tuple[str, str]]:
    """Every import ``(importer, imported)`` from a lower layer up to a higher one."""
    return sorted(
        (module, other) for module, imported in graph.items() for other in imported if layer_of[_top(other)] > layer_of[_top(module)]
    )


def test_every_top_level_module_and_folder_has_one_layer():
    placed = [name for _, names in LAYERS for name in names]
    assert len(placed) == len(set(placed)), "a name in two layers"
    assert {_top(name) for name in _modules()} == set(placed)
    assert all(f"{NAME}.{name}" in _modules() for name in placed if "." in name)


def test_no_import_runs_from_a_lower_layer_up_to_a_higher_one():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _upward(graph, _layer_of()) == []


def test_the_layer_check_finds_an_upward_import_also_inside_a_function(tmp_path):
    source = tmp_path / "guard.py"
    source.write_text("def advice():\n    from ..generation import config\n")
    modules = {f"{NAME}.compilation.guard": source, f"{NAME}.generation.config": source}
    graph = {f"{NAME}.compilation.guard": _imports(f"{NAME}.compilation.guard", source, modules)}
    assert _upward(graph, _layer_of()) == [(f"{NAME}.compilation.guard", f"{NAME}.generation.config")]


# -------------------------------------------------------------------------------------------------
# Decision modules stay pure: no torch (nor another heavy library) and no glue at module level.

#: Libraries a decision module never imports at module level (a call that needs one imports it).
HEAVY = ("torch", "transformers", "accelerate", "wrapt", "numpy", "jax")
#: The core's pure modules, shared by the capabilities' decisions.
CORE_DECISIONS = (f"{NAME}.ladders", f"{NAME}.core.length_readers", f"{NAME}.core.topology")


def _architecture_column(index: int) -> set[str]:
    """The modules named in column ``index`` of docs/architecture.md's capability table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    found = set()
    for line in text.splitlines():
        if not (line.startswith("| ") and "`" in line):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        cell = cells[index]
        while re.search(r"\([^()]*\)", cell):  # what follows a name in parentheses is its description
            cell = re.sub(r"\([^()]*\)", "", cell)
        found.update(f"{NAME}.{cells[1].strip('`/')}.{name}" for name in re.findall(r"`([a-z0-9_]+)`", cell))
    return found


def decision_modules() -> list[str]:
    """The "decisions (pure)" column of docs/architecture.md, and the core's pure modules."""
    return sorted(_architecture_column(3)) + list(CORE_DECISIONS)


def glue_modules() -> set[str]:
    """Patches, wrappers, and the "runtime and helpers" column of docs/architecture.md."""
    modules = _modules()
    return {m for m in modules if m.rpartition(".")[2].startswith(("patch_", "wrap_"))} | (_architecture_column(4) & set(modules))


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The import statements that run when the module is imported (not those inside functions)."""
    found: list[ast.stmt] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + [n for handler in node.handlers for n in handler.body] + node.orelse)
            elif isinstance(node, (ast.With, ast.ClassDef)):
                visit(node.body)

    visit(tree.body)
    return found




def test_the_decision_modules_exist_and_are_not_glue():
    modules = _modules()
    decisions = decision_modules()
    assert len(decisions) >= 20 and set(decisions) <= set(modules)
    assert not set(decisions) & glue_modules()


@pytest.mark.parametrize("module", decision_modules())
def test_a_decision_module_imports_neither_torch_nor_glue_at_module_level(module):
    modules = _modules()
    path = modules[module]
    statements = _module_level(ast.parse(path.read_text()))
    heavy = [a.name for s in statements if isinstance(s, ast.Import) for a in s.names if a.name.split(".")[0] in HEAVY]
    heavy += [s.module for s in statements if isinstance(s, ast.ImportFrom) and not s.level and (s.module or "").split(".")[0] in HEAVY]
    assert heavy == []
    at_import = _imports(module, path, modules, ast.Module(body=statements, type_ignores=[]))
    assert at_import & glue_modules() == set()


def test_importing_every_decision_module_imports_no_torch():
    code = (
        "import importlib, sys\n"
        f"for name in {decision_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules and m != 'wrapt'))\n"  # the package's own import loads wrapt
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRANSFORMERS_TPU_EXT_SIMULATE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


# -------------------------------------------------------------------------------------------------
# The layout figures docs/architecture.md states.

#: At most this many modules at the package's top (``transformers_tpu_ext/*.py``).
TOP_MODULES_LIMIT = 12
#: No module over this many lines.
MODULE_LINE_LIMIT = 450


def _figures() -> dict[str, str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layout figures", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^- ([a-z ,']+): (.+)$", section, re.M))


def test_the_layout_figures_in_the_docs_hold():
    figures = _figures()
    assert figures["layers, lowest first"] == " -> ".join(f"`{name}`" for name, _ in LAYERS)
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert figures["modules at the package's top"] == f"{len(top)} (at most {TOP_MODULES_LIMIT})"
    assert len(top) <= TOP_MODULES_LIMIT, top
    assert figures["largest module"] == f"at most {MODULE_LINE_LIMIT} lines"
    long = {
        p.relative_to(PACKAGE).as_posix(): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MODULE_LINE_LIMIT
    }
    assert long == {}
