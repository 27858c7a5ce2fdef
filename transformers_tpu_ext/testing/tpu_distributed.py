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
_MASTER_PORT = 29500  # torch_tpu's default (internals Q6)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_tpu_launch_env(*, nnodes: int | None = None, nproc_per_node: int | None = None) -> None:
    """Set the variables torchrun workers need; idempotent, never overwrites a set variable.

    ``nproc_per_node`` defaults to the number of attached chips. Raises
    ``RuntimeError: No TPU topology found for count: N`` for a count the generation lacks.

    With ``nnodes > 1`` (a slice of several hosts): ``TPU_WORKER_HOSTNAMES`` must list ``nnodes``
    hosts. torch_tpu derives this host's index from its chips' coordinates; the simulated chips have
    none, so it is read from ``NODE_RANK`` (else ``JOB_COMPLETION_INDEX``), and a missing index is
    refused. Sets ``NODE_RANK``, ``NNODES``, ``MASTER_ADDR`` (the first host), ``MASTER_PORT``
    (29500), ``TORCH_TPU_DEVICES_PER_HOST`` and the slice builder addresses of every host.
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
        index = next((env[name].strip() for name in ("NODE_RANK", "JOB_COMPLETION_INDEX") if env.get(name, "").strip()), None)
        if index is None:
            raise RuntimeError(
                "the simulated TPU cannot tell which host of the slice this is (a chip derives it from its "
                "coordinates): set NODE_RANK (or JOB_COMPLETION_INDEX) to this host's index in TPU_WORKER_HOSTNAMES"
            )
        addresses = ",".join(f"{h}:{_SLICEBUILDER_PORT}" for h in hosts)
        env.setdefault("NODE_RANK", index)
        env.setdefault("NNODES", str(nodes))
        env.setdefault("MASTER_ADDR", hosts[0])
        env.setdefault("MASTER_PORT", str(_MASTER_PORT))
        env.setdefault("TORCH_TPU_DEVICES_PER_HOST", str(count))
    else:
        addresses = f"localhost:{_free_port()}"
    env.setdefault("TORCH_TPU_SLICEBUILDER_ADDRESSES", addresses)
    env.setdefault("TORCH_TPU_TOPOLOGY", chip.topology(count))
    env.setdefault("TORCH_TPU_XPROF_SESSION_ID", uuid.uuid4().hex)


def spmd_safe(func: Any) -> Any:
    return func


def topology_aware_mesh(mesh_shape: Any, *, dcn_mesh_shape: Any = None, allow_split_physical_axes: bool = False,
                        contiguous_submeshes: bool = False) -> Any:
    raise NotImplementedError("the simulated TPU does not model topology_aware_mesh()")


window_num_stripes = 1
window_stripe_chunk_mb = 64
