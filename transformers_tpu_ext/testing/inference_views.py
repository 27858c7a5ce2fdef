"""The simulated TPU's views taken inside ``torch.inference_mode()`` (used by ``device._dispatch``)."""

from __future__ import annotations

from typing import Any, Callable

import torch


def wrap_view(out: Any, wrap: Callable[[Any], Any]) -> Any:
    """``wrap(out)`` for the result of a view op run inside ``torch.inference_mode()``.

    A view is an inference tensor only if its base is one (as on the CPU and on a chip): the wrapper of
    a view of an ordinary tensor is made outside inference mode, or autograd cannot share the base's
    version counter with it ("Cannot set version_counter for inference tensor"; TRL's GRPOTrainer scores
    its completions so)."""
    if isinstance(out, torch.Tensor) and not out.is_inference():
        with torch.inference_mode(False):
            return wrap(out)
    if isinstance(out, (list, tuple)):
        return type(out)(wrap_view(o, wrap) for o in out)
    return wrap(out)
