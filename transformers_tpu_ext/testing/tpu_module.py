"""The simulated ``torch.tpu`` module: torch_tpu 0.2.0's public surface, quirks included.

Registered as ``torch.tpu`` (``torch._register_device_module``) by ``install()``. Functions read
the simulator's configuration when they are called, so ``configure()`` and ``hidden()`` take
effect at once. The names torch_tpu keeps for PyTorch itself (``device_count``, ``is_available``,
``synchronize``, ``get_rng_state``, ... from the torch release :data:`.internal_apis.INTERNAL_APIS`
names) refuse callers outside ``torch`` and this package, as torch_tpu's do (``@internal(name)``).
"""

from __future__ import annotations

import contextlib
import enum
import types
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from . import pallas as _pallas
from . import tpu_distributed as distributed  # noqa: F401 - part of the public surface
from .chips import CHIPS
from .compile_cache import (  # noqa: F401 - torch_tpu's private cache functions, ``torch.tpu._*``
    _get_cache_hits,
    _get_cache_misses,
    _get_cache_requests,
    _get_cache_stats,
    _set_cache_only,
    _set_dump_on_cache_miss,
)
from .device import STATE
from .internal_apis import internal

__all__ = [
    "EagerMode", "Event", "Precision", "Stream", "allow_excess_precision", "compiler",
    "current_device", "current_stream", "default_generators", "default_stream", "device",
    "device_count", "device_of", "distributed", "eager_mode", "get_amp_supported_dtype",
    "get_device_name", "get_device_properties", "get_rng_state", "initial_seed", "is_available",
    "is_initialized", "manual_seed", "manual_seed_all", "ops", "optimizers", "pallas", "precision",
    "profiler", "set_device", "set_eager_mode", "set_rng_state", "set_stream", "stream",
    "synchronize", "topology_aware_mesh",
]


def _sim() -> Any:
    from .instance import simulated_tpu

    sim = simulated_tpu()
    if sim is None:  # pragma: no cover - the module is registered by install()
        raise RuntimeError("the simulated TPU is not installed")
    return sim


def _visible_chips() -> int:
    sim = _sim()
    return 0 if sim.is_hidden else sim.chips


@internal("device_count")
def device_count() -> int:
    return _visible_chips()


@internal("is_available")
def is_available() -> bool:
    return _visible_chips() > 0


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def _lazy_init() -> None:
    return None


@internal("current_device")
def current_device() -> int:
    return 0


@internal("set_device")
def set_device(device: Any) -> None:
    index = _index(device)
    if index not in (None, 0):
        raise ValueError(
            f"Cannot set TPU device to index {index}, current process is bound to device index 0"
        )


def _index(device: Any) -> int | None:
    if device is None:
        return None
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return device.index
    raise TypeError(f"expected a TPU device or index, got {device!r}")


def _chip() -> Any:
    sim = _sim()
    if sim.is_hidden:
        raise RuntimeError("No TPU device found")
    chip = CHIPS.get(sim.generation)
    if chip is None:
        raise RuntimeError(f"Unrecognized TPU generation: {sim.generation!r}")
    return chip


@dataclass(frozen=True)
class _TpuDeviceProperties:
    name: str
    total_memory: int
    multi_processor_count: int


def get_device_properties(device: Any = None) -> _TpuDeviceProperties:
    chip = _chip()
    return _TpuDeviceProperties(
        name=chip.name,
        total_memory=int(_sim().hbm()),
        multi_processor_count=chip.cores,
    )


def get_device_name(device: Any = None) -> str:
    return _chip().name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    return (0, 0)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


@internal("synchronize")
def synchronize(device: Any = None) -> None:
    return None


def _clear_cache() -> None:
    """torch_tpu's ``torch.tpu._clear_cache()``: evict the in-memory tier. Every eager program is
    looked up again at its next use (compiled, or loaded from the persistent tier); TorchDynamo keeps
    the graphs it compiled."""
    STATE.seen = set()


# Random numbers: one generator for the chip, separate from the CPU's.
default_generators = (STATE.generator,)


def manual_seed(seed: int) -> None:
    STATE.generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    STATE.generator.manual_seed(int(seed))


def seed() -> None:
    STATE.generator.seed()


def seed_all() -> None:
    STATE.generator.seed()


@internal("initial_seed")
def initial_seed() -> int:
    return STATE.generator.initial_seed()


@internal("get_rng_state")
def get_rng_state(device: Any = "tpu") -> torch.Tensor:
    return STATE.generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "tpu") -> None:
    STATE.generator.set_state(new_state)


# Streams and events: operations run synchronously on the CPU, so these only keep the shape, and refuse
# what torch_tpu's refuse (torch_tpu/_internal/stream/streams.py: NotImplementedError with this message).
_NOT_IMPLEMENTED_STREAMS = (
    "Streams and Events are not fully implemented in TorchTPU. Please file a feature request describing your use case."
)
_PINNING = {"none": "unpinned", "unpinned": "unpinned", **dict.fromkeys(("tensorcore", "tensor_core", "tc", "tensor", "dense"), "tensorcore"),
            **dict.fromkeys(("sparse", "sparse_core", "sparsecore", "sc", "sparseoffload"), "sparsecore")}


class Stream:
    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = STATE.device
        self.priority = priority
        pinned = kwargs.get("pinned")
        if pinned is not None and not isinstance(pinned, str):
            raise ValueError(f"pinned must be a CorePinningMode or a string, got {type(pinned)}")
        if pinned is not None and pinned.lower() not in _PINNING:
            raise ValueError(f"Unknown device pinning mode: {pinned}")
        self.pinned = _PINNING[pinned.lower()] if pinned else "unpinned"

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        raise NotImplementedError(_NOT_IMPLEMENTED_STREAMS)

    def priority_range(self) -> Any:
        raise NotImplementedError(_NOT_IMPLEMENTED_STREAMS)

    def wait_event(self, event: Event) -> None:
        return None

    def wait_stream(self, stream: Stream) -> None:
        return None

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False, device: Any = None) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: Stream | None = None) -> Event:
        if stream is not None and not isinstance(stream, (Stream, torch.Stream)):
            raise TypeError(f"expected torch.Stream, but got {type(stream).__name__}")
        return self

    def ipc_handle(self) -> Any:
        raise NotImplementedError(_NOT_IMPLEMENTED_STREAMS)

    @classmethod
    def from_ipc_handle(cls, device: Any, handle: Any) -> Event:
        raise NotImplementedError(_NOT_IMPLEMENTED_STREAMS)

    def wait(self, stream: Stream | None = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: Event) -> float:
        return 0.0


_DEFAULT_STREAM = Stream()
_current_stream = _DEFAULT_STREAM


def default_stream(device: Any = None) -> Stream:
    return _DEFAULT_STREAM


@internal("current_stream")
def current_stream(device: Any = None) -> Stream:
    return _current_stream


@internal("set_stream")
def set_stream(stream: Stream) -> None:
    global _current_stream
    _current_stream = stream


@contextlib.contextmanager
def stream(stream: Stream | None) -> Iterator[None]:  # noqa: F811 - torch_tpu's parameter name
    global _current_stream
    previous = _current_stream
    if stream is not None:
        _current_stream = stream
    try:
        yield
    finally:
        _current_stream = previous


@internal("device")
class _DeviceContext:
    """``torch.tpu.device``: torch_tpu's class has this name (its errors name it)."""

    def __init__(self, device: Any) -> None:
        self.index = _index(device)

    def __enter__(self) -> None:
        set_device(self.index)

    def __exit__(self, *exc: Any) -> None:
        return None


device = _DeviceContext  # noqa: N816 - mirrors torch.cuda.device


class device_of(_DeviceContext):  # noqa: N801
    def __init__(self, obj: Any) -> None:
        super().__init__(obj.device if isinstance(obj, torch.Tensor) and obj.device.type == "tpu" else None)


# Eager mode and precision switches: accepted and remembered, with no numerical effect here.
class EagerMode(enum.Enum):
    DEFAULT = "default"
    COMPILED = "compiled"


class Precision(enum.Enum):
    DEFAULT = "default"
    HIGHEST = "highest"


_eager_mode = EagerMode.DEFAULT
_precision = Precision.DEFAULT


def set_eager_mode(mode: EagerMode) -> None:
    global _eager_mode
    _eager_mode = EagerMode(mode)


@contextlib.contextmanager
def eager_mode(mode: EagerMode) -> Iterator[None]:
    previous = _eager_mode
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(previous)


@contextlib.contextmanager
def precision(value: Precision) -> Iterator[None]:
    global _precision
    previous, _precision = _precision, Precision(value)
    try:
        yield
    finally:
        _precision = previous


@contextlib.contextmanager
def allow_excess_precision(enabled: bool = True) -> Iterator[None]:
    yield


def topology_aware_mesh(mesh_shape: Any, *, dcn_mesh_shape: Any = None, allow_split_physical_axes: bool = False,
                        contiguous_submeshes: bool = False) -> Any:
    raise NotImplementedError("the simulated TPU does not model topology_aware_mesh()")


compiler = types.SimpleNamespace()
ops = types.SimpleNamespace()
optimizers = types.SimpleNamespace()
# jax_op runs the JAX function (for the kernels it knows, their reference) on the CPU data: see .pallas
pallas = types.SimpleNamespace(jax_op=_pallas.jax_op, get_pallas_mesh=_pallas.get_pallas_mesh)
profiler = types.SimpleNamespace()
