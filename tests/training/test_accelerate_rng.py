"""Accelerate's ``save_state()`` / ``load_state()`` and ``synchronize_rng_state`` keep the TPU's random state
(``transformers_tpu_ext/training/patch_accelerate_rng.py``).

Accelerate 1.16 reads it with ``torch.get_device_module("tpu").get_rng_state()`` on torch < 2.14, which
torch_tpu 0.2.0 makes internal from torch 2.13: on a chip ``save_state()`` raised ``RuntimeError:
get_rng_state is internal to TorchTPU ...``. The simulated TPU refuses it as the chip does
(``tests/simulator/test_internal_apis.py``); with the patch the state goes through
``torch.tpu.default_generators`` and round-trips.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

import _training  # noqa: E402

from transformers_tpu_ext.testing import internal_apis  # noqa: E402

#: Accelerate reads the state with torch.tpu.get_rng_state only where torch.accelerator.random is missing.
ACCELERATE_CALLS_GET_RNG_STATE = not hasattr(torch.accelerator, "random")
GET_RNG_STATE_INTERNAL = "get_rng_state" in internal_apis.internal_names(internal_apis.parse_version(torch.__version__))


def _draws() -> torch.Tensor:
    return torch.rand(8, device="tpu").cpu()


def test_save_state_and_load_state_round_trip_the_tpu_random_state(simulated_tpu, tmp_path):
    from accelerate import Accelerator

    accelerator = Accelerator()
    assert accelerator.device.type == "tpu"
    torch.manual_seed(3)
    _draws()
    accelerator.save_state(str(tmp_path / "state"))
    expected = _draws()
    torch.rand(1000, device="tpu")  # the chip's generator moves on
    torch.manual_seed(11)  # and is reseeded
    accelerator.load_state(str(tmp_path / "state"))
    assert torch.equal(_draws(), expected)
    saved = torch.load(tmp_path / "state" / "random_states_0.pkl", weights_only=False)
    state = saved["torch_tpu_manual_seed"]  # Accelerate's own key, a host tensor: loads without torch_tpu
    assert state.device.type == "cpu" and state.dtype == torch.uint8


def test_the_tpu_random_state_is_the_chips_not_the_cpus(simulated_tpu, tmp_path):
    from accelerate import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(5)
    accelerator.save_state(str(tmp_path / "state"))
    expected_tpu = _draws()
    torch.manual_seed(6)
    torch.tpu.manual_seed(5)  # the chip's generator is seeded as when saved, the CPU's is not
    cpu_after = torch.rand(8)
    torch.rand(10, device="tpu")
    accelerator.load_state(str(tmp_path / "state"))
    assert torch.equal(_draws(), expected_tpu)
    assert not torch.equal(torch.rand(8), cpu_after)  # the CPU's state came back too (Accelerate's own)


def test_synchronize_rng_state_on_the_tpu(simulated_tpu):
    from accelerate import Accelerator
    from accelerate.utils import synchronize_rng_state, synchronize_rng_states

    Accelerator()
    torch.manual_seed(2)
    expected = _draws()
    torch.manual_seed(2)
    synchronize_rng_state("tpu")  # one process: its own state, read and set back
    synchronize_rng_states(["tpu"])
    assert torch.equal(_draws(), expected)


@pytest.mark.skipif(not (ACCELERATE_CALLS_GET_RNG_STATE and GET_RNG_STATE_INTERNAL), reason="torch >= 2.14 or < 2.13")
def test_without_the_patch_save_state_fails_as_on_a_chip(simulated_tpu, tmp_path):
    from accelerate import Accelerator

    with _training.patches_disabled("accelerate_rng"):
        accelerator = Accelerator()
        with pytest.raises(RuntimeError, match="get_rng_state is internal to TorchTPU"):
            accelerator.save_state(str(tmp_path / "state"))


def test_only_the_tpu_module_is_replaced_and_revert_restores_torch(simulated_tpu):
    import accelerate.checkpointing as checkpointing
    import accelerate.utils.random as random_module

    from transformers_tpu_ext import activation

    for module in (checkpointing, random_module):
        proxy = module.torch
        assert proxy is not torch and proxy == torch  # a transparent proxy
        assert proxy.accelerator is torch.accelerator and proxy.save is torch.save  # Accelerate's identity test holds
        assert proxy.get_device_module("cpu") is torch.get_device_module("cpu")
        tpu = proxy.get_device_module("tpu")
        assert tpu is not torch.tpu and tpu.get_device_properties is torch.tpu.get_device_properties
        with simulated_tpu.hidden():  # no TPU: torch_tpu's module as it is
            assert proxy.get_device_module("tpu") is torch.tpu
    activation.deactivate()
    try:
        assert checkpointing.torch is torch and random_module.torch is torch
    finally:
        activation.activate()
    assert checkpointing.torch is not torch and "accelerate_rng" in activation.active_patches()


def test_a_failing_generator_falls_back_to_torch_tpus_own_call(simulated_tpu, monkeypatch, caplog):
    import accelerate.checkpointing as checkpointing

    broken = type("Broken", (), {"get_state": lambda self: (_ for _ in ()).throw(RuntimeError("unreadable"))})()
    monkeypatch.setattr(torch.tpu, "default_generators", (broken,))
    tpu = checkpointing.torch.get_device_module("tpu")
    if GET_RNG_STATE_INTERNAL:
        with pytest.raises(RuntimeError, match="get_rng_state is internal to TorchTPU"):  # torch_tpu's own, as upstream
            tpu.get_rng_state()
    else:
        assert tpu.get_rng_state().dtype == torch.uint8
    assert "reading the TPU's random state failed (RuntimeError: unreadable)" in caplog.text
