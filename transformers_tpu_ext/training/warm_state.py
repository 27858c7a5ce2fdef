"""What a warm-up step changes, put back: parameters, buffers, optimizer, schedule, random streams, and the
trainer's own bookkeeping (runtime).

:class:`Snapshot` copies what one training step changes to the host and :meth:`Snapshot.restore` puts it
back in place. Besides the tensors, a trainer keeps Python state a step moves: TRL's logged metrics
(``_metrics``, ``_stored_metrics``), token counts (``_total_train_tokens``, ``state.num_input_tokens_seen``),
GRPO's generation step (``_step``) and buffered batches: every attribute of the trainer and of its
``state`` is put back as it was (plain values and containers of them by content, in place; anything else
by reference), the plugin's own (``_tpu_ext_*``: the buckets warmed up) excepted.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = ["Snapshot"]

#: The plugin's own attributes on a trainer (buckets used, plans): kept, what the warm-up did is their point.
_OURS = "_tpu_ext_"
_PLAIN = (int, float, str, bool, type(None), bytes)


class Snapshot:
    """What one training step changes (parameters, buffers, optimizer, schedule, random streams),
    copied to the host so that :meth:`restore` puts it back in place."""

    def __init__(self, model: Any, optimizer: Any, scheduler: Any, trainer: Any = None) -> None:
        import random

        import torch

        from .. import backend

        self.optimizer = getattr(optimizer, "optimizer", optimizer)
        self.scheduler = scheduler
        self.tensors = [(t, _host_copy(t)) for t in [*model.parameters(), *model.buffers()]]
        self.state = {p: {k: (v, _host_copy(v)) for k, v in s.items()} for p, s in self.optimizer.state.items()}
        self.groups = [
            {k: ((v, _host_copy(v)) if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in g.items() if k != "params"}
            for g in self.optimizer.param_groups
        ]
        self.schedule = copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None
        self.rng = (random.getstate(), torch.random.get_rng_state(), backend.rng_state())
        self.owners = [_Attributes(o) for o in (trainer, getattr(trainer, "state", None)) if o is not None]

    def restore(self) -> None:
        import random

        import torch

        from .. import backend

        with torch.no_grad():
            for tensor, saved in self.tensors:
                _local(tensor).copy_(saved)
            for param in list(self.optimizer.state):
                if param not in self.state:
                    if _zero_is_fresh(self.optimizer, self.optimizer.state[param]):
                        # A zeroed state is a fresh one, and keeping its tensors keeps a compiled
                        # step's guards (an emptied state would be traced again).
                        for value in self.optimizer.state[param].values():
                            _local(value).zero_()
                    else:
                        del self.optimizer.state[param]
            for param, entries in self.state.items():
                state = self.optimizer.state[param]
                for key in list(state):
                    if key not in entries:
                        del state[key]
                for key, (original, saved) in entries.items():
                    if isinstance(original, torch.Tensor):
                        _local(original).copy_(saved)
                    state[key] = original
            for group, saved in zip(self.optimizer.param_groups, self.groups):
                for key, value in saved.items():
                    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], torch.Tensor):
                        _local(value[0]).copy_(value[1])
                        group[key] = value[0]
                    else:
                        group[key] = value
        if self.schedule is not None:
            self.scheduler.load_state_dict(self.schedule)
        python, cpu, tpu = self.rng
        random.setstate(python)
        torch.random.set_rng_state(cpu)
        backend.set_rng_state(tpu)
        for owner in self.owners:
            owner.restore()


class _Attributes:
    """An object's attributes as they were: plain values and containers of them copied (restored in place,
    so that whoever holds the container sees it put back), anything else by reference; attributes added
    since are removed. The plugin's own are left as they are."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.refs = {k: v for k, v in vars(owner).items() if not k.startswith(_OURS)}
        self.copies = {k: copy.deepcopy(v) for k, v in self.refs.items() if _plain(v) and not isinstance(v, _PLAIN)}

    def restore(self) -> None:
        values = vars(self.owner)
        for key in [k for k in values if k not in self.refs and not k.startswith(_OURS)]:
            del values[key]
        for key, value in self.refs.items():
            if key in self.copies:
                _refill(value, self.copies[key])
            values[key] = value


def _plain(value: Any, depth: int = 0) -> bool:
    """Plain data: numbers, strings and containers of them (what metrics and counters are)."""
    if isinstance(value, _PLAIN):
        return True
    if depth > 4:
        return False
    if isinstance(value, Mapping):
        return all(isinstance(k, _PLAIN) and _plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple, deque, set)):
        return all(_plain(v, depth + 1) for v in value)
    return False


def _refill(target: Any, saved: Any) -> None:
    """``target`` (a container) given ``saved``'s content in place."""
    if isinstance(target, dict):
        target.clear()
        target.update(saved)
    elif isinstance(target, (list, deque, set)):
        target.clear()
        (target.extend if not isinstance(target, set) else target.update)(saved)


#: Optimizers whose state, all zeros (step count included), is exactly a fresh one.
_ZERO_INITIALISED = ("Adam", "AdamW")


def _zero_is_fresh(optimizer: Any, state: Mapping[str, Any]) -> bool:
    import torch

    return type(optimizer).__name__ in _ZERO_INITIALISED and all(isinstance(v, torch.Tensor) for v in state.values())


def _local(tensor: Any) -> Any:
    to_local = getattr(tensor, "to_local", None)  # a DTensor (FSDP2): its shard
    return (to_local() if to_local is not None else tensor).detach()


def _host_copy(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return _local(value).to("cpu", copy=True)
    return value
