"""Which padded inference calls run as one compiled program: plain data in, plain data out (no torch).

A call :func:`.policy.plan_call` (or :func:`.media.plan_media_call`) padded to a bucket has one shape per
bucket, so its forward can be one graph of the ``tpu`` compile backend per bucket
(``torch.compile(..., backend="tpu", dynamic=False, fullgraph=True)``), instead of one device program
launched per operation (a 2-layer BERT: about 34 per forward; a real one: hundreds). What is compiled is
the model's own ``forward`` (its class's, with the padded inputs and the call's options) under
``torch.no_grad``; padding the inputs and cutting the outputs back stay outside, on the host.

:func:`compile_path` is the "safe when" predicate: ``None`` when the padded call may run compiled, else why
not and what would help (the call then runs as before: eager, still padded). It refuses:

- a call that was not padded (each new shape would be a new graph);
- ``compile=False`` (``bucketed(model, compile=False)``), ``torch.compiler.set_stance("force_eager")``, a call
  already inside a compiled region (the outer graph holds it);
- a wrapper between the caller and the model (PEFT, DDP, a ``torch.compile``'d module), or a ``forward``
  replaced on the instance (Accelerate's offload hooks, a user's patch): the code that would be compiled is
  not the model's own;
- forward hooks or pre-hooks on the model or its submodules other than the plugin's (a hook that records
  activations has side effects a graph would replay once, at tracing);
- gradients recorded (grad mode on and a parameter that requires grad): a training graph, not this one;
- an option other than :data:`OPTIONS` (each value of a Python option is guarded by the graph: an unknown
  one could be a new graph per call);
- a model whose forward broke the graph once (``fullgraph=True`` raised at tracing): it is not retried.

``output_hidden_states=True`` and ``output_attentions=True`` change the graph: the first is compiled (a
graph of its own per bucket), the second is never padded (``plan_call`` refuses it: attention weights over
the padding could not be cut back), so it never reaches this predicate.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["OPTIONS", "CompileFacts", "compile_path", "padding_waste", "planned_graphs"]

#: Python options a compiled padded call may carry (each value is guarded by its graph: one graph per
#: bucket and value). Anything else makes the call run eagerly.
OPTIONS = frozenset({"use_cache", "return_dict", "output_hidden_states"})


@dataclass(frozen=True)
class CompileFacts:
    """What decides whether one padded call runs compiled (read off the call by ``inference.compiled``).

    - ``padded``: the call was padded to a bucket; ``enabled``: compiling is not switched off;
    - ``eager_stance``: under ``torch.compiler.set_stance("force_eager")``; ``compiling``: already
      inside a compiled region;
    - ``wrapper``: the class name of a wrapper between the caller and the model (``None``: none);
    - ``forward_replaced``: the model's ``forward`` is an attribute of the instance;
    - ``hooks``: forward hooks and pre-hooks on the model and its submodules, the plugin's own excluded;
    - ``grad``: gradients would be recorded; ``options``: the names of the call's non-tensor arguments;
    - ``graph_break``: why an earlier compile of this model's forward failed (``None``: never failed).
    """

    padded: bool = True
    enabled: bool = True
    eager_stance: bool = False
    compiling: bool = False
    wrapper: str | None = None
    forward_replaced: bool = False
    hooks: int = 0
    grad: bool = False
    options: frozenset[str] = frozenset()
    graph_break: str | None = None


def compile_path(facts: CompileFacts) -> str | None:
    """``None`` when the padded call may run as one compiled program per bucket, else why it runs eagerly
    (padded all the same) and what would help."""
    if not facts.padded:
        return "the call is not padded to a bucket (a graph per shape would compile in every new call)"
    if not facts.enabled:
        return "compiling is switched off (bucketed(model, compile=False))"
    if facts.eager_stance:
        return 'torch.compiler.set_stance("force_eager"): leave that block to compile'
    if facts.compiling:
        return "the call is inside a compiled region already: the outer graph holds it"
    if facts.wrapper is not None:
        return f"a {facts.wrapper} wraps the model: call the model itself (its forward is what compiles)"
    if facts.forward_replaced:
        return ("the model's forward is replaced on the instance (Accelerate's offload hooks, a patch): "
                "load the model on the TPU whole (device_map='auto' on a chip that holds it)")
    if facts.hooks:
        return (f"{facts.hooks} forward hook{'s' if facts.hooks != 1 else ''} on the model: a graph would run "
                "them once, when it is traced; remove them to compile")
    if facts.grad:
        return "gradients are recorded: run the loop under torch.no_grad() (pipelines do)"
    unknown = sorted(facts.options - OPTIONS)
    if unknown:
        return f"options {', '.join(unknown)}: each value could be a graph of its own; pass only {', '.join(sorted(OPTIONS))}"
    if facts.graph_break is not None:
        return (f"its forward breaks the graph ({facts.graph_break}): it runs op by op; "
                "a model whose forward compiles whole (torch.compile(fullgraph=True)) would run as one program")
    return None


def planned_graphs(lengths: Collection[int], rows: Collection[int], options: int = 1) -> int:
    """Graphs a padded forward plans: one per (length bucket, row bucket) pair, per combination of options."""
    return max(1, len(set(lengths))) * max(1, len(set(rows))) * max(1, options)


def padding_waste(real_tokens: int, padded_tokens: int) -> float:
    """Tokens computed over tokens needed (padded rows x length, summed over calls, over the real tokens)."""
    return round(padded_tokens / real_tokens, 3) if real_tokens else 1.0
