"""Installing the simulated TPU: PrivateUse1 renamed ``tpu``, ``torch.tpu``, hooks and counters.

Installing is once per process and cannot be undone (PyTorch renames PrivateUse1 only once);
later calls reconfigure the same simulator.
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any

import torch

from . import (
    autocast,
    compile_backend,
    factories,
    foreach,
    generators,
    grouped_ops,
    pinned,
    process_group,
    quantized_ops,
    random_ops,
    serialization,
    synchronize,
)
from . import chips as chips_module
from . import report
from .instance import DEFAULTS, SimulatedTPU, is_installed, set_current, simulated_tpu

__all__ = ["SimulatedTPU", "install", "install_from_env", "is_installed", "simulated_tpu"]

_LOCK = threading.RLock()


# ---------------------------------------------------------------------------------------------
# PyTorch registration.


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        sim = simulated_tpu()
        return sim is not None and not sim.is_hidden

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
    sim = simulated_tpu()
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
    factories.register(torch.device("tpu", 0))
    generators.register(torch.device("tpu", 0))
    process_group.register()
    compile_backend.register()
    pinned.register()
    serialization.register()
    autocast.register()
    random_ops.register()
    quantized_ops.register()
    grouped_ops.register()
    synchronize.register()
    foreach.register()
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
    _check_host(chips, generation)
    with _LOCK:
        sim = simulated_tpu()
        if sim is None:
            sim = SimulatedTPU()
            sim.configure(chips=chips, generation=generation, hbm_bytes=hbm_bytes, untie_on_move=untie_on_move)
            _register_torch()
            set_current(sim)
            report.enable(_report_counters)  # TRANSFORMERS_TPU_EXT_SIMULATE_REPORT: for other processes to read
        else:
            sim.unpark()  # asked for again: visible again (see SimulatedTPU.park)
            sim.hbm_bytes = None
            sim.configure(chips=chips, generation=generation, hbm_bytes=hbm_bytes, untie_on_move=untie_on_move)
        return sim


def _check_host(chips: int, generation: str) -> None:
    """Refuse a host torch_tpu could not launch on (a v6e host with 3 chips) when it is installed."""
    problem = chips_module.check_host(int(chips), str(generation))
    if problem:
        raise ValueError(f"transformers_tpu_ext.testing.install(chips={chips}, generation={generation!r}): {problem}")


def parse_spec(spec: str) -> dict[str, Any]:
    """``"1"`` → {}; ``"chips=4,generation=v6e,hbm=1GiB,untie_on_move=1"`` → install kwargs (see ``chips.parse_spec``)."""
    return chips_module.parse_spec(spec)


def install_from_env(spec: str) -> SimulatedTPU:
    """Install from a ``TRANSFORMERS_TPU_EXT_SIMULATE`` value (``"1"`` or ``"chips=4,..."``)."""
    return install(**parse_spec(spec))


def _report_counters() -> dict[str, object]:
    """The installed simulator's counters as the report writes them (``{}`` when none is installed)."""
    sim = simulated_tpu()
    if sim is None:
        return {}
    counters = sim.counters().asdict()
    counters["programs"] = counters["graphs_compiled"] + counters["eager_programs"]
    return counters
