"""Concurrency: generate() from two threads at once, and activation racing with imports.

- Two threads generating on simulated-TPU models at the same time get exactly the tokens each gets
  alone (the generate wrapper keeps its per-call state per thread: prompts of different lengths get
  different left padding, which must not leak from one call into the other).
- The plugin activating while Transformers modules are being imported (in other threads, or in the
  same thread: the ``torch.backends`` entry point runs in the middle of a Transformers module's body
  when that module is the first thing a script imports) ends with every patch applied exactly once.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from _subprocess import run_python

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402

@pytest.mark.slow
def test_two_threads_generating_at_once_get_their_own_tokens(simulated_tpu):
    import transformers.generation.utils  # noqa: F401

    ext.activate()
    assert "generation" in ext.active_patches()
    gen = torch.Generator().manual_seed(0)
    models = [tiny.tiny_model("qwen3", seed=0), tiny.tiny_model("llama", seed=1)]
    # Different prompt lengths in one bucket: each call pads its prompt by a different amount, and
    # `max_length` (which counts the prompt) must be shifted by this call's padding, not the other's.
    prompts = [torch.randint(2, 100, (1, n), generator=gen) for n in (3, 11)]
    for model in models:
        model.to("tpu")

    def generate(i: int) -> torch.Tensor:
        return models[i].generate(prompts[i].to("tpu"), max_length=prompts[i].shape[1] + 5, do_sample=False).cpu()

    alone = [generate(i) for i in range(2)]

    rounds = 3
    results: list[list[torch.Tensor]] = [[], []]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker(i: int) -> None:
        try:
            for _ in range(rounds):
                barrier.wait(timeout=120)
                results[i].append(generate(i))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors, errors
    for i in range(2):
        assert len(results[i]) == rounds
        for out in results[i]:
            assert out.shape == alone[i].shape and torch.equal(out, alone[i])


# --------------------------------------------------------------------------------------------------
# Activation racing with imports (fresh interpreters: activation is process-global)

COUNT_APPLIES = """
import threading, warnings
warnings.simplefilter("always")
import torch
import transformers_tpu_ext as ext
from transformers_tpu_ext import activation
ext.deactivate()   # the entry point activated it; the race below re-activates
applies = {}
for name in activation.registry.REGISTRY:
    patch = activation._patch_module(name)
    def counted(module, _apply=patch.apply, _name=name):
        applies[_name] = applies.get(_name, 0) + 1
        return _apply(module)
    patch.apply = counted
"""

def _wrapper_depth() -> str:
    return """
import inspect, os
import transformers_tpu_ext
PLUGIN = os.path.dirname(transformers_tpu_ext.__file__) + os.sep
SIMULATOR = os.path.join(PLUGIN, "testing") + os.sep
def depth(obj):  # the plugin's layers around the upstream function: its wrapt wrappers and rebound
    n = 0          # functions (the simulator's and upstream's own decorators are not counted)
    while obj is not None:
        mine = getattr(obj, "_self_wrapper", obj)
        code = getattr(inspect.unwrap(mine, stop=lambda f: hasattr(f, "__code__")), "__code__", None)
        n += code is not None and code.co_filename.startswith(PLUGIN) and not code.co_filename.startswith(SIMULATOR)
        obj = getattr(obj, "__wrapped__", None)
    return n
from transformers_tpu_ext import activation as _activation
depths = {}  # every function a patch wrapped or rebound: wrapt layers found there now
for _name in _activation.active_patches():
    _wraps = getattr(_activation._patch_module(_name), "_wraps", None)
    for _parent, _attr, _ in getattr(_wraps, "_saved", []):
        _now = vars(_parent).get(_attr) if isinstance(_parent, type) else getattr(_parent, _attr)
        if callable(_now):
            depths[f"{_name}: {getattr(_parent, '__name__', _parent)}.{_attr}"] = depth(_now)
"""


def _assert_each_patch_applied_once(value: dict) -> None:
    registry = [n for n in ext.activation.registry.REGISTRY  # every patch whose library is installed
                if ext.activation.registry.installed(ext.activation._patch_module(n).TARGET)]
    assert value.get("import_errors", []) == []  # every target imported: a missing patch below is then ours
    assert value["applied"] == registry
    assert value["skipped"] == {}
    assert value["warnings"] == []
    assert value["applies"] == {name: 1 for name in registry}
    assert value["depths"]
    # One layer per patch: a function two patches wrap (generate: the generation patch and the
    # recompile guard) has two layers, and any other count is a patch applied twice (or lost).
    owners = Counter(key.split(": ", 1)[1] for key in value["depths"])
    assert {name: n for name, n in value["depths"].items() if n != owners[name.split(": ", 1)[1]]} == {}


@pytest.mark.slow
def test_activation_racing_with_imports_in_other_threads():
    # Importers start together with two activating threads, which activate as soon as
    # transformers.modeling_utils is in sys.modules: its body (seconds long) is still running.
    value, _ = run_python(
        COUNT_APPLIES
        + """
import importlib, sys, time
TARGETS = sorted({activation._patch_module(name).TARGET for name in activation.registry.REGISTRY} - {t for t in (activation._patch_module(n).TARGET for n in activation.registry.REGISTRY) if not activation.registry.installed(t)})
import transformers, accelerate  # the packages first: their own __init__ is not safe to race (upstream)
# transformers.integrations too: transformers.trainer and transformers.integrations.hub_kernels (both targets) import
# it, and a thread then got it half-initialised ("cannot import name 'get_reporting_integration_callbacks'"), an
# upstream race seen once in CI with the trl and embeddings extras installed (more integrations to probe)
import transformers.integrations
start = threading.Barrier(len(TARGETS) + 2)
import_errors = []
def importer(name):
    start.wait()
    try:
        importlib.import_module(name)
    except BaseException as error:  # an upstream import racing another: reported, not the plugin's
        import_errors.append(f"{name}: {type(error).__name__}: {error}")
def activator():
    start.wait()
    deadline = time.monotonic() + 60
    while "transformers.modeling_utils" not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.0005)
    ext.activate()
threads = [threading.Thread(target=importer, args=(t,)) for t in TARGETS]
threads += [threading.Thread(target=activator) for _ in range(2)]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for t in threads: t.start()
    for t in threads: t.join()
"""
        + _wrapper_depth()
        + """
report({"applied": ext.active_patches(), "skipped": ext.skipped_patches(), "applies": applies, "depths": depths,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, ext.TransformersTPUExtWarning)],
        "import_errors": import_errors})
""",
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    _assert_each_patch_applied_once(value)


@pytest.mark.slow
@pytest.mark.parametrize("first_import", ["transformers.modeling_utils", "transformers.generation.utils"])
def test_entry_point_firing_inside_a_transformers_module_still_applies_every_patch(first_import):
    # A script whose first line imports a Transformers module that itself runs `import torch`: the
    # entry point activates the plugin while that module is only half executed.
    value, _ = run_python(
        f"""
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import {first_import}
    import importlib, importlib.util
    from transformers_tpu_ext import activation
    for name in activation.registry.REGISTRY:
        if activation.registry.installed(activation._patch_module(name).TARGET):
            importlib.import_module(activation._patch_module(name).TARGET)
import transformers_tpu_ext as ext
applies = {{name: 1 for name in ext.active_patches()}}
"""
        + _wrapper_depth()
        + """
report({"applied": ext.active_patches(), "skipped": ext.skipped_patches(), "applies": applies, "depths": depths,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, ext.TransformersTPUExtWarning)]})
"""
    )
    _assert_each_patch_applied_once(value)
