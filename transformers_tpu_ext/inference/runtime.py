"""Bucketed inference calls: ``model(**batch)`` padded to a bucket on the way in, cut back on the way out.

:func:`bucketed` is the public, opt-in API for a user's own inference loop; the
``pipeline_buckets`` patch uses the same object under every pipeline's forward on TPU. While it is
active, a call of the model is planned by :func:`.policy.plan_call` from its inputs' shapes: a call
the predicate accepts has its per-token inputs padded on the right (on the host, then moved to the
model's device: padding on the device would compile a program per unpadded shape) and its rows
completed with copies of the first row; its outputs are then cut back (views, no program) to the
caller's rows and, for per-position fields, to the caller's length. Other calls run as they are.
A padded call's forward runs as one compiled program per bucket where :func:`.compile_policy.compile_path`
allows (:mod:`.compiled`), else eagerly; each padded call runs under the recompile guard (work ``"infer"``).

Importing this module imports nothing heavy; torch is imported when a call is padded.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

from .. import backend
from ..training.facts import unwrap
from . import compile_policy, compiled, policy
from .facts import model_facts

__all__ = ["Bucketed", "bucketed", "for_model"]

logger = logging.getLogger("transformers_tpu_ext")
_told: set[str] = set()


def _tell(message: str) -> None:
    if message not in _told:
        _told.add(message)
        logger.info("transformers-tpu-ext: inference calls left unpadded: %s", message)


def _kind(tensor: Any) -> str:
    import torch

    if tensor.dtype == torch.bool:
        return "bool"
    return "float" if tensor.is_floating_point() or tensor.is_complex() else "int"


class Bucketed:
    """Pads and cuts back the calls of one model (see :func:`bucketed`).

    ``compiled`` counts the padded calls that ran compiled, ``eager_reasons`` why the others ran op by op,
    ``graph_breaks`` the options whose compile failed (never retried). With ``drop_cache`` (a library caller:
    pipelines, lm-eval, which read the outputs on the host) outputs go to the host whole and are cut back
    there (a cut on the TPU would be a program per shape); otherwise they are cut back as views on the device.

    ``used`` holds the padded lengths already run (a rare short batch reuses a longer one instead of
    compiling its own, :func:`~transformers_tpu_ext.training.buckets.choose_length`, and a batch
    shorter than a length run reuses it ``patience`` times before its own compiles: ``deferred``
    counts those calls per rung put off); ``reasons``
    counts why calls were left unpadded; ``padded`` counts the calls padded.
    """

    #: The inputs padded and their padding value (``None``: the pad token id); the input a missing mask covers.
    padding: Mapping[str, Any] = policy.PADDING
    lead = "input_ids"
    mask_dtype = "long"  # of a mask added where a batch has none (a torch dtype's name)

    def __init__(self, model: Any, *, ladder: tuple[int, ...] = (), reuse: float = 1.5, patience: int = policy.PATIENCE,
                 drop_cache: bool = False, on_tpu_only: bool = True, positional_ids: bool = False,
                 compile: bool = True) -> None:
        self._model = weakref.ref(model)  # weak: the registry of for_model() must not keep models alive
        self.module = unwrap(model)
        self.facts = model_facts(model)
        self.ladder = tuple(ladder) or policy.sequence_ladder()
        self.reuse = reuse
        self.patience = patience
        self.deferred: dict[int, int] = {}
        self.drop_cache = drop_cache
        self.positional_ids = positional_ids  # model(input_ids) as lm-eval calls it: the one positional tensor is input_ids
        self.on_tpu_only = on_tpu_only
        self.used: set[int] = set()
        self.used_rows: set[int] = set()
        self.reasons: dict[str, int] = {}
        self.padded = 0
        self.compile = compile
        self.host_cut = drop_cache  # a library caller (pipelines, lm-eval) reads the outputs on the host
        self.compiled = 0
        self.shapes: dict[tuple[int, int], int] = {}  # padded (rows, length) -> calls run at it
        self.eager_reasons: dict[str, int] = {}
        self.graph_breaks: dict[Any, str] = {}
        self._replaced = False  # the model's forward was an attribute of the instance already (not compiled)
        self._local = threading.local()
        self._depth = 0
        self._handles: list[Any] = []
        self._lock = threading.Lock()

    @property
    def model(self) -> Any:
        return self._model()

    @property
    def module(self) -> Any:
        return self._module()

    @module.setter
    def module(self, value: Any) -> None:
        self._module = weakref.ref(value)

    # -- activation ------------------------------------------------------------------------------
    def __enter__(self) -> Bucketed:
        # The hooks are the model's, shared by every thread: only this thread's calls inside the block
        # are planned (another thread's generate() or forward of the same model stays its own).
        self._local.active = getattr(self._local, "active", 0) + 1
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                target = self._target()
                self._handles = [
                    target.register_forward_pre_hook(self._before, with_kwargs=True),
                    target.register_forward_hook(self._after, with_kwargs=True, always_call=True),
                ]
                self._replaced = not compiled.install(self, target)
        return self

    def _target(self) -> Any:
        return self.model if hasattr(self.model, "register_forward_pre_hook") else self.module

    def wrapper_name(self) -> str | None:
        """The class name of the wrapper the hooks are on (PEFT, DDP, torch.compile), ``None`` for the model itself."""
        target = self._target()
        return None if target is self.module else type(target).__name__

    def current_plan(self) -> policy.CallPlan | None:
        """The plan of this thread's call being run, when the block padded it."""
        if not getattr(self._local, "active", 0):
            return None
        stack = self._stack()
        return stack[-1] if stack and not isinstance(stack[-1], str) else None

    def __exit__(self, *exc: Any) -> None:
        self._local.active = max(0, getattr(self._local, "active", 0) - 1)
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                for handle in self._handles:
                    handle.remove()
                self._handles = []
                compiled.uninstall(self._target())

    @contextlib.contextmanager
    def sent(self, inputs: Any) -> Iterator[Any]:
        """``inputs`` (a host batch about to go to the model's device) with its per-token tensors padded
        and sent now, each replaced by a view of its unpadded shape: whoever moves the batch moves
        nothing more, and a call of the model with these views within the block runs on the padded
        tensors themselves (no copy, no program). Anything else is ``inputs`` unchanged."""
        import torch

        previous = getattr(self._local, "sent", None)
        self._local.sent = {}
        try:
            keys = [k for k in self.padding if isinstance(inputs, Mapping) and isinstance(inputs.get(k), torch.Tensor)]
            host = {k: inputs[k] for k in keys}
            if not keys or any(t.device.type != "cpu" for t in host.values()):
                yield inputs
                return
            plan = self._plan((), host)
            if isinstance(plan, str):
                yield inputs
                return
            padded = self._pad(host, dataclasses.replace(plan, add_mask=False))
            views = {k: padded[k][: plan.original_rows, ..., : plan.original_length] for k in keys}
            self._local.sent = {id(view): (view, padded[k]) for k, view in views.items()}
            if isinstance(inputs, dict):
                moved = type(inputs)(inputs) if type(inputs) is not dict else dict(inputs)
                moved.update(views)
            else:  # a BatchEncoding (UserDict)
                moved = copy.copy(inputs)
                for key, view in views.items():
                    moved[key] = view
            yield moved
        finally:
            self._local.sent = previous

    # -- the hooks -------------------------------------------------------------------------------
    def _stack(self) -> list[Any]:
        stack = getattr(self._local, "plans", None)
        if stack is None:
            stack = self._local.plans = []
        return stack

    def _device(self) -> Any:
        try:
            return next(self.module.parameters()).device
        except (StopIteration, AttributeError):
            return None

    def _before(self, module: Any, args: tuple, kwargs: dict) -> Any:
        if not getattr(self._local, "active", 0):
            return None  # another thread's call of the model: not inside this thread's block
        if self.positional_ids and len(args) == 1 and "input_ids" not in kwargs:
            args, kwargs = (), {"input_ids": args[0], **kwargs}
        try:
            plan = self._plan(args, kwargs)
            padded = None if isinstance(plan, str) else self._pad(kwargs, plan)
        except Exception as error:  # noqa: BLE001 - a bug of ours runs the call unpadded, never breaks it
            plan, padded = f"the plugin failed to pad ({type(error).__name__}: {error})", None
        self._stack().append(plan)
        if isinstance(plan, str):
            self.reasons[plan] = self.reasons.get(plan, 0) + 1
            _tell(plan)
            return None
        self.padded += 1
        if plan.deferred is not None:
            self.deferred[plan.deferred] = self.deferred.get(plan.deferred, 0) + 1
        self.used.add(plan.length)
        self.used_rows.add(plan.rows)
        self.shapes[(plan.rows, plan.length)] = self.shapes.get((plan.rows, plan.length), 0) + 1
        if self._replaced:
            reason = compile_policy.compile_path(compile_policy.CompileFacts(forward_replaced=True))
            self.eager_reasons[reason] = self.eager_reasons.get(reason, 0) + 1
        return args, padded

    def _plan(self, args: tuple, kwargs: dict) -> policy.CallPlan | str:
        import torch

        device = self._device()
        if self.on_tpu_only and (device is None or device.type != backend.DEVICE_TYPE or not backend.tpu_available()):
            return "the model is not on a TPU"
        shapes = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else None for k, v in kwargs.items()}
        dtypes = {k: _kind(v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        options = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
        if options.get("return_dict") is False or not getattr(getattr(self.module, "config", None), "return_dict", True):
            return "return_dict=False: tuple outputs whose fields could not be told apart"
        return self._decide(shapes, dtypes, options, len(args))

    def _decide(self, shapes: dict, dtypes: dict, options: dict, positional: int) -> policy.CallPlan | str:
        return policy.plan_call(
            shapes, self.facts, ladder=self.ladder, used=self.used, used_rows=self.used_rows, reuse=self.reuse,
            deferred=self.deferred, patience=self.patience, dtypes=dtypes,
            options=options, positional=positional, drop_cache=self.drop_cache,
        )

    def _pad(self, kwargs: dict, plan: policy.CallPlan) -> dict:
        import torch
        import torch.nn.functional as F

        device = self._device()
        sent = getattr(self._local, "sent", None) or {}
        values = dict(kwargs)
        full = {k: sent[id(values[k])][1] for k in plan.keys if id(values[k]) in sent and sent[id(values[k])][0] is values[k]}
        if len(full) == len(plan.keys) and all((t.shape[0], t.shape[-1]) == (plan.rows, plan.length) for t in full.values()):
            values.update(full)  # already padded and sent (sent()): the padded tensors themselves
            plan = dataclasses.replace(plan, keys=())
        if plan.add_mask:
            ids = kwargs[self.lead]
            values["attention_mask"] = torch.ones(tuple(ids.shape[:2]), dtype=getattr(torch, self.mask_dtype))
        for key in plan.keys + (("attention_mask",) if plan.add_mask else ()):
            tensor = values[key]
            if tensor.device.type != "cpu":
                tensor = tensor.to("cpu")  # padding on the device would compile a program per unpadded shape
            fill = self.padding[key]
            tensor = F.pad(tensor, (0, plan.length - plan.original_length), value=plan.pad_token_id if fill is None else fill)
            if plan.rows > plan.original_rows:
                tensor = torch.cat([tensor, tensor[:1].expand(plan.rows - plan.original_rows, *tensor.shape[1:])])
            values[key] = tensor.to(device)
        if plan.no_cache:
            values["use_cache"] = False
        return values

    def _after(self, module: Any, args: tuple, kwargs: dict, output: Any) -> Any:
        if not getattr(self._local, "active", 0):
            return output
        stack = self._stack()
        plan = stack.pop() if stack else None
        if plan is None or isinstance(plan, str) or not isinstance(output, Mapping):
            return output
        per_position = set(policy.cut_fields(self.facts.task))
        for key in list(output.keys()):
            value = output[key]
            if key in per_position:
                output[key] = _cut(value, plan, positions=True, host=self.host_cut)
            elif key in ("cache", "past_key_values") and plan.no_cache:
                continue
            else:
                output[key] = _cut(value, plan, positions=False, host=self.host_cut)
        return output


def _cut(value: Any, plan: policy.CallPlan, positions: bool, host: bool = False) -> Any:
    """``value`` cut back to the caller's rows (and length, for per-position fields): views, on the host
    (the whole padded tensor copied there first) when ``host``."""
    if isinstance(value, tuple):
        return tuple(_cut(v, plan, positions, host) for v in value)
    if not hasattr(value, "shape") or value.dim() == 0 or value.shape[0] != plan.rows:
        return value
    if host and value.device.type != "cpu":
        value = value.to("cpu")
    value = value[: plan.original_rows]
    if positions and value.dim() >= 2:
        value = value[:, : plan.original_length]
    return value


_by_model: weakref.WeakKeyDictionary[Any, Bucketed] = weakref.WeakKeyDictionary()


def for_model(model: Any, **options: Any) -> Bucketed:
    """The one :class:`Bucketed` of ``model`` with these options (its ``used`` lengths shared by every caller)."""
    key = unwrap(model)
    kind = options.pop("kind", Bucketed)
    found = _by_model.get(key)
    if found is None or type(found) is not kind or any(getattr(found, k) != v for k, v in options.items()):
        found = _by_model[key] = kind(model, **options)
    return found


def bucketed(model: Any, *, ladder: tuple[int, ...] = (), reuse: float = 1.5, patience: int = policy.PATIENCE,
             compile: bool = True) -> Bucketed:
    """Run ``model(**batch)`` calls at a few static shapes on TPU, with the unpadded results::

        with bucketed(model):
            for batch in batches:                    # any lengths; tensors on the CPU or the TPU
                logits = model(**batch).logits        # the batch's own rows and lengths

    Inside the block, a call :func:`~.policy.plan_call` accepts (docs/inference.md's table) is padded
    on the right to a rung of ``ladder`` (default: the training sequence ladder, 16, 32, 48, 64, 96...)
    and to a power-of-two number of rows, and its outputs are cut back; other calls run as they are
    (the reason logged once). A batch shorter than a length already run pads to it (``patience``
    times per rung, then its own rung compiles). A padded call's forward runs as one compiled program per
    bucket (``compile=False``: op by op; :mod:`.compile_policy` says which calls cannot be compiled).
    Outputs of a padded call are on the model's device. On a machine
    without a TPU (or a model not on it) every call runs as it is. Enter it once per model; the
    padded lengths used are remembered across blocks (``.used``). (``transformers_tpu_ext.inference.bucketed``
    also takes a sentence-transformers ``SentenceTransformer``: :mod:`.encoders`.)
    """
    return for_model(model, ladder=tuple(ladder) or policy.sequence_ladder(), reuse=reuse, patience=patience, compile=compile)
