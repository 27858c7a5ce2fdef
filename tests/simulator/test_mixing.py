"""CPU tensors next to TPU tensors in one operator: refused as a device refuses them (``testing.mixing``).

The simulator used to take any 0-dim CPU tensor in any operator, and any CPU tensor in ``index_put_``
(its values too); a device takes a 0-dim CPU tensor only as a number (element-wise operators, the
value of ``masked_fill``/``fill_``/``index_put_``) and CPU tensors only as indices.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from transformers_tpu_ext.testing.mixing import host_rule  # noqa: E402

MISMATCH = "tensor is expected to be on tpu, got cpu"


def test_the_rule_is_plain_data():
    assert host_rule("add", "Tensor", True) == (True, False)
    assert host_rule("mm", "default", False) == (False, False)
    assert host_rule("index", "Tensor", False) == (False, True)
    assert host_rule("index_put_", "default", False) == (True, True)
    assert host_rule("_foreach_mul_", "Tensor", False).scalars
    assert host_rule("_foreach_mul_", "List", False).scalars  # pair by pair: each pair takes a CPU scalar


REFUSED = {
    "add of a 1-d cpu tensor": lambda x, m: x + torch.ones(3),
    "mm with a cpu matrix": lambda x, m: m @ torch.ones(3, 3),
    "cat with a 0-dim cpu tensor": lambda x, m: torch.stack([x[0], torch.tensor(1.0)]),
    "index_select with a 0-dim cpu index": lambda x, m: torch.index_select(x, 0, torch.tensor(0)),
    "embedding of cpu ids": lambda x, m: torch.nn.functional.embedding(torch.tensor([0, 1]), m),
    "gather with a cpu index": lambda x, m: torch.gather(m, 1, torch.zeros(3, 1, dtype=torch.long)),
    "index_put_ of cpu values": lambda x, m: x.index_put_((torch.tensor([0, 1]),), torch.ones(2)),
    "matmul with a 0-dim cpu tensor": lambda x, m: torch.mul(m, torch.ones(3, 3)),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_mixing_is_refused(simulated_tpu, case):
    x, m = torch.arange(3.0, device="tpu"), torch.ones(3, 3, device="tpu")
    with pytest.raises(RuntimeError, match=MISMATCH):
        REFUSED[case](x, m)


def test_cpu_scalars_and_indices_are_taken_as_a_device_takes_them(simulated_tpu):
    x = torch.arange(4.0, device="tpu")
    assert (x + torch.tensor(1.0)).cpu().tolist() == [1, 2, 3, 4]
    assert torch.where(x > 1, torch.tensor(0.0), x).cpu().tolist() == [0, 1, 0, 0]
    assert x.masked_fill(x > 2, torch.tensor(-1.0)).cpu().tolist() == [0, 1, 2, -1]
    assert x[torch.tensor([3, 0])].cpu().tolist() == [3, 0]
    y = x.clone()
    y[torch.tensor([1])] = 7.0  # index_put_ with cpu indices and a 0-dim cpu value
    y[y > 6] = torch.tensor(5.0)
    assert y.cpu().tolist() == [0, 5, 2, 3]
    assert x.device.type == "tpu" and y.device.type == "tpu"
