"""The simulated ``torch.tpu`` refuses what torch_tpu 0.2.0 refuses: its internal names, called from user code.

torch_tpu makes ``device_count``, ``is_available``, ``current_device``, ``set_device``, ``synchronize``,
``set_stream``, ``current_stream`` and ``device`` internal from torch 2.11, ``get_rng_state`` and
``initial_seed`` from torch 2.13 (``transformers_tpu_ext.testing.internal_apis``, checked against the
wheel by ``test_internal_apis_table.py``). Before, the simulator refused only ``device_count`` and
``is_available``: code calling ``torch.tpu.get_rng_state()`` (Accelerate's ``save_state`` on torch
2.11-2.13) passed here and failed on a chip.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from _subprocess import run_python

from transformers_tpu_ext.testing import internal_apis
from transformers_tpu_ext.testing.internal_apis import INTERNAL_APIS, error_message, warning_message

pytestmark = pytest.mark.usefixtures("plugin_patches_off")  # tests/simulator/conftest.py

#: What the installed torch makes internal (torch_tpu reads the version once, as the simulator does).
INTERNAL_HERE = internal_apis.internal_names(internal_apis.parse_version(torch.__version__))


def _call(name: str) -> None:
    """``torch.tpu.<name>(...)`` from this module (user code), with arguments the name accepts."""
    if name == "set_stream":
        torch.tpu.set_stream(torch.tpu.default_stream())
    elif name in ("device", "set_device"):
        getattr(torch.tpu, name)(0)
    else:
        getattr(torch.tpu, name)()


def _display(name: str) -> str:
    """The name torch_tpu's message gives: ``torch.tpu.device`` is its class ``_DeviceContext``."""
    return getattr(torch.tpu, name).__name__


def test_the_installed_torch_makes_get_rng_state_internal():
    assert internal_apis.parse_version(torch.__version__) >= (2, 13), "the project's venv pins torch 2.13"
    assert {"get_rng_state", "initial_seed", "device_count", "synchronize"} <= INTERNAL_HERE


@pytest.mark.parametrize("name", sorted(INTERNAL_APIS))
def test_each_internal_name_raises_for_user_code(simulated_tpu, name):
    if name not in INTERNAL_HERE:
        _call(name)  # experimental under this torch: callable
        return
    with pytest.raises(RuntimeError) as caught:
        _call(name)
    assert str(caught.value) == error_message(_display(name), INTERNAL_APIS[name].prefer)


def test_get_rng_state_from_user_code_raises_torch_tpus_error(simulated_tpu):
    with pytest.raises(RuntimeError) as caught:
        torch.tpu.get_rng_state()
    assert str(caught.value) == (
        "get_rng_state is internal to TorchTPU and can only be called by the PyTorch framework (torch and "
        "torch_tpu). Use torch.accelerator.random.get_rng_state instead."
    )
    torch.tpu.set_rng_state(torch.tpu.default_generators[0].get_state())  # set_rng_state is only experimental


def test_torch_tpu_device_is_torch_tpus_device_context(simulated_tpu):
    assert torch.tpu.device.__name__ == "_DeviceContext"
    with pytest.raises(RuntimeError, match="^_DeviceContext is internal to TorchTPU.*Use torch.accelerator.device_index instead"):
        torch.tpu.device(0)
    # device_of is only experimental; its base class is called from torch_tpu's own code (here, the simulator's).
    with torch.tpu.device_of(torch.ones(1, device="tpu")):
        pass


def test_the_framework_may_call_them(simulated_tpu):
    # torch.accelerator and torch.random call torch.tpu's internal names: PyTorch is the framework.
    assert torch.accelerator.device_count() == 4 and torch.accelerator.is_available()
    with torch.random.fork_rng(devices=[0], device_type="tpu"):  # torch.tpu.get_rng_state / set_rng_state
        inside = torch.rand(3, device="tpu").cpu()
    assert torch.equal(torch.rand(3, device="tpu").cpu(), inside)  # the state was restored


def test_not_checked_while_torchdynamo_traces(simulated_tpu):
    def step(x):
        torch.tpu.synchronize()  # traced through, as torch_tpu's (no caller check while compiling)
        return x + 1

    compiled = torch.compile(step, backend="tpu", fullgraph=True)
    assert torch.equal(compiled(torch.ones(2, device="tpu")).cpu(), torch.full((2,), 2.0))
    with pytest.raises(RuntimeError, match="synchronize is internal"):
        step(torch.ones(2, device="tpu"))  # eager: checked


def test_the_legacy_switch_warns_once_per_name(simulated_tpu, legacy_device_apis):
    with pytest.warns(UserWarning) as caught:
        torch.tpu.synchronize()
        torch.tpu.synchronize()
        assert torch.tpu.device_count() == 4
    messages = [str(w.message) for w in caught]
    assert messages == [
        warning_message("synchronize", "torch.accelerator.synchronize"),
        warning_message("device_count", "torch.accelerator.device_count"),
    ]
    assert messages[0].startswith("<TorchTpu/ApiStage/InternalApi/> synchronize is internal to TorchTPU and may change")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.tpu.synchronize()  # warned already: silent


def test_the_legacy_switch_comes_from_the_environment():
    value, _ = run_python(
        """
        import warnings
        import torch
        from transformers_tpu_ext import testing
        testing.install()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            count = torch.tpu.device_count()
            torch.tpu.device_count()
        report([count, [str(w.message) for w in caught]])
        """,
        env={"TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS": "1"},
    )
    assert value == [4, [warning_message("device_count", "torch.accelerator.device_count")]]
    assert internal_apis.STRICT is True  # this process runs without it


def test_every_internal_name_is_on_the_simulated_module():
    from transformers_tpu_ext.testing import tpu_module

    assert set(INTERNAL_APIS) <= set(tpu_module.__all__)
