"""``torch.inference_mode()`` on the simulated TPU behaves as on the CPU (and a chip): a view of an ordinary
tensor taken inside it is an ordinary tensor. It failed ("Cannot set version_counter for inference tensor"),
which stopped 54 of TRL's GRPO tests on the simulated TPU: GRPO scores completions with its reward model
under ``inference_mode`` and writes the scores into a slice of an ordinary tensor (docs/training.md)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _cases(device):
    out = {}
    ordinary = torch.zeros(2, 3, device=device)
    source = torch.arange(6.0, device=device).reshape(2, 3)
    with torch.inference_mode():
        made = torch.ones(2, 3, device=device)
        view = ordinary[:, 0]
        ordinary[:, 1] = source[:, 2]  # GRPO: rewards_per_func[:, i] = reward_func(...).logits[:, 0]
        parts = source.unbind(0)
        out["view of ordinary is inference"] = view.is_inference()
        out["made is inference"] = made.is_inference()
        out["view of inference is inference"] = made[:, 0].is_inference()
        out["unbind of ordinary is inference"] = [p.is_inference() for p in parts]
    out["written"] = ordinary.cpu().tolist()
    try:
        view.add_(1)  # a view made in inference mode, modified in place outside it
        out["in-place outside"] = "allowed"
    except RuntimeError as error:
        out["in-place outside"] = type(error).__name__
    return out


def test_views_in_inference_mode_are_as_on_the_cpu(simulated_tpu):
    assert _cases("tpu") == _cases("cpu")
    assert _cases("tpu")["written"] == [[0.0, 2.0, 0.0], [0.0, 5.0, 0.0]]
