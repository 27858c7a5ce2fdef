"""A padded inference forward as one compiled program per bucket (the glue of :mod:`.compile_policy`).

While a :class:`~.runtime.Bucketed` block is active, the model it watches gets a ``forward`` of the
instance (:func:`install`, taken off again by :func:`uninstall`) that runs each call the block padded
through :func:`run`: the facts of :func:`.compile_policy.compile_path` are read off the call, and a call
it accepts runs the model class's ``forward`` through one ``torch.compile(backend="tpu", dynamic=False,
fullgraph=True)`` function, under ``torch.no_grad``. Every other call runs the original ``forward``
(eagerly, padded all the same), and the reason is said once at WARNING.

Graphs: one per bucket (rows x length, and each option value), shared by models of the same class and
config (TorchDynamo lifts the parameters as inputs). TorchDynamo's recompile limit is raised to the
shapes this process has compiled (``compilation.recompile_limit``, work ``"infer"``). A forward that
breaks the graph (``fullgraph=True`` raises while tracing, before anything runs) runs eagerly from then
on, for that model and those options. An error while compiling in cache-only mode is re-raised (a
steady state that needs a program is the caller's to know); any other failure of a compile runs the
call eagerly: an error that call raises is upstream's (the caller's input), otherwise the model is
not compiled again.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import Any

from ..compilation import guard, recompile, recompile_limit
from . import compile_policy

__all__ = ["install", "run", "uninstall"]

logger = logging.getLogger("transformers_tpu_ext")
_lock = threading.Lock()
_compiled: Any = None
_shapes: set[Any] = set()  # (class, shapes, options) compiled in this process: the recompile limit planned
_said: set[str] = set()
_ATTRIBUTE = "_transformers_tpu_ext_forward"  # marks the instance forward install() set

#: What the recompile limit is raised to at least (TorchDynamo's default is 8; a pipeline's ladder has ~20 buckets).
FLOOR = 64


def _forward(module: Any, args: tuple, kwargs: dict) -> Any:
    return type(module).forward(module, *args, **kwargs)


def _function() -> Any:
    global _compiled
    if _compiled is None:
        import torch

        from .. import backend

        _compiled = torch.compile(_forward, backend=backend.DEVICE_TYPE, dynamic=False, fullgraph=True)
    return _compiled


def reset() -> None:
    """Forget the compiled function and the shapes planned (tests, after ``torch._dynamo.reset()``)."""
    global _compiled
    with _lock:
        _compiled = None
        _shapes.clear()
    recompile_limit.release("infer")


def install(calls: Any, target: Any) -> bool:
    """Give ``target`` an instance ``forward`` that runs ``calls``' padded calls through :func:`run`;
    False (nothing changed) when the instance has a ``forward`` of its own already."""
    if "forward" in vars(target):
        return False
    original = target.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        plan = calls.current_plan()
        if plan is None:
            return original(*args, **kwargs)
        with recompile.guarded("infer", calls.model, lambda covered: _describe(plan, covered)):
            return run(calls, target, original, args, kwargs, plan)

    setattr(forward, _ATTRIBUTE, True)
    object.__setattr__(target, "forward", forward)
    return True


def uninstall(target: Any) -> None:
    """Take :func:`install`'s ``forward`` off ``target`` (the class's is the model's again)."""
    found = vars(target).get("forward")
    if found is not None and getattr(found, _ATTRIBUTE, False):
        del vars(target)["forward"]


def _describe(plan: Any, covered: Any) -> recompile.CallFacts:
    call = f"{plan.original_rows} x {plan.original_length} padded to {plan.rows} x {plan.length}"
    return recompile.CallFacts(call=call, advice=guard.infer_advice(plan.rows, plan.length, covered),
                               signature=(plan.rows, plan.length))


#: Modules whose forward hooks are known to a graph: Transformers' output capturing (inert unless hidden
#: states or attentions are collected; TorchDynamo traces them, as for generate()'s compiled forward).
KNOWN_HOOKS = ("transformers.utils.output_capturing",)


def _hooks(target: Any, ours: Any) -> tuple[int, int]:
    """(hooks that are neither the plugin's nor known, every forward hook): on ``target``, its submodules, globally."""
    import torch

    found = []
    for module in target.modules():
        found += list(module._forward_hooks.values()) + list(module._forward_pre_hooks.values())
    module = torch.nn.modules.module
    found += list(getattr(module, "_global_forward_hooks", {}).values())
    found += list(getattr(module, "_global_forward_pre_hooks", {}).values())
    foreign = [h for h in found if getattr(h, "__self__", None) is not ours
               and not str(getattr(h, "__module__", "")).startswith(KNOWN_HOOKS)]
    return len(foreign), len(found)


def _grad(target: Any) -> bool:
    import torch

    return torch.is_grad_enabled() and any(p.requires_grad for p in target.parameters())


def _eager_stance() -> bool:
    frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(getattr(frame, "_stance", None), "stance", None) == "force_eager"


def facts(calls: Any, target: Any, kwargs: dict, replaced: bool) -> compile_policy.CompileFacts:
    """The :class:`~.compile_policy.CompileFacts` of one padded call of ``calls``' model (``target``: the module called)."""
    import torch

    options = frozenset(k for k, v in kwargs.items() if not isinstance(v, (torch.Tensor, dict)) and v is not None)
    hooks, every = _hooks(target, calls)
    return compile_policy.CompileFacts(
        padded=True,
        enabled=calls.compile,
        eager_stance=_eager_stance(),
        compiling=torch.compiler.is_compiling(),
        wrapper=calls.wrapper_name(),
        forward_replaced=replaced,
        hooks=hooks,
        grad=_grad(target),
        options=options,
        graph_break=calls.graph_breaks.get((_options_key(kwargs), every)),
    )


def _options_key(kwargs: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in kwargs.items() if isinstance(v, (bool, int, str)) or v is None))


def _say(reason: str, name: str) -> None:
    text = f"transformers-tpu-ext: the padded forward of {name} runs op by op (not compiled): {reason}"
    if text not in _said:
        _said.add(text)
        logger.warning("%s", text)


def _require(target: Any, args: tuple, kwargs: dict) -> None:
    shapes = tuple((k, tuple(v.shape)) for k, v in sorted(kwargs.items()) if hasattr(v, "shape"))
    if args and isinstance(args[0], dict):
        shapes += tuple((k, tuple(v.shape)) for k, v in sorted(args[0].items()) if hasattr(v, "shape"))
    key = (type(target).__qualname__, shapes, _options_key(kwargs))
    with _lock:
        if key in _shapes:
            return
        _shapes.add(key)
        graphs = len(_shapes)
    recompile_limit.require("infer", graphs, floor=FLOOR)


def run(calls: Any, target: Any, original: Any, args: tuple, kwargs: dict, plan: Any) -> Any:
    """Run one padded call of ``target`` compiled where :func:`.compile_policy.compile_path` allows, else ``original``."""
    import torch

    reason = compile_policy.compile_path(facts(calls, target, kwargs, replaced=False))
    if reason is not None:
        calls.eager_reasons[reason] = calls.eager_reasons.get(reason, 0) + 1
        _say(reason, type(target).__name__)
        return original(*args, **kwargs)
    _require(target, args, kwargs)
    try:
        with torch.no_grad():
            output = _function()(target, args, kwargs)
    except Exception as error:  # noqa: BLE001 - sorted below: cache-only, a graph break, the caller's error
        if recompile.cache_only_key(error) is not None:
            raise
        every = _hooks(target, calls)[1]
        output = original(*args, **kwargs)  # the caller's own error, if the input is bad, comes from here
        why = _graph_break(error)
        # Keyed by the hooks the model holds: a forward that installs hooks at its first call (Transformers'
        # output capturing takes a lock, which breaks the graph) is compiled again once they are installed.
        if _hooks(target, calls)[1] != every:
            return output
        calls.graph_breaks[(_options_key(kwargs), every)] = why
        _say(compile_policy.compile_path(compile_policy.CompileFacts(graph_break=why)) or why, type(target).__name__)
        return output
    calls.compiled += 1
    return output


def _graph_break(error: BaseException) -> str:
    text = " ".join(str(error).split())
    first = text.split(" Explanation:")[0].split(" from user code")[0]
    return f"{type(error).__name__}: {first[:200]}"
