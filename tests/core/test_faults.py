"""Fault injection with the real patches: upstream changes and our own bugs never break the user.

- An upstream rename of a function a patch wraps (simulated by renaming the real attribute before
  the patch applies): that patch is skipped with one clear warning, leaves nothing half-wrapped, and
  every other patch still works (placement, generation on the simulated TPU).
- An exception inside a real wrapper's own logic (a helper it calls is made to raise): the upstream
  call still happens, so ``generate()`` / ``model.to("tpu")`` / ``get_max_memory()`` give the user
  what upstream gives.
- The ``torch.backends`` entry point failing: ``import torch`` still works.

The activation-level cases with fake patches live in ``test_activation*.py``.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest

from _subprocess import run_python

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402

PROMPT = [[5, 9, 17, 33, 2, 8, 41]]
GREEDY = dict(max_new_tokens=6, do_sample=False)
FALLBACK = "falling back to the unpatched call"

# --------------------------------------------------------------------------------------------------
# An upstream rename (subprocess: patches and post-import hooks are process-global)

RENAMED_UPSTREAM = r"""
import importlib, importlib.util, tempfile, warnings
import torch
# A Transformers release renamed `kernelize`, the second function the `hub_kernels` patch wraps
# (Transformers' own modules, imported first, keep working with the new name).
import transformers.modeling_utils
import transformers.integrations.hub_kernels as hub
hub.kernelize_model = hub.kernelize
del hub.kernelize

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import transformers_tpu_ext as ext          # activates: patches whose target is imported apply now
    for name in ext.activation.registry.REGISTRY:       # every other patch's target (of an installed library)
        if ext.activation.registry.installed(ext.activation._patch_module(name).TARGET):
            importlib.import_module(ext.activation._patch_module(name).TARGET)
    ext.activate()                              # again: no second warning
ours = [str(w.message) for w in caught if issubclass(w.category, ext.TransformersTPUExtWarning)]
from transformers_tpu_ext import testing
sim = testing.install(chips=4)

from transformers import AutoModelForCausalLM
from transformers_tpu_ext.testing import tiny

prompt = torch.tensor(%(prompt)r)
model = tiny.tiny_model("qwen3", seed=0)
reference = model.generate(prompt, **%(greedy)r)
model.to("tpu")
before = sim.counters()
on_tpu = model.generate(prompt.to("tpu"), **%(greedy)r)
compiled = (sim.counters() - before).graphs_compiled
with tempfile.TemporaryDirectory() as path:
    tiny.save_tiny_model(path, arch="llama")
    placed = AutoModelForCausalLM.from_pretrained(path, device_map="auto")
report({
    "warnings": ours,
    "applied": ext.active_patches(),
    "skipped": ext.skipped_patches(),
    "half_applied": hasattr(hub.load_and_register_attn_kernel, "_self_wrapper"),
    "tokens_match": torch.equal(on_tpu.cpu(), reference),
    "output_device": on_tpu.device.type,
    "graphs_compiled": compiled,
    "device_map_auto": placed.device.type,
})
"""


@pytest.mark.slow
def test_upstream_rename_skips_that_patch_with_one_warning_and_the_rest_work():
    value, _ = run_python(
        RENAMED_UPSTREAM % {"prompt": PROMPT, "greedy": GREEDY}, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    )
    # One clear warning, naming the patch and what is missing.
    assert len(value["warnings"]) == 1, value["warnings"]
    message = value["warnings"][0]
    assert "'hub_kernels' skipped" in message and "kernelize" in message
    # The patch's RELIES_ON names kernelize: it stands aside before touching anything (a rename RELIES_ON
    # misses is rolled back after the fact: tests/core/test_activation.py).
    assert "stands aside" in value["skipped"]["hub_kernels"] and "kernelize" in value["skipped"]["hub_kernels"]
    # Nothing half-applied.
    assert value["half_applied"] is False
    # Every other patch is active and does its job.
    others = [name for name in ext.activation.registry.REGISTRY if name != "hub_kernels"
              and importlib.util.find_spec(ext.activation._patch_module(name).TARGET.split(".")[0]) is not None]  # an extra's
    assert value["applied"] == others
    assert value["device_map_auto"] == "tpu"
    assert value["output_device"] == "tpu" and value["tokens_match"]
    assert value["graphs_compiled"] > 0  # static cache + tpu backend: the generation patch at work


# --------------------------------------------------------------------------------------------------
# An exception inside a wrapper's own logic (in-process, on the simulated TPU)


class Injected(RuntimeError):
    """The bug we plant in a wrapper's helper."""


@pytest.fixture
def plugin(simulated_tpu):
    import transformers.generation.utils  # noqa: F401 - the targets are imported: patches applied
    import transformers.modeling_utils  # noqa: F401
    import accelerate.utils.modeling  # noqa: F401

    ext.activate()
    return simulated_tpu


def _breaker(calls: list[str], name: str):
    def broken(*args, **kwargs):
        calls.append(name)
        raise Injected(f"injected fault in {name}")

    return broken


def test_bug_in_the_generation_wrapper_still_generates_upstream(plugin, monkeypatch, caplog):
    from transformers_tpu_ext.generation import config as generation_config

    assert "generation" in ext.active_patches()
    model = tiny.tiny_model("qwen3", seed=0)
    prompt = torch.tensor(PROMPT)
    reference = model.generate(prompt, **GREEDY)
    model.to("tpu")
    calls: list[str] = []
    # The bucket planner (pure logic the generate wrapper calls before upstream) raises.
    monkeypatch.setattr(generation_config.TPUGenerationConfig, "plan", _breaker(calls, "plan"))
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        out = model.generate(prompt.to("tpu"), **GREEDY)
    assert calls == ["plan"], "the wrapper's logic never ran: the test injected nothing"
    assert out.device.type == "tpu" and torch.equal(out.cpu(), reference)
    assert any(FALLBACK in r.getMessage() and "injected fault in plan" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_bug_in_the_decoding_loop_choice_runs_upstreams_loop(plugin, monkeypatch, caplog):
    from transformers_tpu_ext.generation import policy as generation_policy

    model = tiny.tiny_model("qwen3", seed=0)
    prompt = torch.tensor(PROMPT)
    reference = model.generate(prompt, **GREEDY)
    model.to("tpu")
    calls: list[str] = []
    # Deciding between the device and the host loop (after upstream prepared the loop) raises.
    monkeypatch.setattr(generation_policy, "decode_path", _breaker(calls, "decode_path"))
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        out = model.generate(prompt.to("tpu"), **GREEDY)
    assert calls == ["decode_path"], "the wrapper's logic never ran: the test injected nothing"
    assert out.device.type == "tpu" and torch.equal(out.cpu(), reference)
    assert any(FALLBACK in r.getMessage() and "injected fault in decode_path" in r.getMessage() for r in caplog.records)


def test_bug_in_the_tied_weights_wrapper_still_moves_the_model(plugin, monkeypatch):
    from transformers_tpu_ext.placement import patch_transformers_tied_weights as transformers_tied_weights

    assert "transformers_tied_weights" in ext.active_patches()
    model = tiny.tiny_model("qwen3", seed=0)
    calls: list[str] = []
    monkeypatch.setattr(transformers_tied_weights, "tied_groups", _breaker(calls, "tied_groups"))
    moved = model.to("tpu")
    assert calls and set(calls) == {"tied_groups"}, "the wrapper's logic never ran"
    assert moved is model and model.device.type == "tpu"
    assert {p.device.type for p in model.parameters()} == {"tpu"}


def test_bug_in_the_accelerate_memory_wrapper_still_returns_upstreams_answer(plugin, monkeypatch):
    import accelerate.utils.modeling as modeling

    from transformers_tpu_ext.placement import budget as placement

    assert "accelerate_memory" in ext.active_patches()
    upstream = modeling.get_max_memory.__wrapped__({"cpu": "1GiB"})
    calls: list[str] = []
    monkeypatch.setattr(placement, "split_tpu_entry", _breaker(calls, "split_tpu_entry"))
    assert modeling.get_max_memory({"cpu": "1GiB"}) == upstream == {"cpu": 2**30}
    assert calls == ["split_tpu_entry"]


def test_bug_in_the_hub_kernel_wrappers_still_calls_upstream(plugin, monkeypatch):
    # A failure of ours in the checks falls back to upstream: the user sees upstream's own answer.
    import transformers.integrations.hub_kernels as hub

    from transformers_tpu_ext.kernels import patch_hub_kernels as hub_kernels

    assert {"hub_kernels", "use_kernels"} <= set(ext.active_patches())
    model = tiny.tiny_model("llama", vocab_size=128).to("tpu")
    upstream = {}
    for name, call in {
        "kernelize": lambda: hub.kernelize(model),
        "set_use_kernels": lambda: model.set_use_kernels(True),
        "load_and_register_attn_kernel": lambda: hub.load_and_register_attn_kernel("sdpa"),
    }.items():
        with monkeypatch.context() as m:
            m.setattr(hub_kernels, "jax_installed", lambda: True)  # our checks pass: upstream's answer
            upstream[name] = _outcome(call)
        calls: list[str] = []
        with monkeypatch.context() as m:
            m.setattr(hub_kernels.backend, "is_tpu", _breaker(calls, "is_tpu"))
            m.setattr(hub_kernels.backend, "tpu_available", _breaker(calls, "tpu_available"))
            broken = _outcome(call)
        assert calls, f"{name}: the wrapper's logic never ran"
        assert broken == upstream[name], name


def test_the_missing_jax_error_is_the_users_and_is_not_swallowed(plugin, monkeypatch):
    import transformers.integrations.hub_kernels as upstream

    monkeypatch.setattr(hub_kernels_module(), "jax_installed", lambda: False)
    # Refused only where a TPU kernel would load: Transformers' mapping naming one (5.25's names none).
    mapping = {"LlamaRMSNorm": {"tpu": "kernels-community/a-tpu-kernel"}}
    monkeypatch.setattr(upstream, "get_kernel_mapping_transformers", lambda: mapping, raising=False)
    model = tiny.tiny_model("llama", vocab_size=128).to("tpu")
    with pytest.raises(ImportError, match="jax"):
        model.set_use_kernels(True)


def hub_kernels_module():
    from transformers_tpu_ext.kernels import patch_hub_kernels as hub_kernels

    return hub_kernels


def _outcome(call) -> str:
    try:
        result = call()
    except Exception as error:  # noqa: BLE001 - compared as text with the unbroken call's
        return f"raised {type(error).__name__}: {error}"
    return f"returned {type(result).__name__}"


# --------------------------------------------------------------------------------------------------
# The entry point failing


@pytest.mark.slow
@pytest.mark.parametrize("warnings_filter", ["always", "error"])
def test_a_failing_entry_point_is_one_warning_and_import_torch_works(warnings_filter):
    import importlib.util

    if warnings_filter == "error" and importlib.util.find_spec("torch_tpu") is not None:
        pytest.skip("torch_tpu's own import fails under -W error (its import-time warnings), plugin or not")
    # The package itself fails to import (here: a module its __init__ needs is broken). The entry
    # point's module lives outside the package, so `import torch` goes on, even under -W error.
    value, stderr = run_python(
        f"""
import warnings
warnings.simplefilter({warnings_filter!r})
sys.modules["transformers_tpu_ext._version"] = None  # the package's __init__ raises ImportError
import torch
report({{"tensor": torch.ones(3).sum().item(), "plugin": "transformers_tpu_ext" in sys.modules,
        "tpu": torch.accelerator.current_accelerator(check_available=True) is not None}})
""",
        env={"TRANSFORMERS_TPU_EXT_SIMULATE": "1"},
    )
    assert value == {"tensor": 3.0, "plugin": False, "tpu": False}
    assert stderr.count("transformers-tpu-ext could not be loaded at import torch (ModuleNotFoundError") == 1, stderr
    assert "Traceback" not in stderr
