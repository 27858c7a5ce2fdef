"""TorchDynamo's recompile limit has one owner (compilation.recompile_limit): raised to what each work plans."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from transformers_tpu_ext.compilation import recompile_limit
from transformers_tpu_ext.generation.config import TPUGenerationConfig

PACKAGE = Path(recompile_limit.__file__).resolve().parents[1]


@pytest.fixture
def dynamo_config():
    import torch._dynamo

    config = torch._dynamo.config
    # An earlier test of this process may have left the plugin active with a work's limit raised (generate()
    # compiled in-process): legitimate while the plugin is on, so set aside for these tests and put back.
    outside = (dict(recompile_limit._needs), recompile_limit._saved, config.recompile_limit)
    for work in list(recompile_limit.required()):
        recompile_limit.release(work)
    assert recompile_limit.required() == {} and config.recompile_limit == outside[1 if outside[0] else 2]
    before = config.recompile_limit
    yield config
    for work in list(recompile_limit.required()):
        recompile_limit.release(work)
    config.recompile_limit = before
    recompile_limit._needs.update(outside[0])
    recompile_limit._saved = outside[1]
    config.recompile_limit = outside[2]


def test_the_limit_is_twice_the_graphs_plus_8_and_at_least_the_floor():
    assert recompile_limit.needed(10) == recompile_limit.DEFAULT_FLOOR == 64
    assert recompile_limit.needed(66) == 140
    assert recompile_limit.needed(1, floor=1000) == 1000
    settings = TPUGenerationConfig()
    assert settings.dynamo_recompile_limit() == recompile_limit.needed(settings.forward_graphs(), settings.recompile_limit)


def test_require_raises_never_lowers_and_release_gives_it_back_once_no_work_needs_it(dynamo_config):
    dynamo_config.recompile_limit = 8
    assert recompile_limit.require("generate", 66) == 140
    assert dynamo_config.recompile_limit == 140
    assert recompile_limit.require("serve", 3) == 64
    assert dynamo_config.recompile_limit == 140  # never lowered
    recompile_limit.release("generate")
    assert dynamo_config.recompile_limit == 140  # serve still needs a raised limit
    recompile_limit.release("serve")
    assert dynamo_config.recompile_limit == 8
    recompile_limit.release("serve")  # twice: nothing to give back
    assert dynamo_config.recompile_limit == 8


def test_a_user_limit_above_the_need_is_left_alone(dynamo_config):
    dynamo_config.recompile_limit = 500
    recompile_limit.require("generate", 10)
    recompile_limit.release("generate")
    assert dynamo_config.recompile_limit == 500


def test_no_other_module_sets_the_recompile_limit():
    setters = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
            if any(isinstance(t, ast.Attribute) and t.attr in {"recompile_limit", "cache_size_limit"} for t in targets):
                setters.append(path.relative_to(PACKAGE).as_posix())
    assert sorted(set(setters)) == ["compilation/recompile_limit.py"]
