"""Which path a quantized model takes on TPU: plain decisions over plain facts (no torch, no Transformers).

The quantization glue gathers the facts of a load and asks this module:

- :func:`fp8_path`: does a FineGrainedFP8 model keep its float8 weights and block scales on the TPU
  (dequantized inside the compiled graph), or does Transformers' own rule apply (a pre-quantized
  checkpoint dequantized to bf16 on a machine without a GPU, an on-the-fly quantization refused)?
- :func:`fp8_linear_path`: does one call of ``fp8_linear`` run the TPU's weight-only product, or
  upstream's (DeepGEMM or the Hub's Triton kernel)?
- :func:`bnb_path`: is ``load_in_8bit`` / ``load_in_4bit`` refused with a message naming the TPU
  alternative, or left to upstream?
- :func:`torchao_note`: what a torchao config does on a TPU (said once in the log when it is not
  the int8 weight-only path).

Every decision comes with its reason; ``docs/quantization.md`` lists them, and a test checks the table
there against these functions.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BNB_MESSAGE",
    "DeviceMap",
    "Fp8Facts",
    "Fp8LinearFacts",
    "Path",
    "TORCHAO_NOTES",
    "bnb_path",
    "device_map_kind",
    "fp8_kept_problem",
    "fp8_linear_path",
    "fp8_path",
    "torchao_note",
]

#: FP8 element types the TPU path dequantizes (torch_tpu stores both; e4m3fn is what checkpoints use).
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
#: Scale element types it takes: FineGrainedFP8's ``scale_fmt="float"``.
SCALE_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Path:
    """A decision: the path (``"tpu"``, ``"upstream"`` or ``"refuse"``) and why."""

    path: str
    reason: str

    @property
    def tpu(self) -> bool:
        return self.path == "tpu"


class DeviceMap:
    """Kinds of ``device_map`` a load can name, from :func:`device_map_kind`."""

    NONE = "none"  # no device_map: the model loads on the host (the user may move it later)
    TPU = "tpu"  # every weight on the TPU ("tpu", "tpu:0", {"": "tpu"}, a map of tpu entries only)
    AUTO = "auto"  # "auto" / "balanced"...: the plugin's placement, the TPU first
    HOST = "host"  # every weight on the host or disk ("cpu", a map of cpu/disk entries)
    MIXED = "mixed"  # a map with both TPU and host entries (offload)
    OTHER = "other"  # another device ("cuda", "meta"...)


_AUTO = {"auto", "balanced", "balanced_low_0", "sequential"}


def device_map_kind(device_map: object) -> str:
    """The :class:`DeviceMap` kind of a ``device_map`` value (strings, ints, dicts of those; devices as ``str``)."""
    if device_map is None:
        return DeviceMap.NONE
    if isinstance(device_map, dict):
        kinds = {_place(value) for value in device_map.values()}
        if not kinds:
            return DeviceMap.NONE
        if kinds == {"tpu"}:
            return DeviceMap.TPU
        if kinds <= {"host"}:
            return DeviceMap.HOST
        if kinds <= {"tpu", "host"}:
            return DeviceMap.MIXED
        return DeviceMap.OTHER
    if isinstance(device_map, str) and device_map in _AUTO:
        return DeviceMap.AUTO
    return {"tpu": DeviceMap.TPU, "host": DeviceMap.HOST}.get(_place(device_map), DeviceMap.OTHER)


def _place(value: object) -> str:
    if isinstance(value, bool):
        return "other"
    if isinstance(value, int):
        return "tpu"  # the GPU habit `0`: this process' chip
    text = str(value)
    kind = text.split(":", 1)[0]
    if kind == "tpu":
        return "tpu"
    if kind in ("cpu", "disk"):
        return "host"
    return "other"


# -------------------------------------------------------------------------------------------------
# FineGrainedFP8


@dataclass(frozen=True)
class Fp8Facts:
    """What ``FineGrainedFP8HfQuantizer.validate_environment`` knows of a load (plain data)."""

    tpu: bool  # a TPU is present
    device_map: str  # a DeviceMap kind
    pre_quantized: bool = True  # an FP8 checkpoint (False: FineGrainedFP8Config() on a bf16 checkpoint)
    dequantize: bool = False  # the user asked for bf16 weights
    scale_fmt: str = "float"
    expert_dtype: str = "fp8"
    gpu: bool = False  # CUDA or XPU present: upstream's kernels apply


def fp8_path(facts: Fp8Facts) -> Path:
    """Keep a FineGrainedFP8 model's float8 weights on the TPU (``"tpu"``), or leave the load to upstream."""
    if not facts.tpu:
        return Path("upstream", "no TPU")
    if facts.gpu:
        return Path("upstream", "a GPU is present: Transformers' FP8 kernels apply")
    if facts.dequantize:
        return Path("upstream", "dequantize=True: bf16 weights, as asked")
    if facts.scale_fmt != "float":
        return Path("upstream", f"scale_fmt={facts.scale_fmt!r} is not tested on TPU: Transformers' rule applies")
    if facts.expert_dtype != "fp8":
        return Path("upstream", f"expert_dtype={facts.expert_dtype!r} (FP4 experts) has no TPU path")
    if facts.device_map == DeviceMap.NONE:
        return Path(
            "upstream",
            "no device_map: the model loads on the host, where FP8 has no kernel; Transformers dequantizes it "
            "(pass device_map='auto' or 'tpu' to keep 8-bit weights on the TPU)",
        )
    if facts.device_map in (DeviceMap.HOST, DeviceMap.OTHER):
        return Path("upstream", "the device_map keeps the weights off the TPU: Transformers' rule applies")
    if facts.device_map == DeviceMap.MIXED and not facts.pre_quantized:
        return Path("upstream", "quantizing on the fly with offloaded weights: Transformers refuses it")
    return Path("tpu", "float8 weights and block scales stay on the TPU, dequantized inside the compiled graph")


def fp8_kept_problem(decision: Path) -> str:
    """The error for a load whose float8 weights were kept for the TPU (by :func:`fp8_path` on the user's
    ``device_map``) when the device map inferred later takes another path (``decision``)."""
    return (
        f"FP8 weights were kept 8-bit for the TPU, but the inferred device map cannot run them ({decision.reason}): "
        "give the TPU room (max_memory, or more chips with tp_size), load an FP8 checkpoint rather than "
        "quantizing on the fly, or load bf16 weights with quantization_config=FineGrainedFP8Config(dequantize=True)"
    )


@dataclass(frozen=True)
class Fp8LinearFacts:
    """One call of ``fp8_linear`` (dtypes as their ``str`` without ``torch.``)."""

    weight_device: str  # "tpu", "cpu", "cuda"...
    weight_dtype: str
    scale_dtype: str
    weight_dims: int
    scale_dims: int
    block_size: tuple[int, int] | None


def fp8_linear_path(facts: Fp8LinearFacts) -> Path:
    """Run the TPU's weight-only FP8 product (dequantize, then ``F.linear``) or upstream's kernels."""
    if facts.weight_device != "tpu":
        return Path("upstream", "weight not on a TPU")
    if facts.weight_dtype not in FP8_DTYPES:
        return Path("upstream", f"{facts.weight_dtype} weights (FP4-packed?) have no TPU path")
    if facts.scale_dtype not in SCALE_DTYPES:
        return Path("upstream", f"{facts.scale_dtype} scales have no TPU path")
    if facts.weight_dims != 2 or facts.scale_dims not in (0, 1, 2):
        return Path("upstream", "not a 2D weight with per-tensor or 2D block scales")
    if facts.block_size is not None and (len(facts.block_size) != 2 or min(facts.block_size) < 1):
        return Path("upstream", f"block size {facts.block_size} is not two positive sizes")
    return Path("tpu", "weight-only FP8: dequantized in the graph, bf16 matmul")


# -------------------------------------------------------------------------------------------------
# bitsandbytes

BNB_MESSAGE = (
    "bitsandbytes ({what}) has no TPU backend. On a TPU, load 8-bit weights with "
    "quantization_config=TorchAoConfig(Int8WeightOnlyConfig()) (pip install torchao; "
    "from torchao.quantization import Int8WeightOnlyConfig) or an FP8 checkpoint (FineGrainedFP8Config), "
    "see docs/quantization.md; 4-bit weights have no TPU kernel in torch_tpu 0.2.0. To run bitsandbytes on "
    "the host instead, pass device_map='cpu'."
)


def bnb_path(*, tpu: bool, device_map: str) -> Path:
    """Refuse bitsandbytes on a TPU host unless every weight stays on the host."""
    if not tpu:
        return Path("upstream", "no TPU")
    if device_map == DeviceMap.HOST:
        return Path("upstream", "device_map keeps every weight on the host: bitsandbytes' CPU backend")
    return Path("refuse", "bitsandbytes has no TPU backend")


# -------------------------------------------------------------------------------------------------
# torchao

#: torchao config class -> (path, what it does on a TPU). The int8 weight-only path is the tested one.
TORCHAO_NOTES = {
    "Int8WeightOnlyConfig": (
        "tpu",
        "int8 weights and per-row scales in HBM, dequantized inside the compiled graph (plain ops)",
    ),
    "Int8DynamicActivationInt8WeightConfig": (
        "upstream",
        "W8A8 needs an int8 matmul torch_tpu 0.2.0 lacks: it runs as a float or int32 matmul of unmeasured speed; "
        "use Int8WeightOnlyConfig()",
    ),
    "Int4WeightOnlyConfig": (
        "upstream",
        "int4 weights need CUDA kernels (mslk, _weight_int4pack_mm) torch_tpu 0.2.0 lacks: loading or the first "
        "forward fails; use Int8WeightOnlyConfig()",
    ),
}


def torchao_note(config_name: str, *, tpu: bool) -> Path | None:
    """What ``config_name`` (a torchao config class name) does on a TPU; ``None`` off TPU or when unknown
    to this table (then nothing is said: upstream's behaviour, untested here)."""
    if not tpu:
        return None
    entry = TORCHAO_NOTES.get(config_name)
    if entry is None:
        return Path("upstream", f"{config_name} is not tested on TPU; Int8WeightOnlyConfig() is the TPU path")
    return Path(*entry)
