"""How much of a TPU chip ``device_map="auto"`` may fill with weights, and how ``max_memory`` names it.

Plain functions over bytes, ints and dicts; the patch modules (``patch_accelerate_memory``,
``patch_transformers_device_map``) glue them into Accelerate and Transformers.

The budget rule (documented in ``docs/placement.md``), written once here:

    budget = total_memory - headroom
    headroom = 10 % of the chip's HBM, at least 1 GiB, at most half of the HBM

``total_memory`` is ``torch.tpu.get_device_properties().total_memory`` (there is no ``mem_get_info``
on TPU, so free memory cannot be measured; the headroom stands for what the weights must leave free:
the static KV cache, activations and the compiled programs). The environment variable
``TRANSFORMERS_TPU_EXT_HBM_HEADROOM`` replaces the rule with a fixed headroom: a size (``"4GiB"``,
``"512MB"``, ``"1073741824"``), a percentage (``"20%"``) or a fraction below one (``"0.2"``).
A ``max_memory`` given by the user always wins over both.

On a TPU, ``max_memory`` names this process' chip ``"tpu"``; ``"tpu:0"``, ``torch.device("tpu")`` and
the GPU habit ``0`` are accepted for it (one process sees one chip, as ``tpu:0``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEFAULT_HEADROOM_FRACTION",
    "DEFAULT_HEADROOM_MAX_FRACTION",
    "DEFAULT_HEADROOM_MIN_BYTES",
    "HEADROOM_ENV",
    "TPU_KEY",
    "Headroom",
    "default_headroom",
    "headroom_bytes",
    "is_tpu_key",
    "merge_tpu_entry",
    "parse_headroom",
    "parse_size",
    "split_tpu_entry",
    "tpu_budget",
]

#: The key (and device-map value) naming this process' TPU chip.
TPU_KEY = "tpu"

#: Environment variable replacing the default headroom rule.
HEADROOM_ENV = "TRANSFORMERS_TPU_EXT_HBM_HEADROOM"

#: Default headroom: this fraction of the chip's HBM ...
DEFAULT_HEADROOM_FRACTION = 0.10
#: ... but at least this many bytes ...
DEFAULT_HEADROOM_MIN_BYTES = 1 << 30
#: ... and never more than this fraction of the HBM (so a small chip still gets weights).
DEFAULT_HEADROOM_MAX_FRACTION = 0.5

_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
    "TIB": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


class Headroom:
    """A headroom: either a fixed number of bytes or a fraction of the chip's HBM."""

    __slots__ = ("bytes", "fraction")

    def __init__(self, *, bytes: int | None = None, fraction: float | None = None) -> None:  # noqa: A002
        if (bytes is None) == (fraction is None):
            raise ValueError("a Headroom is either bytes or a fraction")
        if bytes is not None and bytes < 0:
            raise ValueError(f"headroom bytes must be >= 0, got {bytes}")
        if fraction is not None and not 0 <= fraction < 1:
            raise ValueError(f"headroom fraction must be in [0, 1), got {fraction}")
        self.bytes = bytes
        self.fraction = fraction

    def of(self, total_memory: int) -> int:
        """The headroom in bytes for a chip of ``total_memory`` bytes (never more than the chip)."""
        if self.bytes is not None:
            return min(self.bytes, total_memory)
        return min(math.ceil(total_memory * self.fraction), total_memory)

    def __repr__(self) -> str:
        return f"Headroom(bytes={self.bytes})" if self.bytes is not None else f"Headroom(fraction={self.fraction})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Headroom) and (self.bytes, self.fraction) == (other.bytes, other.fraction)


#: A bare number of bytes below this is refused as a headroom (it would leave nothing free).
_BARE_BYTES_MIN = 1 << 20


def parse_size(text: str) -> int:
    """``"4GiB"`` → 4294967296, ``"512MB"`` → 512000000, ``"123"`` → 123 (Accelerate's units)."""
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size; write e.g. '4GiB', '512MB' or a number of bytes (units: B, KB, MB, GB, TB, "
            "KiB, MiB, GiB, TiB)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def parse_headroom(text: str) -> Headroom:
    """Parse the value of ``TRANSFORMERS_TPU_EXT_HBM_HEADROOM``.

    ``"20%"`` and ``"0.2"`` are fractions of the HBM; ``"4GiB"``, ``"512MB"`` and ``"1073741824"`` are sizes.
    """
    value = text.strip()
    try:
        if value.endswith("%"):
            return Headroom(fraction=float(value[:-1]) / 100)
        try:
            number: float | None = float(value)
        except ValueError:
            number = None
        if number is not None and number < 1:
            return Headroom(fraction=number)
        if number is not None and (number != int(number) or number < _BARE_BYTES_MIN):
            # "1.5" used to mean 1 byte; "2" would mean 2 bytes: neither is what anyone means.
            raise ValueError(
                "a bare number is a fraction of the HBM below 1 (0.2) or a number of bytes (1073741824); "
                f"write e.g. {value}GiB for a size"
            )
        return Headroom(bytes=parse_size(value))
    except ValueError as error:
        raise ValueError(
            f"{HEADROOM_ENV}={text!r} is invalid ({error}); use a size such as '4GiB', a percentage such as '20%' "
            "or a fraction such as '0.2'"
        ) from None


def default_headroom(total_memory: int) -> int:
    """The documented default: 10 % of HBM, at least 1 GiB, at most half of HBM."""
    wanted = max(math.ceil(total_memory * DEFAULT_HEADROOM_FRACTION), DEFAULT_HEADROOM_MIN_BYTES)
    return min(wanted, int(total_memory * DEFAULT_HEADROOM_MAX_FRACTION))


def headroom_bytes(total_memory: int, environ: Mapping[str, str] | None = None) -> int:
    """The headroom for a chip of ``total_memory`` bytes: the env override if set, else the default.

    Raises ``ValueError`` (naming the variable) when the override cannot be parsed.
    """
    raw = (os.environ if environ is None else environ).get(HEADROOM_ENV, "").strip()
    if raw:
        return parse_headroom(raw).of(total_memory)
    return default_headroom(total_memory)


def tpu_budget(total_memory: int, environ: Mapping[str, str] | None = None) -> int:
    """Bytes of weights ``device_map="auto"`` may put on a chip of ``total_memory`` bytes."""
    return max(0, int(total_memory) - headroom_bytes(int(total_memory), environ))


def is_tpu_key(key: Any) -> bool:
    """Whether a ``max_memory`` key names the TPU (``"tpu"``, ``"tpu:0"``, a tpu ``torch.device``, an int)."""
    if isinstance(key, bool):
        return False
    if isinstance(key, int):
        return True
    if isinstance(key, str):
        return key.split(":", 1)[0] == TPU_KEY
    return getattr(key, "type", None) == TPU_KEY


def _index(key: Any) -> int:
    if isinstance(key, int):
        return key
    if isinstance(key, str):
        return int(key.split(":", 1)[1]) if ":" in key else 0
    index = getattr(key, "index", None)
    return 0 if index is None else int(index)


def split_tpu_entry(max_memory: Mapping[Any, Any] | None) -> tuple[Any, dict | None, list[Any]]:
    """Split a user's ``max_memory`` into (the TPU's value, the other entries, ignored TPU keys).

    The TPU's value is ``None`` when no key names the TPU. Keys naming another chip index are returned
    as ignored: one process can reach only the chip it is bound to (``tpu:0``). The other entries keep
    their order and are a new dict (``None`` stays ``None``).
    """
    if max_memory is None:
        return None, None, []
    value: Any = None
    ignored: list[Any] = []
    rest: dict = {}
    for key, size in max_memory.items():
        if not is_tpu_key(key):
            rest[key] = size
        elif _index(key) == 0 and value is None:
            value = size
        else:
            ignored.append(key)
    return value, rest, ignored


def merge_tpu_entry(memory: Mapping[Any, Any], tpu_bytes: int | None) -> dict:
    """``memory`` with the TPU entry first (Accelerate fills devices in key order), if there is one."""
    rest = {key: size for key, size in memory.items() if key != TPU_KEY}
    if tpu_bytes is None:
        return rest
    return {TPU_KEY: tpu_bytes, **rest}
