"""The plugin's door to the TPU (backend.py), against the simulated TPU."""

from __future__ import annotations

import pytest

from transformers_tpu_ext import backend

GiB = 1 << 30


@pytest.mark.parametrize(
    "generation, hbm", [("v4", 32), ("v5e", 16), ("v5p", 95), ("v6e", 32), ("v7", 192)]
)
def test_chip_info_reports_generation_hbm_and_chips(simulated_tpu, generation, hbm):
    simulated_tpu.configure(chips=8, generation=generation, hbm_bytes=f"{hbm}GiB")
    info = backend.chip_info()
    assert info is not None
    assert info.generation == generation
    assert info.total_memory == hbm * GiB
    assert info.count == 8
    assert backend.tpu_available() and backend.device_count() == 8


def test_no_tpu_means_no_chip_info(simulated_tpu):
    with simulated_tpu.hidden():
        assert backend.tpu_available() is False
        assert backend.chip_info() is None
        assert backend.device_count() == 0


@pytest.mark.parametrize("value, expected", [("tpu", True), ("tpu:0", True), ("cpu", False), (None, False)])
def test_is_tpu_reads_strings_devices_and_tensors(simulated_tpu, value, expected):
    import torch

    assert backend.is_tpu(value) is expected
    if value is not None:
        assert backend.is_tpu(torch.device(value)) is expected
        assert backend.is_tpu(torch.zeros(1, device=value)) is expected
