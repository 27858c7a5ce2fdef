"""Post-import hooks that cannot deadlock concurrent imports.

``register(callback, name)`` calls ``callback(module)`` once module ``name`` has been imported (at
once if it already is). It replaces ``wrapt.register_post_import_hook``, whose finder looks the
module up again with ``importlib.util.find_spec(name)`` from inside the import system: that call
imports (or waits for) the parent package while the interpreter's global import lock is held, so a
second thread still running the parent package's code, and needing that lock for an import of its
own, waits forever (seen with two threads importing Transformers modules).

The finder here asks the other finders of ``sys.meta_path`` directly, with the ``path`` the import
system gives it, as the import system itself does: no import, no lock taken. It wraps the loader so
that the callbacks run right after the module's code.
"""

from __future__ import annotations

import sys
import threading
from importlib.abc import Loader, MetaPathFinder
from types import ModuleType
from typing import Any, Callable

__all__ = ["register"]

_lock = threading.Lock()
_hooks: dict[str, list[Callable[[ModuleType], Any]]] = {}


def register(callback: Callable[[ModuleType], Any], name: str) -> None:
    """Call ``callback(module)`` once ``name`` is imported; at once if it is in ``sys.modules``."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(callback)
            if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
                sys.meta_path.insert(0, _Finder())
            return
    callback(module)


class _Finder(MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        with _lock:
            if fullname not in _hooks:
                return None
        for finder in list(sys.meta_path):
            if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader)
            return spec
        return None


class _Loader(Loader):
    """The module's own loader, then the callbacks registered for it."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        # The module sees its own loader, as without hooks.
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        with _lock:
            callbacks = _hooks.pop(module.__name__, [])
        for callback in callbacks:
            callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
