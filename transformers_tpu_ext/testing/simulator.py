"""Installing the simulated TPU: PrivateUse1 renamed ``tpu``, ``torch.tpu``, hooks and counters.

Installing is once per process and cannot be undone (PyTorch renames PrivateUse1 only once);
later calls reconfigure the same simulator.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from typing import Any, Iterator

import torch

from . import autocast, compile_backend, device, pinned, process_group, random_ops, serialization, synchronize
from . import chips as chips_module
from .chips import CHIPS, parse_bytes
from .counters import Counters

__all__ = ["SimulatedTPU", "install", "install_from_env", "is_installed", "simulated_tpu"]

DEFAULTS: dict[str, Any] = dict(chips=4, generation="v6e", hbm_bytes=None, untie_on_move=False)

_LOCK = threading.RLock()
_SIM: SimulatedTPU | None = None


class SimulatedTPU:
    """The process's simulated TPU: its configuration, counters and switches."""

    def __init__(self) -> None:
        self.chips: int = DEFAULTS["chips"]
        self.generation: str = DEFAULTS["generation"]
        self.hbm_bytes: int | None = DEFAULTS["hbm_bytes"]
        self.untie_on_move: bool = DEFAULTS["untie_on_move"]
        self._hidden = 0
        self._graphs_compiled = 0
        #: kwargs of every ``torch.tpu.distributed.set_tpu_launch_env`` call in this process.
        self.launch_env_calls: list[dict[str, Any]] = []
        #: ``torch.accelerator.synchronize()`` calls on the TPU in this process (see ``synchronize.py``).
        self.synchronizations = 0

    # -- configuration -------------------------------------------------------------------------
    def configure(
        self,
        *,
        chips: int | None = None,
        generation: str | None = None,
        hbm_bytes: int | str | None = None,
        untie_on_move: bool | None = None,
    ) -> SimulatedTPU:
        """Change what the simulator reports; arguments left out keep their value.

        ``generation`` may be one torch_tpu does not know (then ``get_device_properties`` raises
        ``RuntimeError`` as on such a chip). ``hbm_bytes`` overrides the generation's HBM.
        """
        if chips is not None:
            if int(chips) < 1:
                raise ValueError(f"chips must be >= 1, got {chips}")
            self.chips = int(chips)
        if generation is not None:
            generation = str(generation).lower()
            if not generation.startswith("v"):
                raise ValueError(f"generation looks like 'v6e', got {generation!r} (known: {sorted(CHIPS)})")
            self.generation = generation
        if hbm_bytes is not None:
            self.hbm_bytes = parse_bytes(hbm_bytes)
        if untie_on_move is not None:
            self.untie_on_move = bool(untie_on_move)
        return self

    def reset_config(self) -> SimulatedTPU:
        """Back to the defaults (4 v6e chips, the generation's HBM, no untie quirk)."""
        self.chips = DEFAULTS["chips"]
        self.generation = DEFAULTS["generation"]
        self.hbm_bytes = DEFAULTS["hbm_bytes"]
        self.untie_on_move = DEFAULTS["untie_on_move"]
        self._hidden = 0
        return self

    @property
    def is_hidden(self) -> bool:
        return self._hidden > 0 or self.is_parked

    # -- parking (the pytest fixture's scope) ------------------------------------------------
    @property
    def is_parked(self) -> bool:
        """Hidden between tests by the ``simulated_tpu`` fixture (see :meth:`park`)."""
        return getattr(self, "_parked", False)

    def park(self) -> None:
        """Hide the simulator until :meth:`unpark` (or ``install()``): what the ``simulated_tpu``
        fixture does after its test, so later tests that did not ask for it see no TPU."""
        self._parked = True

    def unpark(self) -> None:
        self._parked = False

    @contextlib.contextmanager
    def hidden(self) -> Iterator[None]:
        """Within the block the process sees no TPU: ``torch.accelerator.is_available()`` is
        False, ``device_count()`` is 0 and ``current_accelerator(check_available=True)`` is
        None. (``current_accelerator()`` without the check still names ``tpu``: PyTorch fixes
        it once the backend is registered.)"""
        self._hidden += 1
        try:
            yield
        finally:
            self._hidden -= 1

    # -- counters ------------------------------------------------------------------------------
    def counters(self) -> Counters:
        state = device.STATE
        return Counters(
            graphs_compiled=self._graphs_compiled,
            eager_programs=state.eager_programs,
            h2d_bytes=state.h2d_bytes,
            d2h_bytes=state.d2h_bytes,
        )

    def reset_counters(self) -> None:
        """Zero every counter and forget the eager programs seen (the next run counts again)."""
        self._graphs_compiled = 0
        device.STATE.reset()

    def __repr__(self) -> str:
        hbm = f", hbm_bytes={self.hbm_bytes}" if self.hbm_bytes is not None else ""
        return (
            f"SimulatedTPU(chips={self.chips}, generation={self.generation!r}{hbm}, "
            f"untie_on_move={self.untie_on_move}{', hidden' if self.is_hidden else ''})"
        )


# ---------------------------------------------------------------------------------------------
# PyTorch registration.


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return _SIM is not None and not _SIM.is_hidden

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self) -> Any:
        return torch._C._autograd.DeviceType.PrivateUse1


def _refuse_if_real_backend() -> None:
    name = torch._C._get_privateuse1_backend_name()
    if name != "privateuseone":
        owner = getattr(getattr(torch, name, None), "__name__", None)
        raise RuntimeError(
            f"transformers_tpu_ext.testing: refusing to install the simulated TPU: PyTorch's "
            f"PrivateUse1 backend is already registered as {name!r}"
            + (f" (by {owner})" if owner else "")
            + ". A real TPU backend (torch_tpu) is active in this process; run the tests without "
            "the simulator, or in a process where torch_tpu finds no chip."
        )
    # check_available: a CUDA build of torch names "cuda" on a machine without a GPU.
    current = torch.accelerator.current_accelerator(check_available=True)
    if current is not None and current.type == "tpu":  # pragma: no cover - implies a rename
        raise RuntimeError("transformers_tpu_ext.testing: refusing to install: a TPU accelerator is already active")
    if current is not None:
        warnings.warn(
            f"transformers_tpu_ext.testing: the simulated TPU is installed next to a real "
            f"{current.type!r} accelerator; torch.accelerator keeps reporting {current.type!r}.",
            stacklevel=3,
        )


def _untie_in_apply(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """torch_tpu #4161, where it happens: ``Module._apply`` gives each owner of a moved parameter its own.

    ``Module._apply`` (behind ``.to()``, ``.tpu()``, ``.cpu()``, ``to_empty()``) converts each module's
    own parameters. For a backend whose tensors are another TensorImpl type
    (``torch._has_compatible_shallow_copy_type`` False), it wraps the converted tensor in a new
    ``Parameter`` per module, so a parameter two modules share becomes two. The simulated tensor
    is a wrapper subclass, for which ``_apply`` swaps tensors in place and ties survive; with the
    quirk on, each module whose own parameter crossed the tpu boundary gets a fresh copy of it.
    """
    sim = _SIM
    if sim is None or not sim.untie_on_move or not isinstance(instance, torch.nn.Module):
        return wrapped(*args, **kwargs)
    was_on_tpu = {key: p.device.type == "tpu" for key, p in instance._parameters.items() if p is not None}
    result = wrapped(*args, **kwargs)  # converts the children first, each through this wrapper
    for key, before in was_on_tpu.items():
        param = instance._parameters.get(key)
        if param is None or (param.device.type == "tpu") == before:
            continue
        fresh = torch.nn.Parameter(param.detach().clone(), param.requires_grad)
        fresh.grad = param.grad
        instance._parameters[key] = fresh
    return result


def _register_torch() -> None:
    import wrapt
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from . import tpu_module

    _refuse_if_real_backend()
    if getattr(torch, "tpu", None) is not None:
        # torch_tpu installed where it found no chip registers torch.tpu without renaming
        # PrivateUse1 (and without a device): the simulator takes the name over.
        delattr(torch, "tpu")
        sys.modules.pop("torch.tpu", None)
        sys.modules.pop("torch.tpu.distributed", None)
    _setup_privateuseone_for_python_backend(
        rename="tpu", backend_module=tpu_module, hook=_Hooks(), device_guard=_DeviceGuard()
    )
    sys.modules["torch.tpu.distributed"] = tpu_module.distributed
    device.register(torch.device("tpu", 0))
    process_group.register()
    compile_backend.register()
    pinned.register()
    serialization.register()
    autocast.register()
    random_ops.register()
    synchronize.register()
    wrapt.wrap_function_wrapper(torch.nn.Module, "_apply", _untie_in_apply)


def install(
    chips: int = DEFAULTS["chips"],
    generation: str = DEFAULTS["generation"],
    hbm_bytes: int | str | None = DEFAULTS["hbm_bytes"],
    untie_on_move: bool = DEFAULTS["untie_on_move"],
) -> SimulatedTPU:
    """Install the simulated TPU in this process (once), or reconfigure it; returns it.

    Raises ``RuntimeError`` when a real TPU backend already owns PyTorch's PrivateUse1 device.
    """
    global _SIM
    _check_host(chips, generation)
    with _LOCK:
        if _SIM is None:
            sim = SimulatedTPU()
            sim.configure(chips=chips, generation=generation, hbm_bytes=hbm_bytes, untie_on_move=untie_on_move)
            _register_torch()
            _SIM = sim
        else:
            _SIM.unpark()  # asked for again: visible again (see SimulatedTPU.park)
            _SIM.hbm_bytes = None
            _SIM.configure(chips=chips, generation=generation, hbm_bytes=hbm_bytes, untie_on_move=untie_on_move)
        return _SIM


def _check_host(chips: int, generation: str) -> None:
    """Refuse a host torch_tpu could not launch on (a v6e host with 3 chips) when it is installed."""
    problem = chips_module.check_host(int(chips), str(generation))
    if problem:
        raise ValueError(f"transformers_tpu_ext.testing.install(chips={chips}, generation={generation!r}): {problem}")


def is_installed() -> bool:
    return _SIM is not None


def simulated_tpu() -> SimulatedTPU | None:
    return _SIM


def parse_spec(spec: str) -> dict[str, Any]:
    """``"1"`` → {}; ``"chips=4,generation=v6e,hbm=1GiB,untie_on_move=1"`` → install kwargs (see ``chips.parse_spec``)."""
    return chips_module.parse_spec(spec)


def install_from_env(spec: str) -> SimulatedTPU:
    """Install from a ``TRANSFORMERS_TPU_EXT_SIMULATE`` value (``"1"`` or ``"chips=4,..."``)."""
    return install(**parse_spec(spec))
