"""The memory budget rule and the ``max_memory`` key rules (pure logic, no torch needed)."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.placement import budget as placement
from transformers_tpu_ext.placement.budget import HEADROOM_ENV, TPU_KEY

GiB = 1 << 30


@pytest.mark.parametrize(
    ("total", "budget"),
    [
        (32 * GiB, 32 * GiB - int(3.2 * GiB) - 1),  # v6e: 10 % headroom (rounded up)
        (16 * GiB, 16 * GiB - int(1.6 * GiB) - 1),  # v5e
        (8 * GiB, 7 * GiB),  # 10 % would be 0.8 GiB: the 1 GiB floor applies
        (1 * GiB, GiB // 2),  # the floor would take it all: capped at half of the chip
        (1 << 20, 1 << 19),  # a tiny simulated chip still gets half of its HBM
    ],
)
def test_default_budget(total: int, budget: int) -> None:
    assert abs(placement.tpu_budget(total, environ={}) - budget) <= 1


def test_v7_budget_is_ninety_percent() -> None:
    total = 192 * GiB
    assert placement.tpu_budget(total, environ={}) == total - -(-total // 10)


@pytest.mark.parametrize(
    ("value", "headroom"),
    [
        ("4GiB", 4 * GiB),
        ("512MB", 512 * 10**6),
        ("1073741824", GiB),
        ("25%", 8 * GiB),
        ("0.25", 8 * GiB),
        ("0", 0),
        ("64GiB", 32 * GiB),  # never more than the chip: budget 0
    ],
)
def test_env_override_replaces_the_rule(value: str, headroom: int) -> None:
    total = 32 * GiB
    assert placement.headroom_bytes(total, environ={HEADROOM_ENV: value}) == headroom
    assert placement.tpu_budget(total, environ={HEADROOM_ENV: value}) == total - headroom


@pytest.mark.parametrize("value", ["lots", "4 parsecs", "150%", "-1GiB", "1.5", "2", "1000"])
def test_bad_env_override_names_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match=HEADROOM_ENV):
        placement.headroom_bytes(32 * GiB, environ={HEADROOM_ENV: value})


def test_parse_size_units() -> None:
    assert placement.parse_size("1.5GiB") == 3 * GiB // 2
    assert placement.parse_size("2kb") == 2000
    with pytest.raises(ValueError, match="not a size"):
        placement.parse_size("12 apples")


def test_split_recognises_every_name_of_the_chip() -> None:
    class Device:  # what a torch.device("tpu", 0) looks like
        type, index = "tpu", 0

    for key in (TPU_KEY, "tpu:0", 0, Device()):
        value, rest, ignored = placement.split_tpu_entry({key: "3GiB", "cpu": "10GiB", "disk": 1})
        assert (value, rest, ignored) == ("3GiB", {"cpu": "10GiB", "disk": 1}, [])


def test_split_ignores_other_chips_and_keeps_order() -> None:
    value, rest, ignored = placement.split_tpu_entry({"cpu": 5, 1: 7, "tpu": 3, "disk": 9})
    assert value == 3
    assert list(rest) == ["cpu", "disk"]
    assert ignored == [1]
    assert placement.split_tpu_entry(None) == (None, None, [])
    assert placement.split_tpu_entry({"cpu": 1}) == (None, {"cpu": 1}, [])


def test_merge_puts_the_chip_first() -> None:
    merged = placement.merge_tpu_entry({"cpu": 10, "disk": 20}, 4)
    assert list(merged.items()) == [("tpu", 4), ("cpu", 10), ("disk", 20)]
    assert placement.merge_tpu_entry({"cpu": 10}, None) == {"cpu": 10}
    assert list(placement.merge_tpu_entry({"cpu": 10, "tpu": 1}, 2).items()) == [("tpu", 2), ("cpu", 10)]


def test_a_bare_number_at_least_1_is_bytes_only_when_it_is_a_whole_size() -> None:
    # "1.5" used to be read as 1 byte of headroom: refused, with what to write instead.
    with pytest.raises(ValueError, match=r"bare number.*1\.5GiB"):
        placement.parse_headroom("1.5")
    assert placement.parse_headroom("1048576").of(32 * GiB) == 1 << 20
