"""The simulated ``torch.tpu`` against torch-tpu 0.2.0's own sources: every name, signature and refusal.

torch_tpu declares its whole public surface in one table, ``_PUBLIC_MODULES`` of
``torch_tpu/_internal/public_api.py`` (``"torch.tpu.pallas": {"jax_op": "torch_tpu._internal.pallas.pallas:jax_op"}``...),
and serves ``torch.tpu._<name>`` from its device-module class. This file reads that table and the
definitions it names with ``ast`` (nothing of the wheel is imported: most of it needs its C extension),
and checks the simulator (``testing/tpu_module.py``, ``tpu_distributed.py``, ``pallas.py``) against it:

- every public name the simulator offers is one torch_tpu exports, in the same module; the names it does
  not offer are :data:`NOT_SIMULATED`, each with its reason (a user's call raises ``AttributeError``);
- each offered function, class and the private functions the plugin calls (:data:`PRIVATE_CALLED`:
  ``_set_cache_only``, ``_get_cache_*``...) takes the same parameters: names, kinds and defaults;
- what torch_tpu refuses in Python with ``NotImplementedError`` (a method whose body is only that
  raise: streams' ``query``, events' ``ipc_handle``...), the simulator refuses too; what it does in C
  (``_device_ops_backend``: the compile cache's counters, ``synchronize``...) is behaviour no source shows,
  listed by :func:`test_what_is_c_is_said`;
- ``get_pallas_mesh``'s refusals: the wheel's own Python (``_get_pallas_mesh``, loaded with its C extension
  stubbed, ``tests/_torch_tpu_wheel.py``) and the simulator's on the same arguments.

``TORCH_TPU_SOURCES=<a directory holding torch_tpu/>`` or an installed torch-tpu provides the sources
(``scripts/check_torch_tpu.sh`` runs this with ``TORCH_TPU_SOURCES_REQUIRED=1``); without them it skips.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest

from _torch_tpu_wheel import load_pallas, sources

PUBLIC_API = Path("_internal", "public_api.py")

#: Public names of torch_tpu 0.2.0 the simulated TPU does not offer, and why.
NOT_SIMULATED = {
    "torch.tpu.compiler": {"custom_compiler_options": "XLA options of eager ops: nothing compiles XLA here"},
    "torch.tpu.ops": {name: "TPU-only kernels (SparseCore, collectives, Pallas attention): not modelled" for name in (
        "align_jagged_to_multiple", "all_gather_dim", "max_pool1d", "max_pool1d_backward", "max_pool2d",
        "max_pool2d_backward", "max_pool3d", "max_pool3d_backward", "optimization_barrier", "ragged_all_to_all",
        "ragged_dot", "ragged_dot_weight_grad", "recv", "reduce_scatter_dim", "send", "sparse_dense_matmul",
        "sparse_dense_matmul_activation_unstack", "sparse_dense_matmul_grad_with_adagrad",
        "sparse_dense_matmul_grad_with_adam", "sparse_dense_matmul_grad_with_sgd", "sparse_dense_matmul_gradient_stack",
        "sparse_gather", "sparse_gather_backward", "sparse_iota", "sparse_map_row", "splash_sdpa", "strip_jagged_padding")},
    "torch.tpu.optimizers": {name: "torch_tpu's functional optimizers: the plugin uses torch.optim's" for name in (
        "AdamW", "Muon", "Optimizer", "Sgd", "SingleTraceTrainer")},
    "torch.tpu.profiler": {"TpuProfilerConfig": "the device tracer: no device to trace"},
}
#: ``torch.tpu._<name>`` functions (served from torch_tpu's device-module class) the plugin or its tests call.
PRIVATE_CALLED = ("_set_cache_only", "_set_dump_on_cache_miss", "_get_cache_requests", "_get_cache_hits",
                  "_get_cache_misses", "_get_cache_stats", "_clear_cache")
_DEVICE_CLASS = "torch_tpu._internal.device._device_module:TpuDeviceModule"


def _simulated() -> dict[str, Any]:
    from transformers_tpu_ext.testing import tpu_module

    return {"torch.tpu": tpu_module, "torch.tpu.compiler": tpu_module.compiler, "torch.tpu.distributed": tpu_module.distributed,
            "torch.tpu.ops": tpu_module.ops, "torch.tpu.optimizers": tpu_module.optimizers,
            "torch.tpu.pallas": tpu_module.pallas, "torch.tpu.profiler": tpu_module.profiler}


def _offered(name: str, namespace: Any) -> set[str]:
    names = getattr(namespace, "__all__", None) or vars(namespace)
    return {n for n in names if not n.startswith("_")} - {f.rpartition(".")[2] for f in _simulated() if f.count(".") == 2}


# --- reading the wheel (ast only) ----------------------------------------------------------------


class _Wheel:
    def __init__(self, root: Path) -> None:
        self.root, self._trees = root, {}
        tree = self.tree("torch_tpu._internal.public_api")
        names = {}
        for node in tree.body:
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
            if isinstance(target, ast.Name) and node.value is not None:
                names[target.id] = node.value
        self._names = names
        self.modules = self._value(names["_PUBLIC_MODULES"])

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            path = self.root.parent / Path(*module.split("."))
            path = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
            self._trees[module] = ast.parse(path.read_text())
        return self._trees[module]

    def _value(self, node: ast.AST) -> Any:  # the table's literals, f-strings, _tpu_attr(), Property(), ModuleSpec()
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self._value(self._names[node.id])
        if isinstance(node, ast.JoinedStr):
            return "".join(self._value(v.value) if isinstance(v, ast.FormattedValue) else v.value for v in node.values)
        if isinstance(node, ast.Dict):
            return {self._value(k): self._value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "_tpu_attr":
                return f"{_DEVICE_CLASS}.{self._value(node.args[0])}"
            if node.func.id == "Property":
                return ("property", self._value(node.args[0]))
            if node.func.id == "ModuleSpec":
                return {k.arg: self._value(k.value) for k in node.keywords}
        raise ValueError(f"unexpected in _PUBLIC_MODULES: {ast.dump(node)[:200]}")

    def definition(self, target: str) -> ast.AST | None:
        """The ``def``/``class`` a ``"pkg.mod:Qual.name"`` target names (through base classes and aliases)."""
        module, _, qualname = target.partition(":")
        tree = self.tree(module)
        classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        top = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        first, *rest = qualname.split(".")
        if not rest:
            return top.get(first)
        cls = classes.get(first)
        while cls is not None:
            for node in cls.body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == rest[0]:
                    return node
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == rest[0] for t in node.targets):
                    return self._alias(tree, module, node.value, classes)
            bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
            cls = classes.get(bases[0]) if bases else None
        return None

    def _alias(self, tree: ast.Module, module: str, value: ast.AST, classes: dict) -> ast.AST | None:
        if isinstance(value, ast.Name):  # device = _DeviceContext
            return classes.get(value.id)
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):  # precision = _precision_module.precision
            module = self.imported(tree, value.value.id)
            return None if module is None else self.definition(f"{module}:{value.attr}")
        return None

    @staticmethod
    def imported(tree: ast.Module, name: str) -> str | None:
        """The module a top-level ``import a.b as name`` / ``from a import b [as name]`` binds to ``name``."""
        for node in tree.body:
            for alias in getattr(node, "names", ()) if isinstance(node, (ast.Import, ast.ImportFrom)) else ():
                if (alias.asname or alias.name) == name:
                    return alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
        return None

    def made_class(self, target: str) -> ast.ClassDef | None:
        """The class a factory (``TpuDeviceModule.Stream``: ``return streams.TpuStream(...)``) returns."""
        factory, module = self.definition(target), target.partition(":")[0]
        for node in ast.walk(factory) if isinstance(factory, ast.FunctionDef) else ():
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
                call = node.value.func
                if isinstance(call, ast.Attribute) and isinstance(call.value, ast.Name):
                    source = self.imported(self.tree(module), call.value.id)
                    found = None if source is None else self.definition(f"{source}:{call.attr}")
                    if isinstance(found, ast.ClassDef):
                        return found
        return None


@pytest.fixture(scope="module")
def wheel() -> _Wheel:
    return _Wheel(sources(PUBLIC_API))


def _parameters_of_definition(node: ast.AST) -> list[tuple[str, str, str | None]] | None:
    if isinstance(node, ast.ClassDef):  # its constructor: __init__, else __new__
        node = next((n for name in ("__init__", "__new__") for n in node.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if not isinstance(node, ast.FunctionDef):
        return None
    a = node.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    out = [(p.arg, "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD", d)
           for i, (p, d) in enumerate(zip(positional, defaults))]
    if out and out[0][0] in ("self", "cls"):
        out = out[1:]
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", None))
    out += [(p.arg, "KEYWORD_ONLY", None if d is None else ast.unparse(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", None))
    return out


def _parameters_of(obj: Any) -> list[tuple[str, str, str | None]]:
    if inspect.isclass(obj):
        obj = obj.__init__
    return [(p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default))
            for p in inspect.signature(obj).parameters.values() if p.name not in ("self", "cls")]


def _shared(wheel: _Wheel) -> list[tuple[str, str, Any]]:
    out = []
    for module, namespace in _simulated().items():
        for name, target in sorted(wheel.modules[module]["exports"].items()):
            if hasattr(namespace, name):
                out.append((f"{module}.{name}", target, getattr(namespace, name)))
    from transformers_tpu_ext.testing import tpu_module

    out += [(f"torch.tpu.{name}", f"{_DEVICE_CLASS}.{name}", getattr(tpu_module, name)) for name in PRIVATE_CALLED]
    return out


# --- the checks ------------------------------------------------------------------------------------


def test_the_simulator_offers_only_torch_tpus_names_and_says_which_it_lacks(wheel):
    for module, namespace in _simulated().items():
        exported = set(wheel.modules[module]["exports"])
        offered = _offered(module, namespace)
        assert offered <= exported, f"{module}: the simulator offers names torch_tpu 0.2.0 lacks: {offered - exported}"
        assert exported - offered == set(NOT_SIMULATED.get(module, {})), module
    assert set(_simulated()) == set(wheel.modules)  # every public module of the wheel, no other


def test_every_shared_function_and_class_takes_torch_tpus_parameters(wheel):
    problems, compared = [], 0
    for name, target, obj in _shared(wheel):
        if isinstance(target, tuple):  # a module property (eager_mode...): a value, no parameters
            continue
        node = wheel.definition(target)
        expected = _parameters_of_definition(node) if node is not None else None
        if expected is None:
            continue  # an enum (EagerMode, Precision) or a generator tuple: no signature to compare
        compared += 1
        got = _parameters_of(obj)
        if [(n, k) for n, k, _ in got] != [(n, k) for n, k, _ in expected]:
            problems.append(f"{name}: torch_tpu {expected}, simulated {got}")
        elif [d is None for *_, d in got] != [d is None for *_, d in expected] or any(
            w is not None and g != w and g != repr(_literal(w)) for (*_, g), (*_, w) in zip(got, expected)
        ):
            problems.append(f"{name}: defaults torch_tpu {expected}, simulated {got}")
    assert not problems, "\n".join(problems)
    assert compared >= 30  # the device module, streams, events, distributed, pallas, the compile cache


def _literal(source: str) -> Any:
    try:
        return ast.literal_eval(source)
    except ValueError:
        return source


def _only_raises_not_implemented(node: ast.FunctionDef) -> bool:
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return (len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None
            and "NotImplementedError" in ast.unparse(body[0].exc))


def test_what_torch_tpu_refuses_in_python_the_simulator_refuses(wheel):
    refused = []
    for name, target, obj in _shared(wheel):
        node = None if isinstance(target, tuple) else wheel.definition(target)
        if isinstance(node, ast.FunctionDef) and inspect.isclass(obj):  # torch.tpu.Stream(): a factory of TpuStream
            node = wheel.made_class(target)
        if isinstance(node, ast.ClassDef) and inspect.isclass(obj):
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef) and _only_raises_not_implemented(m)]
            instance = obj() if methods else None
            for method in methods:
                arguments = [None] * len([p for p in _parameters_of_definition(method) if p[2] is None and p[1].startswith("POS")])
                with pytest.raises(NotImplementedError):
                    getattr(instance, method.name)(*arguments)
                refused.append(f"{name}.{method.name}")
    assert sorted(refused) == ["torch.tpu.Event.from_ipc_handle", "torch.tpu.Event.ipc_handle",
                               "torch.tpu.Stream.priority_range", "torch.tpu.Stream.query"]


def test_what_is_c_is_said(wheel):
    # torch_tpu's Python that only forwards to its C extension (_device_ops_backend): the behaviour is in C,
    # read off strings and symbols (reference/torch_tpu-0.2.0-internals.md), not checkable here.
    in_c = []
    for name, target, _ in _shared(wheel):
        node = None if isinstance(target, tuple) else wheel.definition(target)
        if isinstance(node, ast.FunctionDef) and "_device_ops_backend." in ast.unparse(node):
            in_c.append(name.rpartition(".")[2])
    assert set(PRIVATE_CALLED) <= set(in_c)


def test_get_pallas_mesh_refuses_what_the_wheels_python_refuses(tmp_path):
    import torch.distributed as dist

    from transformers_tpu_ext.testing import pallas as simulated

    pytest.importorskip("jax")
    wheel_pallas = load_pallas()

    def outcome(function, *args, **kwargs):
        try:
            function(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the refusal is what is compared
            return type(error).__name__, str(error)
        return "returned", None

    cases = [((["x", "y"],), {}), ((["x"],), {"mesh_shape": (2,)}), ((["x", "y"],), {"mesh_shape": (1,)})]
    assert not dist.is_initialized()
    assert outcome(wheel_pallas._get_pallas_mesh, ["x"]) == outcome(simulated.get_pallas_mesh, ["x"]) == (
        "RuntimeError", "torch.distributed is not initialized. dist.init_process_group()")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for args, kwargs in cases:
            expected = outcome(wheel_pallas._get_pallas_mesh, *args, **kwargs)
            assert expected[0] == "ValueError"
            assert outcome(simulated.get_pallas_mesh, *args, **kwargs) == expected, (args, kwargs)
    finally:
        dist.destroy_process_group()
