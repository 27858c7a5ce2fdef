"""The suite's worker scripts (``tests/<folder>/*_worker.py``, run in a fresh interpreter, most by
``_subprocess.run_python``) are real modules: each compiles and is run by a test of its folder. No test
keeps a long script in a string."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
WORKERS = sorted(p for p in TESTS.rglob("*_worker.py") if p.name != "_worker.py")


@pytest.mark.parametrize("worker", WORKERS, ids=lambda p: str(p.relative_to(TESTS)))
def test_a_worker_compiles_and_is_used(worker: Path) -> None:
    compile(worker.read_text(), str(worker), "exec")
    users = [t for t in worker.parent.glob("test_*.py") if worker.name in t.read_text()]
    assert users, f"no test of {worker.parent.name}/ runs {worker.name}"


def test_no_test_keeps_a_long_script_in_a_string() -> None:
    longest = {}
    for path in TESTS.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
                longest[path.relative_to(TESTS)] = max(longest.get(path.relative_to(TESTS), 0), node.value.count("\n"))
    too_long = {str(p): n for p, n in longest.items() if n > 60}
    assert not too_long, f"scripts of more than 60 lines belong in a *_worker.py module: {too_long}"
