"""The process counts each TPU generation has a topology for (pure logic, no torch)."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.core import topology


@pytest.mark.parametrize(
    ("name", "generation"),
    [
        ("TPU v6e", "v6e"),
        ("TPU v6 lite", "v6e"),
        ("TPU v5 lite", "v5e"),
        ("v5litepod", "v5e"),
        ("TPU v5", "v5p"),
        ("TPU v5p", "v5p"),
        ("TPU v4", "v4"),
        ("TPU v7", "v7"),
        ("TPU7x", "v7"),
        ("cpu", None),
        ("", None),
        (None, None),
    ],
)
def test_device_names_map_to_generations(name, generation):
    assert topology.normalize_generation(name) == generation


@pytest.mark.parametrize(
    ("generation", "counts"),
    [("v4", (1, 2, 4, 8)), ("v5p", (1, 2, 4, 8)), ("v5e", (1, 4, 8)), ("v6e", (1, 4, 8)), ("v7", (2, 4, 8))],
)
def test_supported_counts_per_generation(generation, counts):
    assert topology.supported_counts(f"TPU {generation}") == counts
    for count in counts:
        assert topology.check_process_count(generation, count) is None


def test_unsupported_count_says_what_is_supported_and_what_to_pass():
    message = topology.check_process_count("TPU v6e", 2)
    assert "v6e" in message and "2 processes" in message
    assert "1, 4, 8" in message
    assert "--nproc_per_node=1" in message


def test_v7_rejects_a_single_process():
    message = topology.check_process_count("TPU v7", 1)
    assert "1 process per host" in message and "2, 4, 8" in message


def test_unknown_generation_is_left_to_the_backend():
    assert topology.supported_counts("TPU v9") is None
    assert topology.check_process_count("TPU v9", 3) is None
