"""The decisions of multi-process runs (``transformers_tpu_ext.training.multiprocess``): plain data in,
plain data out, no torch. The tables in docs/training.md are checked against them here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from transformers_tpu_ext.training import multiprocess
from transformers_tpu_ext.training.multiprocess import GATHER_TPU, GATHER_UPSTREAM, gather_output_shape, gather_path, step_replica_problem

DOCS = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def test_only_tpu_tensors_on_the_tpu_process_group_take_the_tpu_gather():
    assert gather_path(backend="tpu_dist", device_type="tpu", tensor_device_type="tpu")[0] == GATHER_TPU
    assert gather_path(backend="tpu", device_type="tpu", tensor_device_type="tpu")[0] == GATHER_TPU
    for facts in (
        dict(backend="tpu_dist", device_type="tpu", tensor_device_type="cpu"),
        dict(backend="gloo", device_type="cpu", tensor_device_type="cpu"),
        dict(backend="nccl", device_type="cuda", tensor_device_type="cuda"),
        dict(backend=None, device_type="tpu", tensor_device_type="tpu"),
        dict(backend="tpu_dist", device_type="cpu", tensor_device_type="tpu"),
    ):
        path, reason = gather_path(**facts)
        assert path == GATHER_UPSTREAM and reason


@pytest.mark.parametrize(
    ("world", "shape", "expected"),
    [(2, (), (2,)), (2, (3,), (6,)), (4, (2, 12), (8, 12)), (2, (1, 2), (2, 2)), (3, (5, 7, 2), (15, 7, 2))],
)
def test_the_gather_output_is_world_times_input_on_dim_0(world, shape, expected):
    assert gather_output_shape(world, shape) == expected
    # the shape upstream returns too: view(-1, *shape[1:]) of world x numel elements
    numel = 1
    for size in shape:
        numel *= size
    rest = shape[1:]
    rest_numel = 1
    for size in rest:
        rest_numel *= size
    assert (world * numel // rest_numel, *rest) == expected


def test_gather_output_needs_a_world():
    with pytest.raises(ValueError):
        gather_output_shape(0, (2,))


def test_a_step_is_refused_only_for_unsynchronised_tpu_parameters_of_a_multi_process_tpu_run():
    common = dict(trainable=20, optimizer="SGD")
    assert step_replica_problem(world_size=1, backend=None, unsynchronised=20, **common) is None
    assert step_replica_problem(world_size=2, backend="tpu_dist", unsynchronised=0, **common) is None
    assert step_replica_problem(world_size=2, backend="gloo", unsynchronised=20, **common) is None
    problem = step_replica_problem(world_size=2, backend="tpu_dist", unsynchronised=20, **common)
    assert "2 processes would train unsynchronised replicas" in problem
    assert "20 of the 20 trainable TPU parameters of this SGD" in problem
    assert "accelerator.prepare()" in problem and f"TRANSFORMERS_TPU_EXT_DISABLE={multiprocess.REPLICA_CHECK_PATCH}" in problem


def _table(heading: str) -> list[list[str]]:
    """The rows of the first table after ``heading`` in docs/training.md, cells without backticks."""
    text = DOCS.read_text()
    section = text[text.index(heading):]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("|"):
            cells = [re.sub(r"`", "", cell).strip() for cell in line.strip("|").split("|")]
            if not set(cells[0]) <= {"-", " "}:
                rows.append(cells)
        elif rows:
            break
    return rows[1:]  # without the header


def test_the_docs_gather_table_is_what_the_predicate_decides():
    rows = _table("#### Gathers")
    assert len(rows) >= 4
    for backend, device, tensor, gathered_by in rows:
        backend = backend.split()[0]  # "tpu (torch_tpu's alias)"
        path, _ = gather_path(backend=None if backend == "none" else backend, device_type=device, tensor_device_type=tensor)
        assert (path == GATHER_TPU) == gathered_by.startswith("the plugin"), (backend, device, tensor, gathered_by)


def test_the_docs_replica_table_is_what_the_predicate_decides():
    rows = _table("#### The first optimizer step")
    assert len(rows) >= 4
    for processes, backend, outside, step in rows:
        problem = step_replica_problem(
            world_size=int(processes), backend=None if backend == "none" else backend, trainable=8,
            unsynchronised=int(outside.split()[0]), optimizer="AdamW",
        )
        assert (problem is not None) == step.startswith("refused"), (processes, backend, outside, step)
