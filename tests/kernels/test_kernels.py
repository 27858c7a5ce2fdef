"""Hub kernels on TPU without jax: one clear error naming the install command.

``kernels`` is not installed here, and it need not be: on TPU the patches (``hub_kernels`` on
``transformers.integrations.hub_kernels``, ``use_kernels`` on ``PreTrainedModel.set_use_kernels``)
check for jax before Transformers looks for ``kernels`` (the command they name installs both).
Whether jax is installed is set per test through ``hub_kernels.jax_installed``, so the tests hold on
a machine that has jax.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
from _subprocess import run_python

from transformers_tpu_ext.kernels import patch_hub_kernels as hub_kernels

INSTALL = re.escape('pip install "transformers[kernels]" jax')

needs_no_kernels = pytest.mark.skipif(
    importlib.util.find_spec("kernels") is not None, reason="upstream behaviour below assumes kernels is absent"
)


@pytest.fixture
def no_jax(monkeypatch):
    monkeypatch.setattr(hub_kernels, "jax_installed", lambda: False)


#: What Transformers' kernel mapping would look like once it names a TPU kernel (5.25's names none).
TPU_MAPPING = {"LlamaRMSNorm": {"tpu": "kernels-community/a-tpu-kernel"}}


@pytest.fixture
def tpu_kernel_mapped(monkeypatch):
    import transformers.integrations.hub_kernels as upstream

    monkeypatch.setattr(upstream, "get_kernel_mapping_transformers", lambda: TPU_MAPPING, raising=False)
    assert hub_kernels.tpu_kernels_mapped(None)


@pytest.fixture
def tpu_model(simulated_tpu):
    from transformers_tpu_ext.testing.tiny import tiny_model

    return tiny_model("llama", vocab_size=128).to("tpu")


def test_use_kernels_on_tpu_without_jax_names_the_install_command(tpu_model, no_jax, tpu_kernel_mapped):
    assert tpu_model.device.type == "tpu"
    with pytest.raises(ImportError, match=INSTALL) as info:
        tpu_model.set_use_kernels(True)
    assert "jax" in str(info.value) and "tpu" in str(info.value)
    with pytest.raises(ImportError, match=INSTALL):
        tpu_model.use_kernels = True  # the property setter goes through set_use_kernels


def test_hub_attention_kernel_on_a_tpu_host_without_jax(simulated_tpu, no_jax):
    from transformers_tpu_ext.testing.tiny import tiny_model

    with pytest.raises(ImportError, match=INSTALL) as info:
        tiny_model("llama", vocab_size=128, attn_implementation="kernels-community/flash-attn2")
    assert "kernels-community/flash-attn2" in str(info.value)


def test_kernelize_on_tpu_without_jax(tpu_model, no_jax, tpu_kernel_mapped):
    from transformers.integrations.hub_kernels import kernelize

    with pytest.raises(ImportError, match=INSTALL):
        kernelize(tpu_model)


KERNELIZE_FIRST = """
import sys, warnings
warnings.simplefilter("ignore")
import torch
from transformers import kernelize   # resolved before transformers.modeling_utils is imported
early = "transformers.modeling_utils" not in sys.modules
from transformers_tpu_ext import testing
from transformers_tpu_ext.kernels import patch_hub_kernels as hub_kernels
from transformers_tpu_ext.testing.tiny import tiny_model
hub_kernels.jax_installed = lambda: False
import transformers.integrations.hub_kernels as upstream
upstream.get_kernel_mapping_transformers = lambda: {"LlamaRMSNorm": {"tpu": "kernels-community/a-tpu-kernel"}}
testing.install()
model = tiny_model("llama", vocab_size=128).to("tpu")
try:
    kernelize(model)
    report([early, "no error"])
except Exception as error:
    report([early, type(error).__name__, str(error)])
"""


@pytest.mark.slow
def test_kernelize_imported_from_transformers_first_names_the_install_command():
    (early, kind, message), _ = run_python(KERNELIZE_FIRST)
    assert early is True
    assert kind == "ImportError" and re.search(INSTALL, message) and "kernelize() on tpu" in message
    # Without the patch, that kernelize is upstream's: no word of jax (here it fails about `kernels`).
    unpatched, _ = run_python(KERNELIZE_FIRST, env={"TRANSFORMERS_TPU_EXT_DISABLE": "hub_kernels"})
    assert unpatched[0] is True and "jax" not in " ".join(unpatched[1:])


@needs_no_kernels
def test_without_a_tpu_the_upstream_error_is_unchanged(simulated_tpu, no_jax):
    from transformers_tpu_ext.testing.tiny import tiny_model

    model = tiny_model("llama", vocab_size=128)  # on CPU
    with pytest.raises(ValueError, match="Kernels are not available") as info:
        model.set_use_kernels(True)
    assert "jax" not in str(info.value)
    with simulated_tpu.hidden():
        with pytest.raises(ImportError) as info:
            tiny_model("llama", vocab_size=128, attn_implementation="kernels-community/flash-attn2")
    assert "jax" not in str(info.value) and "kernels" in str(info.value)


@needs_no_kernels
def test_with_jax_installed_transformers_reports_the_missing_kernels(tpu_model, monkeypatch):
    monkeypatch.setattr(hub_kernels, "jax_installed", lambda: True)
    with pytest.raises(ValueError, match="Kernels are not available"):
        tpu_model.set_use_kernels(True)


def test_use_kernels_false_is_untouched(tpu_model, no_jax):
    tpu_model.set_use_kernels(False)
    assert tpu_model.use_kernels is False


# ---- Transformers' default Hub kernels (5.25: use_kernels=None means True) ------------------------------------

def _kernels_on_by_default() -> bool:
    """Transformers turns Hub kernels on for a load that asks for nothing (5.25: ``_kernels_enabled``, on unless
    ``USE_HUB_KERNELS`` says no) and a ``kernels`` release it accepts is installed (5.23 with kernels 0.19: no)."""
    import transformers.integrations.hub_kernels as upstream
    from transformers.utils import is_kernels_available

    return hasattr(upstream, "_kernels_enabled") and is_kernels_available()


needs_default_kernels = pytest.mark.skipif(
    not _kernels_on_by_default(), reason="Transformers turns Hub kernels on by default from 5.25 (with kernels)"
)


@pytest.fixture
def checkpoint(tmp_path):
    from transformers_tpu_ext.testing.tiny import tiny_model

    tiny_model("llama", vocab_size=128).save_pretrained(tmp_path)
    return tmp_path


def _class_forwards(model) -> bool:
    """No layer of ``model`` has a forward of its own: every one is its class's (kernelize rebinds them)."""
    return not any("forward" in vars(module) for module in model.modules())


@needs_default_kernels
def test_a_default_load_on_tpu_keeps_the_torch_forwards_and_trains(simulated_tpu, checkpoint, no_jax):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, device_map="auto")  # 5.25: kernels on by default
    assert model.device.type == "tpu" and model.use_kernels is False and _class_forwards(model)
    model.train()  # 5.25 re-kernelizes a kernelized model here; nothing to do for this one
    model.eval()
    assert model.use_kernels is False and _class_forwards(model)


@needs_default_kernels
def test_a_model_kernelized_by_default_on_the_cpu_gets_its_torch_forwards_on_the_tpu(simulated_tpu, checkpoint, no_jax):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert model.device.type == "cpu" and model.use_kernels is True  # upstream's default, on the CPU
    model.to("tpu").train()  # Transformers' re-kernelization for training, now on the TPU: a default, not a request
    assert model.use_kernels is False and _class_forwards(model)


@needs_default_kernels
@pytest.mark.parametrize("asked", ["use_kernels", "kernel_config"])
def test_an_explicit_request_on_tpu_keeps_its_clear_error(simulated_tpu, checkpoint, no_jax, asked, tpu_kernel_mapped):
    from kernels import Mode
    from transformers import AutoModelForCausalLM, KernelConfig

    if asked == "use_kernels":
        request_kwargs = {"use_kernels": True}
    else:  # registered before the weights load: refused before anything is fetched (no network here)
        request_kwargs = {"kernel_config": KernelConfig({"RMSNorm": "kernels-community/liger_kernels:LigerRMSNorm"})}
    with pytest.raises(ImportError, match=INSTALL):
        AutoModelForCausalLM.from_pretrained(checkpoint, device_map="auto", **request_kwargs)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, device_map="auto")
    with pytest.raises(ImportError, match=INSTALL):
        model.set_use_kernels(True, mode=Mode.INFERENCE)  # the user's own call is a request


@needs_default_kernels
def test_turning_kernels_off_on_tpu_is_never_refused(simulated_tpu, checkpoint, no_jax):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint)  # kernelized by default, on the CPU
    model.to("tpu")
    model.use_kernels = False  # reset_kernels(): kernelize with an empty mapping loads nothing
    assert model.use_kernels is False and _class_forwards(model)


@needs_default_kernels
def test_with_the_patch_disabled_the_default_is_upstreams(simulated_tpu, checkpoint, no_jax, monkeypatch):
    import transformers_tpu_ext as ext
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_DISABLE", "use_kernels")
    ext.deactivate()
    ext.activate()
    try:
        model = AutoModelForCausalLM.from_pretrained(checkpoint, device_map="auto")
        assert model.device.type == "tpu" and model.use_kernels is True  # Transformers kernelized it, on the TPU
    finally:
        monkeypatch.delenv("TRANSFORMERS_TPU_EXT_DISABLE")
        ext.deactivate()
        ext.activate()


@needs_default_kernels
def test_a_request_with_no_tpu_kernel_mapped_is_transformers_call(simulated_tpu, checkpoint, no_jax):
    """Transformers 5.25's mapping names no TPU kernel: ``use_kernels=True`` on a TPU loads nothing and keeps the
    torch forwards (kernels' fallback), with or without jax, as with the plugin disabled (its own tests
    ``test_kernels_can_*`` pass on the simulated TPU either way)."""
    from transformers import AutoModelForCausalLM

    assert not hub_kernels.tpu_kernels_mapped(None)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, device_map="auto", use_kernels=True)
    assert model.device.type == "tpu" and model.use_kernels is True and _class_forwards(model)
    model.train()
    assert model.use_kernels is True
