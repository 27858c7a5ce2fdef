"""``_post_import.register``: hooks after the module's code, at once when already imported, no deadlock."""

from __future__ import annotations

import importlib
import sys

from transformers_tpu_ext.core import _post_import


def _package(tmp_path, name: str) -> None:
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "child.py").write_text("VALUE = 41\nVALUE += 1\n")


def test_a_hook_runs_after_the_module_code_and_the_module_keeps_its_loader(tmp_path, monkeypatch):
    _package(tmp_path, "tpu_ext_hooked_a")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    _post_import.register(lambda module: seen.append(module.VALUE), "tpu_ext_hooked_a.child")
    assert seen == []
    module = importlib.import_module("tpu_ext_hooked_a.child")
    assert seen == [42]  # the whole module had run
    assert type(module.__loader__).__name__ == "SourceFileLoader" and module.__spec__.loader is module.__loader__
    importlib.reload(module)
    assert seen == [42]  # once


def test_a_hook_for_an_imported_module_runs_at_once(tmp_path, monkeypatch):
    _package(tmp_path, "tpu_ext_hooked_b")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("tpu_ext_hooked_b.child")
    seen = []
    _post_import.register(seen.append, "tpu_ext_hooked_b.child")
    assert seen == [module]


def test_the_finder_imports_nothing_itself(tmp_path, monkeypatch):
    # wrapt's finder re-entered the import system (importlib.util.find_spec), which imports the parent
    # package under the global import lock: with another thread running the parent's code, deadlock.
    _package(tmp_path, "tpu_ext_hooked_c")
    monkeypatch.syspath_prepend(str(tmp_path))
    _post_import.register(lambda module: None, "tpu_ext_hooked_c.child")
    finder = next(f for f in sys.meta_path if isinstance(f, _post_import._Finder))
    assert "tpu_ext_hooked_c" not in sys.modules
    spec = finder.find_spec("tpu_ext_hooked_c.child", [str(tmp_path / "tpu_ext_hooked_c")])
    assert spec is not None and spec.name == "tpu_ext_hooked_c.child"
    assert "tpu_ext_hooked_c" not in sys.modules  # the parent was not imported to find the child
