"""The simulated TPU takes torch's foreach implementations where a chip does (``testing/foreach.py``).

On a chip, torch_tpu tensors are plain tensors of a privateuse1 device, which torch's foreach device
list holds: ``torch.optim.AdamW()`` (``foreach=None``) runs the multi-tensor step and
``clip_grad_norm_`` the ``_foreach_norm`` path. The simulator's tensors are a wrapper subclass, which
torch's type check would send to the single-tensor loops instead.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_optimizers_default_to_foreach_on_the_simulated_tpu(simulated_tpu):
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [torch.nn.Parameter(torch.ones(3, device="tpu")), torch.ones(2, device="tpu")]
    assert _default_to_fused_or_foreach(params, differentiable=False) == (False, True)
    assert _default_to_fused_or_foreach(params, differentiable=False, use_fused=True) == (True, False)
    # the host keeps torch's own choice (no foreach on CPU by default)
    assert _default_to_fused_or_foreach([torch.nn.Parameter(torch.ones(3))], differentiable=False) == (False, False)


def test_adamw_and_clip_grad_norm_take_the_foreach_path(simulated_tpu, monkeypatch):
    import torch.optim.adam as adam

    taken = []
    for name in ("_multi_tensor_adam", "_single_tensor_adam"):
        original = getattr(adam, name)
        monkeypatch.setattr(adam, name, lambda *a, _name=name, _f=original, **k: (taken.append(_name), _f(*a, **k))[1])
    model = torch.nn.Linear(4, 2).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.ones(3, 4, device="tpu")).sum().backward()
    optimizer.step()
    assert taken == ["_multi_tensor_adam"]
    from torch.utils._foreach_utils import _has_foreach_support  # what clip_grad_norm_(foreach=None) asks

    assert _has_foreach_support([p.grad for p in model.parameters()], torch.device("tpu", 0))
