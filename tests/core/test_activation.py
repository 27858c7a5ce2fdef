"""Activation mechanics, in-process, with fake patches on fake target modules."""

from __future__ import annotations

import sys
import textwrap
import threading
import types
import uuid
import warnings

import pytest
from packaging.specifiers import SpecifierSet

from transformers_tpu_ext import activation
from transformers_tpu_ext.core import versions
from transformers_tpu_ext.core.wrapping import Wraps, fail_safe


def _fake_target(tmp_path, monkeypatch) -> str:
    name = f"tpu_ext_fake_target_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            def greet(who):
                return f"hello {who}"

            class Base:
                def method(self):
                    return "base"

            class Child(Base):
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _fake_patch(name: str, target: str, distribution: str = "wrapt", attribute: str = "greet"):
    """A patch module obeying the contract: wraps ``target.<attribute>`` to shout."""
    patch = types.ModuleType(f"fake_patch_{name}")
    patch.NAME, patch.TARGET, patch.DISTRIBUTION = name, target, distribution
    patch.calls = {"apply": 0, "revert": 0}
    wraps = Wraps()

    def shout(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs).upper()

    def apply(module):
        patch.calls["apply"] += 1
        wraps.wrap(module, attribute, shout)

    def revert():
        patch.calls["revert"] += 1
        wraps.unwrap_all()

    patch.apply, patch.revert = apply, revert
    return patch


@pytest.fixture
def registry(monkeypatch):
    """Point activation at fake patches; restore the real state afterwards."""
    was_active = activation.is_active()
    activation._reset()
    patches: dict[str, types.ModuleType] = {}

    def install(*mods):
        for mod in mods:
            patches[mod.NAME] = mod
        monkeypatch.setattr(activation.registry, "REGISTRY", tuple(patches))
        monkeypatch.setattr(activation, "_patch_module", lambda name: patches[name])

    monkeypatch.delenv("TRANSFORMERS_TPU_EXT_DISABLE", raising=False)
    yield install
    activation._reset()
    monkeypatch.undo()
    if was_active:
        activation.activate()


def test_patch_waits_for_its_target_then_applies(registry, tmp_path, monkeypatch):
    target = _fake_target(tmp_path, monkeypatch)
    patch = _fake_patch("lazy", target)
    registry(patch)
    activation.activate()
    assert target not in sys.modules
    assert activation.active_patches() == []
    module = __import__(target)
    assert activation.active_patches() == ["lazy"]
    assert module.greet("tpu") == "HELLO TPU"


def test_target_already_imported_is_patched_at_once(registry, tmp_path, monkeypatch):
    module = __import__(_fake_target(tmp_path, monkeypatch))
    patch = _fake_patch("eager", module.__name__)
    registry(patch)
    activation.activate()
    assert activation.active_patches() == ["eager"]
    assert module.greet("x") == "HELLO X"


def test_activate_is_idempotent_and_thread_safe(registry, tmp_path, monkeypatch):
    module = __import__(_fake_target(tmp_path, monkeypatch))
    patch = _fake_patch("once", module.__name__)
    registry(patch)
    barrier = threading.Barrier(8)

    def race():
        barrier.wait()
        activation.activate()

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    activation.activate()
    assert patch.calls["apply"] == 1
    assert module.greet("x") == "HELLO X"  # wrapped exactly once


def test_deactivate_restores_the_exact_original_and_reactivation_reapplies(registry, tmp_path, monkeypatch):
    module = __import__(_fake_target(tmp_path, monkeypatch))
    original = module.greet
    patch = _fake_patch("cycle", module.__name__)
    registry(patch)
    activation.activate()
    assert module.greet is not original
    activation.deactivate()
    assert module.greet is original
    assert activation.active_patches() == []
    activation.activate()
    assert activation.active_patches() == ["cycle"]
    assert module.greet("a") == "HELLO A"
    assert patch.calls == {"apply": 2, "revert": 1}


def test_hook_registered_while_active_does_nothing_after_deactivate(registry, tmp_path, monkeypatch):
    target = _fake_target(tmp_path, monkeypatch)
    patch = _fake_patch("late", target)
    registry(patch)
    activation.activate()
    activation.deactivate()
    module = __import__(target)  # the hook fires but the plugin is off
    assert module.greet("a") == "hello a"
    assert patch.calls["apply"] == 0


def test_inherited_method_is_reverted_by_deleting_the_override(registry, tmp_path, monkeypatch):
    module = __import__(_fake_target(tmp_path, monkeypatch))
    patch = _fake_patch("inherited", module.__name__, attribute="Child.method")
    registry(patch)
    activation.activate()
    assert module.Child().method() == "BASE"
    assert module.Base().method() == "base"
    activation.deactivate()
    assert "method" not in vars(module.Child)
    assert module.Child().method() == "base"


def test_version_outside_range_skips_with_one_warning(registry, tmp_path, monkeypatch):
    module = __import__(_fake_target(tmp_path, monkeypatch))
    gated = _fake_patch("gated", module.__name__, distribution="wrapt")
    monkeypatch.setattr(versions, "supported_range", lambda dist: SpecifierSet("<1.0"))
    registry(gated)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        activation.activate()
    messages = [str(w.message) for w in caught if issubclass(w.category, activation.TransformersTPUExtWarning)]
    assert len(messages) == 1
    installed = versions.installed_version("wrapt")
    assert f"wrapt {installed} is installed" in messages[0] and "<1.0" in messages[0]
    assert activation.active_patches() == []
    assert "gated" in activation.skipped_patches()
    assert module.greet("a") == "hello a"


def test_broken_patch_is_skipped_and_the_others_still_apply(registry, tmp_path, monkeypatch):
    module = __import__(_fake_target(tmp_path, monkeypatch))
    broken = _fake_patch("broken", module.__name__, attribute="renamed_upstream")
    good = _fake_patch("good", module.__name__)
    registry(broken, good)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        activation.activate()
    assert activation.active_patches() == ["good"]
    reason = activation.skipped_patches()["broken"]
    assert "failed to apply" in reason and "renamed_upstream" in reason
    assert sum("'broken' skipped" in str(w.message) for w in caught) == 1
    assert module.greet("a") == "HELLO A"


@pytest.mark.parametrize("value, expected", [("1", []), ("all", []), ("first", ["second"]), ("first , second", [])])
def test_disable_environment_variable(registry, tmp_path, monkeypatch, value, expected):
    module = __import__(_fake_target(tmp_path, monkeypatch))
    registry(_fake_patch("first", module.__name__), _fake_patch("second", module.__name__, attribute="Base.method"))
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_DISABLE", value)
    activation.activate()
    assert activation.active_patches() == expected
    assert all("TRANSFORMERS_TPU_EXT_DISABLE" in activation.skipped_patches()[n] for n in {"first", "second"} - set(expected))


def test_fail_safe_falls_back_to_upstream_on_our_error_only():
    upstream_calls = []

    def upstream(x):
        upstream_calls.append(x)
        if x < 0:
            raise ValueError("upstream says no")
        return x * 2

    @fail_safe
    def buggy(wrapped, instance, args, kwargs):
        if args[0] == 1:
            raise KeyError("our bug")
        return wrapped(*args, **kwargs) + 1

    assert buggy(upstream, None, (1,), {}) == 2  # our bug: the upstream call still happens
    assert buggy(upstream, None, (2,), {}) == 5
    with pytest.raises(ValueError, match="upstream says no"):
        buggy(upstream, None, (-1,), {})
    assert upstream_calls == [1, 2, -1]


def test_wraps_refuses_to_wrap_twice(tmp_path, monkeypatch):
    module = __import__(_fake_target(tmp_path, monkeypatch))
    original = module.greet
    wraps = Wraps()

    def shout(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs).upper() + "!"

    wraps.wrap(module, "greet", shout)
    wraps.wrap(module, "greet", shout)
    assert module.greet("a") == "HELLO A!"
    wraps.unwrap_all()
    assert module.greet is original


def test_a_target_still_executing_is_patched_once_its_code_has_run(registry, tmp_path, monkeypatch):
    # The entry point fires inside `import torch`, which a target module may be in the middle of:
    # the hook then sees a half-executed module (here: activation happens before `greet` exists).
    name = f"tpu_ext_half_target_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "from transformers_tpu_ext import activation\n"
        "activation.activate()\n"
        "def greet(who):\n"
        "    return f'hello {who}'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    patch = _fake_patch("half", name)
    registry(patch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = __import__(name)
    assert [str(w.message) for w in caught if issubclass(w.category, activation.TransformersTPUExtWarning)] == []
    assert activation.active_patches() == ["half"]
    assert module.greet("tpu") == "HELLO TPU"
    assert patch.calls["apply"] == 1


def test_a_patch_module_that_fails_to_import_is_skipped_alone(registry, tmp_path, monkeypatch):
    module = __import__(_fake_target(tmp_path, monkeypatch))
    good = _fake_patch("good", module.__name__)
    registry(good, _fake_patch("unimportable", module.__name__))
    resolve = activation._patch_module

    def patch_module(name):
        if name == "unimportable":
            raise ImportError("cannot import name 'gone' from 'transformers'")
        return resolve(name)

    monkeypatch.setattr(activation, "_patch_module", patch_module)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        activation.activate()
    assert activation.active_patches() == ["good"]
    assert "failed to import" in activation.skipped_patches()["unimportable"]
    assert sum("'unimportable' skipped" in str(w.message) for w in caught) == 1
    assert module.greet("a") == "HELLO A"


def test_a_patch_whose_library_is_not_installed_is_known_as_such():
    from transformers_tpu_ext import registry

    assert registry.installed("transformers.trainer") and registry.installed("accelerate")
    assert not registry.installed("no_such_library_of_tpu_ext.trainer")  # TRL's patch when the trl extra is absent
