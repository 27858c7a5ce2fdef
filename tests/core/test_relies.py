"""What a patch relies on in its target (``core.relies``), checked before it is applied: a target that changed
shape makes its patch stand aside with one warning, and the others keep working."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from transformers_tpu_ext import activation, registry
from transformers_tpu_ext.core import relies
from transformers_tpu_ext.core.relies import Attribute, Default, Signature


def _target() -> types.ModuleType:
    module = types.ModuleType("fake_target")

    class Model:
        def set_use_kernels(self, use_kernels, kernel_config=None, mode=None):
            pass

        @classmethod
        def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
            pass

        @property
        def device(self):
            return "cpu"

    def generate(inputs=None, *, max_new_tokens=20):
        pass

    module.Model, module.generate = Model, generate
    return module


def test_what_holds_passes():
    module = _target()
    expectations = (
        Attribute("Model.device"),
        Signature("Model.set_use_kernels", positional=("use_kernels", "kernel_config", "mode")),
        Signature("Model.from_pretrained", ("anything",), positional=("pretrained_model_name_or_path",)),  # **kwargs
        Signature("generate", ("max_new_tokens",), positional=("inputs",)),
        Default("generate", "max_new_tokens", 20),
        Signature("transformers_tpu_ext.core.relies:check", positional=("target", "expectations")),
    )
    assert relies.check(module, expectations) is None


@pytest.mark.parametrize(
    ("expectation", "says"),
    [
        (Attribute("Model.dtype"), "Model.dtype no longer exists"),
        (Signature("Model.set_use_kernels", ("device_map",)), "no longer takes device_map"),
        (Signature("Model.set_use_kernels", positional=("use_kernels", "mode")), "leading parameters are use_kernels, kernel_config"),
        (Signature("Model.device"), "takes"),  # a property's getter takes nothing but self: fine ...
        (Default("generate", "max_new_tokens", 10), "default 20"),
        (Default("generate", "min_new_tokens", 0), "no longer takes min_new_tokens"),
        (Signature("nowhere_such_module:thing"), "cannot be imported"),
    ],
)
def test_what_changed_is_named(expectation, says):
    problem = relies.check(_target(), (expectation,))
    if expectation == Signature("Model.device"):
        assert problem is None  # ... so no problem: the case only shows properties resolve to their getter
        return
    assert problem is not None and says in problem


def test_every_patch_declares_what_it_relies_on_and_it_holds_here():
    for name in registry.REGISTRY:
        patch = importlib.import_module(registry.module_name(name))
        expectations = getattr(patch, "RELIES_ON", None)
        assert expectations, f"patch {name!r} declares no RELIES_ON"
        if not registry.installed(patch.TARGET):
            continue
        target = importlib.import_module(patch.TARGET)
        assert relies.check(target, tuple(expectations)) is None, name


@pytest.fixture
def changed_target(monkeypatch):
    """Patch ``use_kernels`` relying on a parameter the installed Transformers does not have."""
    patch = importlib.import_module(registry.module_name("use_kernels"))
    monkeypatch.setattr(patch, "RELIES_ON", (*patch.RELIES_ON, Signature("PreTrainedModel.set_use_kernels", ("no_such",))))
    activation.deactivate()
    yield patch
    monkeypatch.undo()
    activation.deactivate()
    activation.activate()


def test_a_changed_target_makes_its_patch_stand_aside_alone(changed_target):
    import warnings

    import transformers  # noqa: F401
    import transformers.modeling_utils as modeling_utils

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        activation.activate()
    reason = activation.skipped_patches()["use_kernels"]
    assert reason.startswith("stands aside: transformers ") and "no longer takes no_such" in reason
    assert activation.status()["use_kernels"] == "skipped"
    assert activation.status()["hub_kernels"] == "applied"  # the others keep working
    assert not hasattr(modeling_utils.PreTrainedModel.__dict__["set_use_kernels"], "__wrapped__")
    warned = [str(w.message) for w in caught if "use_kernels" in str(w.message)]
    assert len(warned) == 1 and "no_such" in warned[0], warned
    assert "fake_target" not in sys.modules
