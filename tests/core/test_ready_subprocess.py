"""What a user sees at ``import torch``, in fresh interpreters: settings, warnings, verbosity, status.

- Invalid ``TRANSFORMERS_TPU_EXT_*`` values: one accurate warning each (naming the variable and what it
  accepts), attributed to the plugin (not to ``torch/__init__.py``), the plugin active, and
  ``transformers-tpu doctor`` listing them.
- No warning category turns ``import torch`` into a failure (``-W error``).
- The plugin's messages follow ``TRANSFORMERS_VERBOSITY``: ``info`` shows the placement budget line,
  ``error`` silences the plugin's warnings.
- ``status()`` right after ``import torch`` says "armed", not an empty list.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from _subprocess import run_python

pytestmark = pytest.mark.slow

BAD = {
    "TRANSFORMERS_TPU_EXT_SIMULATE": "garbage",
    "TRANSFORMERS_TPU_EXT_DISABLE": "generate",
    "TRANSFORMERS_TPU_EXT_STEPS_PER_OCTAVE": "0",
}


def test_invalid_settings_are_one_accurate_warning_each_and_the_doctor_lists_them():
    value, stderr = run_python(
        """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
import transformers_tpu_ext as ext
from transformers_tpu_ext import testing
from transformers_tpu_ext.cli import doctor
ours = [w for w in caught if issubclass(w.category, ext.TransformersTPUExtWarning)]
armed = {n: s for n, s in ext.status().items() if not ext.activation._patch_module(n).TARGET.startswith("torch.")}
report_ = doctor.collect()
report({
    "messages": [str(w.message) for w in ours],
    "files": sorted({w.filename for w in ours}),
    "active": ext.is_active(),
    "armed": sorted(set(armed.values())),
    "simulator": testing.is_installed(),
    "doctor_settings": report_["settings"],
    "doctor_problems": report_["problems"],
    "doctor_text": doctor.format_text(report_),
})
""",
        env=BAD,
    )
    messages = value["messages"]
    assert len(messages) == 3, messages
    simulate = next(m for m in messages if "TRANSFORMERS_TPU_EXT_SIMULATE='garbage'" in m)
    assert "chips, generation, hbm, untie_on_move" in simulate
    assert "the plugin itself is active" in simulate and "without the plugin" not in simulate
    disable = next(m for m in messages if "TRANSFORMERS_TPU_EXT_DISABLE='generate'" in m)
    assert "generation" in disable and "tp_kv_cache" in disable
    assert any("TRANSFORMERS_TPU_EXT_STEPS_PER_OCTAVE='0'" in m for m in messages)
    assert all("transformers_tpu_ext" in f and not f.endswith(os.path.join("torch", "__init__.py")) for f in value["files"])
    assert value["active"] and value["armed"] == ["armed"] and value["simulator"] is False
    assert len(value["doctor_settings"]) == 3
    assert sum("invalid setting: TRANSFORMERS_TPU_EXT_" in p for p in value["doctor_problems"]) == 3
    assert "TRANSFORMERS_TPU_EXT_DISABLE='generate'" in value["doctor_text"]


@pytest.mark.parametrize(
    "environ",
    [
        {"TRANSFORMERS_TPU_EXT_SIMULATE": "chips=3,generation=v6e"},
        {"TRANSFORMERS_TPU_EXT_DISABLE": "generate", "TRANSFORMERS_TPU_EXT_BATCH_BUCKETS": "0"},
    ],
    ids=["simulate", "disable-and-buckets"],
)
def test_warnings_as_errors_never_fail_import_torch(environ):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    env.update(environ)
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import torch; print(torch.ones(2).sum().item())"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2.0"
    assert "Traceback" not in proc.stderr
    for variable in environ:  # still said, as a log line
        assert variable in proc.stderr


# Also the README's check (Usage): right after `import torch` every patch of Transformers or Accelerate
# is armed (active_patches() alone said [] and looked broken; torch_ddp's target comes with torch); after from_pretrained the patches it imported are applied.
PLACE = """
import tempfile, torch
import transformers_tpu_ext as ext
first = {n: s for n, s in ext.status().items() if not ext.activation._patch_module(n).TARGET.startswith("torch.")}
first_active = [n for n in ext.active_patches() if not ext.activation._patch_module(n).TARGET.startswith("torch.")]
from transformers import AutoModelForCausalLM
from transformers_tpu_ext.testing import tiny
with tempfile.TemporaryDirectory() as path:
    tiny.save_tiny_model(path)
    model = AutoModelForCausalLM.from_pretrained(path, device_map="auto")
report({"device": str(model.device), "first": sorted(set(first.values())), "first_active": first_active,
        "after": ext.status()})
"""


@pytest.mark.parametrize("verbosity", ["info", "error"])
def test_the_plugin_follows_transformers_verbosity(verbosity):
    value, stderr = run_python(
        PLACE,
        env={"TRANSFORMERS_VERBOSITY": verbosity, "TRANSFORMERS_TPU_EXT_SIMULATE": "1",
             "TRANSFORMERS_TPU_EXT_DISABLE": "generate"},  # one warning to show or silence
    )
    assert value["device"] == "tpu:0"
    assert value["first"] == ["armed"] and value["first_active"] == []
    assert value["after"]["accelerate_memory"] == value["after"]["generation"] == "applied"
    budget = "transformers-tpu-ext: device_map budget on TPU v6e"
    if verbosity == "info":
        assert budget in stderr
        assert "TRANSFORMERS_TPU_EXT_DISABLE='generate'" in stderr
    else:
        assert budget not in stderr
        assert "transformers-tpu-ext" not in stderr, stderr

