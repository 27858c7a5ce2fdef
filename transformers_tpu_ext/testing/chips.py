"""What torch_tpu 0.2.0 knows of each chip generation (pure data, no torch).

These are the *backend's* facts, reproduced by the simulated TPU; the plugin keeps its own view
of them where it needs one, so a test on the simulator checks the plugin against the backend
rather than against itself.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CHIPS", "Chip", "parse_bytes"]

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

def parse_bytes(text: str | int) -> int:
    """``"1GiB"`` → 1073741824, ``"16GB"`` → 16000000000, ``"4096"`` → 4096."""
    from ..placement import parse_size  # one size syntax for the whole project

    return text if isinstance(text, int) else parse_size(text)
