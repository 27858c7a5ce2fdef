"""Activation orderings, each in a fresh interpreter (patches and hooks are process-global)."""

from __future__ import annotations

import pytest

from _subprocess import run_python

pytestmark = pytest.mark.slow

LOAD_TRANSFORMERS = """
import transformers
from transformers import AutoModelForCausalLM, pipeline
import transformers.generation.utils, accelerate.utils.modeling
"""

SNAPSHOT = """
import inspect, types
def snapshot():
    # id of every object bound in Transformers' and Accelerate's modules and in their classes' dicts
    seen = {}
    for name, mod in list(sys.modules.items()):
        upstream = name.split(".")[0] in {"transformers", "accelerate"}  # not transformers_tpu_ext
        if not upstream or not isinstance(mod, types.ModuleType):
            continue
        for attr, value in list(vars(mod).items()):
            seen[f"{name}.{attr}"] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                for cattr, cvalue in list(vars(value).items()):
                    seen[f"{name}.{attr}.{cattr}"] = id(cvalue)
    return seen
"""


def test_import_torch_alone_activates_through_the_entry_point():
    value, _ = run_python(
        "import torch\n" + LOAD_TRANSFORMERS + """
import transformers_tpu_ext as ext
report({"loaded_by_entry_point": "transformers_tpu_ext" in sys.modules, "active": ext.is_active(),
        "applied": ext.active_patches(), "expected": patched_targets()})
"""
    )
    assert value["loaded_by_entry_point"] and value["active"]
    assert value["applied"], "no patch applied after importing Transformers and Accelerate"
    assert value["applied"] == value["expected"]


def test_entry_point_is_what_activates():
    value, _ = run_python(
        "import torch\n" + LOAD_TRANSFORMERS + 'report("transformers_tpu_ext" in sys.modules)',
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert value is False


def test_disable_all_leaves_everything_upstream():
    value, _ = run_python(
        "import torch\n" + LOAD_TRANSFORMERS + """
import transformers_tpu_ext as ext
report({"applied": ext.active_patches(), "skipped": ext.skipped_patches()})
""",
        env={"TRANSFORMERS_TPU_EXT_DISABLE": "1"},
    )
    assert value["applied"] == []
    assert value["skipped"] and all("TRANSFORMERS_TPU_EXT_DISABLE" in r for r in value["skipped"].values())


@pytest.mark.parametrize("plugin_first", [True, False])
def test_plugin_before_or_after_transformers(plugin_first):
    plugin = "import transformers_tpu_ext as ext\n"
    body = (plugin + LOAD_TRANSFORMERS) if plugin_first else (LOAD_TRANSFORMERS + plugin)
    value, _ = run_python(
        body + 'report({"applied": ext.active_patches(), "expected": patched_targets()})',
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},  # only the explicit import activates
    )
    assert value["applied"] and value["applied"] == value["expected"]


def test_activate_deactivate_activate_restores_and_reapplies_exactly():
    value, _ = run_python(
        "import os, torch\n" + LOAD_TRANSFORMERS + SNAPSHOT + """
import transformers_tpu_ext as ext
assert ext.active_patches() == []
before = snapshot()
os.environ.pop("TRANSFORMERS_TPU_EXT_DISABLE")
ext.deactivate(); ext.activate()
first = ext.active_patches()
changed = sorted(k for k, v in snapshot().items() if before.get(k) != v)
ext.deactivate()
restored = snapshot() == before
ext.activate()
again = ext.active_patches()
changed_again = sorted(k for k, v in snapshot().items() if before.get(k) != v)
report({"first": first, "changed": changed, "restored": restored, "again": again,
        "changed_again": changed_again})
""",
        env={"TRANSFORMERS_TPU_EXT_DISABLE": "1"},
    )
    assert value["first"] and value["again"] == value["first"]
    assert value["changed"], "activation changed nothing"
    assert value["restored"], "deactivate() did not restore every original object"
    assert value["changed_again"] == value["changed"]


def test_a_failing_bootstrap_is_one_warning_and_import_torch_goes_on():
    value, stderr = run_python(
        """
import warnings
warnings.simplefilter("always")
sys.modules["transformers_tpu_ext.compilation.persistent"] = None  # force activation to fail inside the entry point (activate() imports it; the package import does not)
import torch
import transformers_tpu_ext as ext
report({"tensor": torch.ones(2).sum().item(), "active": ext.is_active(), "applied": ext.active_patches()})
"""
    )
    assert value == {"tensor": 2.0, "active": False, "applied": []}
    assert stderr.count("transformers-tpu-ext could not activate") == 1, stderr


NO_TPU_RUN = """
import torch, tempfile
from transformers import AutoModelForCausalLM
from transformers_tpu_ext.testing.tiny import save_tiny_model
with tempfile.TemporaryDirectory() as tmp:
    save_tiny_model(tmp, arch="llama")
    model = AutoModelForCausalLM.from_pretrained(tmp, device_map="auto")
    ids = torch.tensor([[5, 9, 17, 33, 2, 71]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    import transformers_tpu_ext as ext
    report({"device": str(model.device), "map": getattr(model, "hf_device_map", None),
            "tokens": out.tolist(), "applied": ext.active_patches()})
"""


def test_without_a_tpu_the_plugin_changes_nothing():
    plain, _ = run_python(NO_TPU_RUN, env={"TRANSFORMERS_TPU_EXT_DISABLE": "1"})
    patched, _ = run_python(NO_TPU_RUN)
    assert plain["applied"] == [] and patched["applied"]
    assert patched["device"] == plain["device"] == "cpu"
    assert patched["map"] == plain["map"]
    assert patched["tokens"] == plain["tokens"]


def test_simulator_installed_after_activation_is_seen_when_patched_code_runs():
    # "Is there a TPU?" is asked when a patched function runs, never at activation: a backend that
    # registers its device after the plugin activated (entry points load in no fixed order) is used.
    value, _ = run_python(
        """
import tempfile, torch
import transformers_tpu_ext as ext
from transformers import AutoModelForCausalLM
import transformers.modeling_utils, transformers.generation.utils, accelerate.utils.modeling
from transformers_tpu_ext import backend, testing
from transformers_tpu_ext.testing.tiny import save_tiny_model
applied_before = ext.active_patches()
tpu_before = backend.tpu_available()
testing.install()
with tempfile.TemporaryDirectory() as tmp:
    save_tiny_model(tmp, arch="llama")
    model = AutoModelForCausalLM.from_pretrained(tmp, device_map="auto")
    ids = torch.tensor([[5, 9, 17, 33]])
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
report({"applied_before": applied_before, "applied_after": ext.active_patches(), "tpu_before": tpu_before,
        "device": str(model.device), "out_device": str(out.device), "new_tokens": out.shape[1] - 4})
""",
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert value["tpu_before"] is False
    assert value["applied_before"] and value["applied_after"] == value["applied_before"]
    assert value["device"] == "tpu:0"
    assert value["out_device"] == "cpu" and value["new_tokens"] == 4


def test_simulate_under_autoload_0_installs_the_simulator_when_the_plugin_is_imported():
    # TORCH_DEVICE_BACKEND_AUTOLOAD=0 stops the entry point that installs the simulated TPU at `import torch`;
    # `import transformers_tpu_ext` (which the user must then write anyway) does it instead.
    code = """
import torch
seen_by_torch = torch.accelerator.current_accelerator(check_available=True)
import transformers_tpu_ext
from transformers_tpu_ext import testing
report({"torch": str(seen_by_torch), "plugin": str(torch.accelerator.current_accelerator(check_available=True)),
        "chips": torch.accelerator.device_count(), "installed": testing.is_installed()})
"""
    value, _ = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "TRANSFORMERS_TPU_EXT_SIMULATE": "chips=8,generation=v5e"})
    assert value == {"torch": "None", "plugin": "tpu", "chips": 8, "installed": True}
