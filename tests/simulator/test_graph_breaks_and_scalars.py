"""What vision-language models do on a chip that the simulated TPU must do too (issue 38).

- A compiled function that breaks its graph on a device value (``.item()``, ``torch._check_tensor_all``: the
  placeholder checks of Transformers' vision-language models) runs its eager part and resumes: TorchDynamo never
  tries to compile the simulator's own dispatch frames (torch_tpu's is C++).
- ``torch.tensor([t, ...])`` of device scalars (Qwen-VL's ``get_rope_index``) reads each one, as on a chip.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_a_graph_break_on_a_device_value_runs_and_resumes(simulated_tpu):
    def checked(x):
        y = x * 2
        torch._check_tensor_all((y > -1e9).all())
        return y + 1

    def branched(x):
        y = x * 2
        return y + 1 if y.sum().item() > 0 else y - 1

    x = torch.randn(4, 3)
    assert torch.equal(torch.compile(checked, backend="tpu", dynamic=False)(x.to("tpu")).cpu(), checked(x))
    assert torch.equal(torch.compile(branched, backend="tpu")(x.to("tpu")).cpu(), branched(x))


def test_a_tensor_of_device_scalars(simulated_tpu):
    values = torch.arange(3).to("tpu")
    scalar = values.max() + 1 - 2
    assert torch.tensor([scalar, scalar]).tolist() == [1, 1]
    assert torch.tensor([scalar], device="tpu").cpu().tolist() == [1]
