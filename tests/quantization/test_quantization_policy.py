"""Which path a quantized load or product takes on TPU (pure policy, milliseconds), and the docs' table of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from transformers_tpu_ext.quantization import policy
from transformers_tpu_ext.quantization.policy import DeviceMap, Fp8Facts, Fp8LinearFacts

DOCS = Path(__file__).resolve().parents[2] / "docs" / "quantization.md"


@pytest.mark.parametrize(
    ("device_map", "kind"),
    [
        (None, DeviceMap.NONE),
        ({}, DeviceMap.NONE),
        ("auto", DeviceMap.AUTO),
        ("balanced", DeviceMap.AUTO),
        ("tpu", DeviceMap.TPU),
        ("tpu:0", DeviceMap.TPU),
        (0, DeviceMap.TPU),
        ({"": "tpu"}, DeviceMap.TPU),
        ({"model": 0, "lm_head": "tpu:0"}, DeviceMap.TPU),
        ("cpu", DeviceMap.HOST),
        ({"": "cpu"}, DeviceMap.HOST),
        ({"model": "cpu", "lm_head": "disk"}, DeviceMap.HOST),
        ({"model": 0, "lm_head": "cpu"}, DeviceMap.MIXED),
        ({"model": "tpu", "lm_head": "disk"}, DeviceMap.MIXED),
        ("cuda", DeviceMap.OTHER),
        ({"model": "cuda:0"}, DeviceMap.OTHER),
        ({"model": True}, DeviceMap.OTHER),
    ],
)
def test_device_map_kinds(device_map, kind):
    assert policy.device_map_kind(device_map) == kind


# The docs' table of FP8 loads: row label -> the facts it describes.
FP8_ROWS = {
    "an FP8 checkpoint with `device_map=\"auto\"` or `\"tpu\"`": Fp8Facts(tpu=True, device_map=DeviceMap.AUTO),
    "... that offloads part of the model (`max_memory`)": Fp8Facts(tpu=True, device_map=DeviceMap.MIXED),
    "`FineGrainedFP8Config()` on a bf16 checkpoint, `device_map=\"auto\"`": Fp8Facts(
        tpu=True, device_map=DeviceMap.AUTO, pre_quantized=False
    ),
    "... whose inferred device map offloads part of the model": Fp8Facts(
        tpu=True, device_map=DeviceMap.MIXED, pre_quantized=False
    ),
    "no `device_map` (the model loads on the host)": Fp8Facts(tpu=True, device_map=DeviceMap.NONE),
    "`device_map=\"cpu\"`": Fp8Facts(tpu=True, device_map=DeviceMap.HOST),
    "`FineGrainedFP8Config(dequantize=True)`": Fp8Facts(tpu=True, device_map=DeviceMap.AUTO, dequantize=True),
    "`scale_fmt=\"ue8m0\"` (1-byte power-of-two scales)": Fp8Facts(
        tpu=True, device_map=DeviceMap.AUTO, scale_fmt="ue8m0"
    ),
    "`expert_dtype=\"fp4\"` (FP4 experts)": Fp8Facts(tpu=True, device_map=DeviceMap.AUTO, expert_dtype="fp4"),
    "no TPU, or a GPU present": Fp8Facts(tpu=False, device_map=DeviceMap.AUTO),
}


def _table(heading: str) -> dict[str, str]:
    """The two-column table under ``heading`` in docs/quantization.md: first cell -> bold path word."""
    text = DOCS.read_text()
    section = text.split(heading, 1)[1]
    rows = {}
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("| ") and not line.startswith("| ---") and "**" in line:
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows[cells[0]] = re.search(r"\*\*([^*]+)\*\*", cells[1]).group(1)
    return rows


def test_the_docs_fp8_table_is_the_policy():
    documented = _table("### Which FP8 loads stay 8-bit")
    assert set(documented) == set(FP8_ROWS)
    for label, facts in FP8_ROWS.items():
        decision = policy.fp8_path(facts)
        assert documented[label] == ("8-bit on the TPU" if decision.tpu else "upstream"), (label, decision)


def test_fp8_keeps_8bit_only_when_every_fact_is_recognised():
    assert policy.fp8_path(Fp8Facts(tpu=True, device_map=DeviceMap.TPU)).tpu
    assert policy.fp8_path(Fp8Facts(tpu=True, device_map=DeviceMap.MIXED)).tpu
    assert not policy.fp8_path(Fp8Facts(tpu=True, device_map=DeviceMap.OTHER)).tpu
    assert not policy.fp8_path(Fp8Facts(tpu=True, device_map=DeviceMap.AUTO, gpu=True)).tpu
    none = policy.fp8_path(Fp8Facts(tpu=True, device_map=DeviceMap.NONE))
    assert not none.tpu and "device_map='auto'" in none.reason  # says what to do


def test_a_kept_load_whose_map_goes_to_the_host_is_one_clear_error():
    decision = policy.fp8_path(Fp8Facts(tpu=True, device_map=DeviceMap.HOST))
    message = policy.fp8_kept_problem(decision)
    assert "dequantize=True" in message and "max_memory" in message and decision.reason in message


def _linear(**changes) -> Fp8LinearFacts:
    base = dict(weight_device="tpu", weight_dtype="float8_e4m3fn", scale_dtype="float32", weight_dims=2,
                scale_dims=2, block_size=(128, 128))
    base.update(changes)
    return Fp8LinearFacts(**base)


@pytest.mark.parametrize(
    ("changes", "tpu"),
    [
        ({}, True),
        ({"weight_dtype": "float8_e5m2"}, True),
        ({"scale_dims": 0, "block_size": None}, True),  # per-tensor scale
        ({"scale_dtype": "bfloat16"}, True),
        ({"weight_device": "cpu"}, False),
        ({"weight_device": "cuda"}, False),
        ({"weight_dtype": "int8"}, False),  # FP4 packed two per byte
        ({"scale_dtype": "float8_e8m0fnu"}, False),  # ue8m0 scales
        ({"weight_dims": 3}, False),
        ({"block_size": (0, 128)}, False),
    ],
)
def test_fp8_linear_path(changes, tpu):
    assert policy.fp8_linear_path(_linear(**changes)).tpu is tpu


@pytest.mark.parametrize(
    ("tpu", "device_map", "path"),
    [
        (True, DeviceMap.AUTO, "refuse"),
        (True, DeviceMap.NONE, "refuse"),
        (True, DeviceMap.TPU, "refuse"),
        (True, DeviceMap.MIXED, "refuse"),
        (True, DeviceMap.HOST, "upstream"),
        (False, DeviceMap.AUTO, "upstream"),
    ],
)
def test_bitsandbytes_is_refused_on_a_tpu_unless_on_the_host(tpu, device_map, path):
    assert policy.bnb_path(tpu=tpu, device_map=device_map).path == path


def test_the_bitsandbytes_message_names_the_tpu_alternatives():
    message = policy.BNB_MESSAGE.format(what="load_in_8bit")
    assert "TorchAoConfig(Int8WeightOnlyConfig())" in message
    assert "FineGrainedFP8Config" in message and "device_map='cpu'" in message


def test_torchao_notes():
    assert policy.torchao_note("Int8WeightOnlyConfig", tpu=False) is None
    assert policy.torchao_note("Int8WeightOnlyConfig", tpu=True).tpu
    int4 = policy.torchao_note("Int4WeightOnlyConfig", tpu=True)
    assert not int4.tpu and "Int8WeightOnlyConfig()" in int4.reason
    assert "int8 matmul" in policy.torchao_note("Int8DynamicActivationInt8WeightConfig", tpu=True).reason
    unknown = policy.torchao_note("Float8WeightOnlyConfig", tpu=True)
    assert not unknown.tpu and "not tested" in unknown.reason
