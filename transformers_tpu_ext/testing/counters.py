"""What the simulated TPU counts: compiled programs and host↔device traffic.

Pure data, no torch: a :class:`Counters` is a frozen snapshot taken by
``SimulatedTPU.counters()``; subtracting two snapshots gives what happened in between.
"""

from __future__ import annotations

from dataclasses import asdict as _asdict
from dataclasses import dataclass, fields

__all__ = ["Counters"]


@dataclass(frozen=True)
class Counters:
    """Cumulative counts since the last ``reset_counters()`` (or since install).

    - ``graphs_compiled``: graphs the ``"tpu"`` compile backend compiled (one per graph, graph
      breaks included), like torch_tpu compiling one program per captured graph.
    - ``eager_programs``: distinct eager per-shape programs, i.e. distinct
      ``(operator, input shapes, dtypes)`` signatures executed eagerly on the TPU (torch_tpu's
      eager mode compiles every operation once per input shape). View and transfer operations
      compile nothing and are not counted.
    - ``h2d_bytes`` / ``d2h_bytes``: bytes copied host→device (CPU→TPU) and device→host.
    - ``programs_loaded``: programs (graphs or eager) the process needed and loaded from torch_tpu's
      persistent compile cache instead of compiling them (``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT``,
      see ``compile_cache``); they are not in ``graphs_compiled`` / ``eager_programs``.
    - ``graph_calls``: runs of graphs the ``"tpu"`` backend compiled (each a launch of one program on a chip).
    - ``eager_ops``: operations run eagerly on the TPU, each counted every time it runs (on a chip each is a
      launch of its own per-shape program and a round trip through HBM); not counted inside a compiled graph.
    """

    graphs_compiled: int = 0
    eager_programs: int = 0
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    programs_loaded: int = 0
    graph_calls: int = 0
    eager_ops: int = 0

    @property
    def programs(self) -> int:
        """All compiled programs: graphs plus eager per-shape programs (loaded ones not included)."""
        return self.graphs_compiled + self.eager_programs

    def asdict(self) -> dict[str, int]:
        return _asdict(self)

    def __sub__(self, other: Counters) -> Counters:
        if not isinstance(other, Counters):
            return NotImplemented
        return Counters(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def __add__(self, other: Counters) -> Counters:
        if not isinstance(other, Counters):
            return NotImplemented
        return Counters(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})
