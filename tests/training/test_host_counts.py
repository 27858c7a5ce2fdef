"""Count-shaped tensors of a library trainer's step on the host (``training/host_counts.py``): a selection by a
mask or a label, written in the library's code, costs no program per count; values and gradients are the CPU's;
code outside the library (a model's forward) is left alone."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from transformers_tpu_ext.training.host_counts import HostCounts  # noqa: E402

#: This file stands for the library (TRL): its selections go to the host.
LIBRARY = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)


def _metrics(x, mask, weights, labels):
    """What TRL's DPO and KTO steps do: a sum over a boolean selection, rows split by a label, a loss term
    over the selected rows (with gradients), an index assignment by a mask, an empty placeholder."""
    total = x[mask.bool()].sum()
    chosen = torch.nonzero(labels, as_tuple=False).view(-1)
    picked = weights.index_select(0, chosen)
    loss = (picked * 2 - total.detach()).mean()
    ends = torch.full((mask.shape[0],), 99, device=x.device)
    rows = mask.bool().any(dim=1)
    ends[rows] = mask.int().argmax(dim=1)[rows]
    empty = torch.Tensor([]).to(x.device)
    return total, loss, ends, torch.cat((empty * 2.0, picked.detach()))


# The same function, as a model's own code (another file): its selection stays on the device.
_ELSEWHERE: dict = {}
exec(compile("def select(x, m):\n    return x[m.bool()].sum()\n", "/elsewhere/modeling.py", "exec"), {"torch": torch}, _ELSEWHERE)


def _run(sim, device, masks, mode):
    x = torch.arange(12.0).reshape(3, 4).to(device)
    weights = torch.linspace(0.5, 2.0, 3, device=device, requires_grad=True)
    results, programs = [], []
    for mask in masks:
        mask = torch.tensor(mask, device=device)
        labels = mask[:, 0]
        before = sim.counters()
        with mode() if mode else _nothing():
            total, loss, ends, cat = _metrics(x, mask, weights, labels)
        loss.backward()
        programs.append((sim.counters() - before).programs)
        results.append((total.item(), loss.item(), ends.tolist(), cat.tolist(), weights.grad.tolist(), total.device.type))
        weights.grad = None
    return results, programs


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


MASKS = [[[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 0, 0]], [[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]],
         [[0, 1, 1, 1], [1, 0, 0, 1], [0, 0, 0, 1]], [[1, 1, 0, 1], [1, 1, 1, 0], [0, 1, 0, 0]]]


def test_selections_by_a_count_cost_no_program_and_give_the_cpu_s_values(simulated_tpu):
    cpu, _ = _run(simulated_tpu, "cpu", MASKS, None)
    host, programs = _run(simulated_tpu, "tpu", MASKS, lambda: HostCounts(LIBRARY))
    assert [r[:5] for r in host] == [r[:5] for r in cpu]  # values and gradients: the CPU's
    assert {r[5] for r in host} == {"tpu"}  # a sum goes back to the device, where the step continues
    assert programs[0] > 0 and programs[1:] == [0, 0, 0], programs  # new counts: no program


def test_without_it_every_new_count_compiles(simulated_tpu):
    _, programs = _run(simulated_tpu, "tpu", MASKS, None)
    assert programs[1] > 0 and programs[2] > 0, programs  # counts not seen before: new programs


def test_code_outside_the_library_is_left_alone(simulated_tpu):
    x = torch.arange(8.0, device="tpu")
    with HostCounts(LIBRARY):
        outside = _ELSEWHERE["select"](x, x > 2)
        inside = x[x > 2].sum()
    assert outside.device.type == inside.device.type == "tpu"
    before = simulated_tpu.counters()
    with HostCounts(LIBRARY):
        _ELSEWHERE["select"](x, x > 5)  # a new count on the device: upstream's program
    assert (simulated_tpu.counters() - before).programs > 0
