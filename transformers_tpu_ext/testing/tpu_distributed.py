"""The simulated ``torch.tpu.distributed``: ``set_tpu_launch_env`` and friends."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

from .chips import CHIPS

__all__ = [
    "set_tpu_launch_env",
    "spmd_safe",
    "topology_aware_mesh",
    "window_num_stripes",
    "window_stripe_chunk_mb",
]

_SLICEBUILDER_PORT = 8471


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_tpu_launch_env(*, nnodes: int | None = None, nproc_per_node: int | None = None) -> None:
    """Set the variables torchrun workers need; idempotent, never overwrites a set variable.

    ``nproc_per_node`` defaults to the number of attached chips. Raises
    ``RuntimeError: No TPU topology found for count: N`` for a count the generation lacks.
    """
    from .instance import simulated_tpu

    sim = simulated_tpu()
    if sim is None:  # pragma: no cover - registered by install()
        raise RuntimeError("the simulated TPU is not installed")
    sim.launch_env_calls.append({"nnodes": nnodes, "nproc_per_node": nproc_per_node})
    count = int(nproc_per_node) if nproc_per_node is not None else (0 if sim.is_hidden else sim.chips)
    chip = CHIPS.get(sim.generation)
    if chip is None or count not in chip.topologies:
        raise RuntimeError(f"No TPU topology found for count: {count}")
    nodes = int(nnodes or 1)
    env = os.environ
    if nodes > 1:
        hosts = [h.strip() for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
        if len(hosts) != nodes:
            raise RuntimeError(
                f"nnodes={nodes} needs TPU_WORKER_HOSTNAMES to list {nodes} hosts, "
                f"got {len(hosts)}: {env.get('TPU_WORKER_HOSTNAMES', '')!r}"
            )
        addresses = ",".join(f"{h}:{_SLICEBUILDER_PORT}" for h in hosts)
        rank = env.get("NODE_RANK", env.get("JOB_COMPLETION_INDEX", "0"))
        env.setdefault("TORCH_TPU_DEVICES_PER_HOST", str(count))
        env.setdefault("TORCH_TPU_HOST_INDEX", str(rank))
    else:
        addresses = f"localhost:{_free_port()}"
    env.setdefault("TORCH_TPU_SLICEBUILDER_ADDRESSES", addresses)
    env.setdefault("TORCH_TPU_TOPOLOGY", chip.topology(count))
    env.setdefault("TORCH_TPU_XPROF_SESSION_ID", uuid.uuid4().hex)


def spmd_safe(fn: Any) -> Any:
    return fn


def topology_aware_mesh(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("the simulated TPU does not model topology_aware_mesh()")


window_num_stripes = 1
window_stripe_chunk_mb = 64
