"""The simulated device's process-wide state: the dispatcher's counters, device and generator (:data:`STATE`)."""

from __future__ import annotations

from typing import Any

import torch

from . import generators as _generators

_CPU = torch.device("cpu")

DEVICE_MISMATCH = "tensor is expected to be on tpu, got cpu"


class _State:
    """Mutable process-wide state of the dispatcher (plain attributes: read on every op)."""

    def __init__(self) -> None:
        self.device: torch.device | None = None  # torch.device("tpu", 0) once registered
        self.in_graph = 0  # >0 while a graph compiled by the "tpu" backend runs
        self.seen: set[Any] = set()
        self.eager_programs = 0
        self.eager_ops = 0  # eager operations run (every counted op, compiled before or not)
        self.graph_calls = 0  # runs of graphs compiled by the "tpu" backend
        self.h2d_bytes = 0
        self.d2h_bytes = 0
        self.generator = _generators.make_default()  # torch.tpu.default_generators[0]
        self.handles_issued = False  # a device storage was handed out (writes must renew handles)

    def reset(self) -> None:
        self.seen = set()
        self.eager_programs = 0
        self.eager_ops = 0
        self.graph_calls = 0
        self.h2d_bytes = 0
        self.d2h_bytes = 0


STATE = _State()


def _fake_mode_active() -> bool:
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
