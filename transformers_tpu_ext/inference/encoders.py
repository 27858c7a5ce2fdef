"""sentence-transformers: ``SentenceTransformer.encode()`` at a few static shapes (through ``bucketed(model)``).

A ``SentenceTransformer`` is a sequence of modules over a feature dict: the Transformer module runs
the Hugging Face model, Pooling pools its token embeddings under the attention mask, Normalize and
Dense work per row. Bucketing only the inner model would leave the pooling on the TPU at each
batch's own length (a program per length), so the whole forward is padded: the pooling runs on the
padded shapes under the mask (the result of every pooling mode is unchanged), and the feature dict
is cut back on the way out (rows, and the per-position fields to the real tokens).
:func:`.policy.encoder_facts` decides which models are padded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import policy
from .facts import model_facts
from .runtime import Bucketed, _cut

__all__ = ["SentenceTransformerCalls"]


def _inner(model: Any) -> Any:
    for module in model.children():
        if type(module).__name__ == "Transformer":
            return getattr(module, "model", None) or getattr(module, "auto_model", None)
    return None


def _modules(model: Any) -> list[tuple[str, tuple[str, ...]]]:
    found = []
    for module in model.children():
        modes = getattr(module, "pooling_mode", ()) if type(module).__name__ == "Pooling" else ()
        found.append((type(module).__name__, (modes,) if isinstance(modes, str) else tuple(modes)))
    return found


class SentenceTransformerCalls(Bucketed):
    """:class:`~.runtime.Bucketed` around a ``SentenceTransformer``'s forward (``model(features)``)."""

    def __init__(self, model: Any, **options: Any) -> None:
        super().__init__(model, **options)
        inner = _inner(model)
        self.module = inner if inner is not None else model
        facts = policy.encoder_facts(_modules(model), model_facts(inner) if inner is not None else policy.ModelFacts())
        self.refusal = facts if isinstance(facts, str) else None
        self.facts = facts if not isinstance(facts, str) else policy.ModelFacts()

    def wrapper_name(self) -> str | None:
        return None  # the SentenceTransformer's own forward (modules, pooling) is what compiles

    def _before(self, module: Any, args: tuple, kwargs: dict) -> Any:
        if len(args) != 1 or not isinstance(args[0], Mapping) or self.refusal:
            reason = self.refusal or "a SentenceTransformer called without one feature dict"
            self._stack().append(reason)
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
            return None
        result = super()._before(module, (), dict(args[0]))
        if result is None:
            return None
        return (result[1],), kwargs

    def _after(self, module: Any, args: tuple, kwargs: dict, output: Any) -> Any:
        stack = self._stack()
        plan = stack.pop() if stack else None
        if plan is None or isinstance(plan, str) or not isinstance(output, Mapping):
            return output
        return {key: _cut(value, plan, positions=key in policy.ENCODER_PER_POSITION) for key, value in output.items()}
