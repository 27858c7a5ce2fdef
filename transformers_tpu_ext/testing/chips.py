"""What torch_tpu 0.2.0 knows of each chip generation (pure data, no torch).

These are the *backend's* facts, reproduced by the simulated TPU; the plugin keeps its own view
of them where it needs one, so a test on the simulator checks the plugin against the backend
rather than against itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..settings.parser import OFF_WORDS, ON_WORDS

__all__ = ["CHIPS", "HOST_SHARE", "SIMULATE_ENV", "SIMULATE_KEYS", "Chip", "default_hbm", "parse_bytes", "parse_spec"]

GiB = 1 << 30


@dataclass(frozen=True)
class Chip:
    generation: str
    hbm_bytes: int
    #: Process counts (chips per host) with a topology, as ``set_tpu_launch_env`` accepts them.
    topologies: tuple[int, ...]
    #: TensorCores per chip (``get_device_properties().multi_processor_count``).
    cores: int

    @property
    def name(self) -> str:
        return f"TPU {self.generation}"

    def topology(self, count: int) -> str:
        """The ``TORCH_TPU_TOPOLOGY`` value for ``count`` chips (2D for v5e/v6e, 3D otherwise)."""
        if self.generation in ("v5e", "v6e"):
            return {1: "1x1", 4: "2x2", 8: "2x4"}[count]
        return {1: "1x1x1", 2: "1x2x1", 4: "2x2x1", 8: "2x2x2"}[count]


CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 32 * GiB, (1, 2, 4, 8), 2),
    "v5e": Chip("v5e", 16 * GiB, (1, 4, 8), 1),
    "v5p": Chip("v5p", 95 * GiB, (1, 2, 4, 8), 2),
    "v6e": Chip("v6e", 32 * GiB, (1, 4, 8), 1),
    "v7": Chip("v7", 192 * GiB, (2, 4, 8), 2),
}

#: The simulated chips of a host share at most this fraction of the host's memory by default.
HOST_SHARE = 0.5
_HBM_STEP = 256 << 20


def default_hbm(chip: Chip, chips: int, host_bytes: int | None) -> int:
    """The simulated HBM per chip when none is given: the generation's, capped so that the host's
    ``chips`` chips together fit in :data:`HOST_SHARE` of its memory (``host_bytes``), in steps of 256 MiB.

    Everything on the simulated TPU lives in host memory: a v6e's 32 GiB on a 16 GiB laptop would make
    code that sizes a buffer from the HBM (the serving KV cache) allocate more than the machine has.
    """
    if not host_bytes:
        return chip.hbm_bytes
    share = int(host_bytes * HOST_SHARE) // max(int(chips), 1)
    return min(chip.hbm_bytes, max(share // _HBM_STEP * _HBM_STEP, _HBM_STEP))


def parse_bytes(text: str | int) -> int:
    """``"1GiB"`` → 1073741824, ``"16GB"`` → 16000000000, ``"4096"`` → 4096."""
    from ..placement.budget import parse_size  # one size syntax for the whole project

    return text if isinstance(text, int) else parse_size(text)


# ---------------------------------------------------------------------------------------------
# TRANSFORMERS_TPU_EXT_SIMULATE (pure: the plugin checks the variable at activation without torch)

#: The variable that installs the simulated TPU at ``import torch`` in every process.
SIMULATE_ENV = "TRANSFORMERS_TPU_EXT_SIMULATE"
#: Its keys, with what each takes.
SIMULATE_KEYS = {
    "chips": "chips on the host (a count the generation has a topology for)",
    "generation": "v4, v5e, v5p, v6e or v7 (another vNN emulates a chip torch_tpu does not know)",
    "hbm": "HBM per chip, e.g. 1GiB or 512MiB (default: the generation's, capped to fit this host's memory)",
    "untie_on_move": "1 to reproduce torch_tpu #4161 (moves untie shared parameters), 0 not to",
}
_ALIASES = {"hbm_bytes": "hbm", "untie": "untie_on_move"}
_ON = ON_WORDS  # the settings layer's one vocabulary
_OFF = OFF_WORDS
_SPEC_HELP = (
    f"use 1 (the default host: 4 v6e chips), 0 (off) or comma-separated key=value pairs with keys "
    f"{', '.join(SIMULATE_KEYS)}, e.g. chips=8,generation=v5e,hbm=1GiB"
)


def simulate_requested(spec: str | None) -> bool:
    """Whether a ``TRANSFORMERS_TPU_EXT_SIMULATE`` value asks for the simulator (unset, empty, 0: no)."""
    return bool(spec and spec.strip() and spec.strip().lower() not in _OFF)


def parse_spec(spec: str) -> dict[str, Any]:
    """``"1"`` → ``{}``; ``"chips=4,generation=v6e,hbm=1GiB,untie_on_move=1"`` → ``install()`` kwargs.

    Raises ``ValueError`` naming the variable and the accepted keys. A chip count the generation has
    no topology for (a v6e host with 3 chips) is refused here, at install, rather than when
    ``transformers-tpu launch`` or ``set_tpu_launch_env`` meets it.
    """
    text = spec.strip()
    if text.lower() in _ON or not text:
        return {}
    where = f"{SIMULATE_ENV}={spec!r}"
    kwargs: dict[str, Any] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        key = _ALIASES.get(key, key)
        if not sep:
            raise ValueError(f"{where} is not valid ({part.strip()!r} is not key=value): {_SPEC_HELP}")
        if key not in SIMULATE_KEYS:
            raise ValueError(f"{where}: unknown key {key!r}; the keys are {', '.join(SIMULATE_KEYS)} ({_SPEC_HELP})")
        try:
            if key == "chips":
                kwargs["chips"] = int(value)
                if kwargs["chips"] < 1:
                    raise ValueError("at least 1")
            elif key == "generation":
                if not value.lower().startswith("v"):
                    raise ValueError(f"a generation looks like v6e (known: {', '.join(CHIPS)})")
                kwargs["generation"] = value.lower()
            elif key == "hbm":
                kwargs["hbm_bytes"] = parse_bytes(value)
            else:
                if value.lower() not in _ON | _OFF:
                    raise ValueError("use 1 or 0")
                kwargs["untie_on_move"] = value.lower() in _ON
        except ValueError as error:
            raise ValueError(f"{where}: bad {key} {value!r} ({error}); {SIMULATE_KEYS[key]}") from None
    problem = check_host(kwargs.get("chips", 4), kwargs.get("generation", "v6e"))
    if problem:
        raise ValueError(f"{where}: {problem}")
    return kwargs


def check_host(chips: int, generation: str) -> str | None:
    """``None`` when a ``generation`` host can have ``chips`` chips, else why not (unknown generations pass)."""
    chip = CHIPS.get(str(generation).lower())
    if chip is None or chips in chip.topologies:
        return None
    *first, last = map(str, chip.topologies)
    counts = f"{', '.join(first)} or {last}" if first else last
    near = min(chip.topologies, key=lambda count: (abs(count - chips), -count))
    return (
        f"a TPU {chip.generation} host has {counts} chips (the counts torch_tpu has a topology for), not {chips}: "
        f"use e.g. chips={near}"
    )
