"""Setting up torch_tpu's persistent compile cache at activation, and reporting on it.

:func:`setup` runs when the plugin activates, that is inside ``import torch`` (the entry point) or at
``import transformers_tpu_ext``. It gathers the facts :func:`cache.plan` needs without asking torch_tpu
anything that could start the chip (the torch_tpu distribution's version; a TPU on the PCI bus; whether
the backend, if it is already loaded and initialised, has looked up programs), then sets
``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT`` or leaves it, and says where once, at info level.

Timing: torch_tpu reads the variable once, at the process's first compilation, not when it is
imported; so the order in which ``torch.backends`` entry points load does not matter, and the plugin
is only too late when a TPU operation ran before it was activated (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
and an explicit import after using the TPU): then it sets nothing and says why.

:func:`report` is what ``transformers-tpu doctor`` and :func:`transformers_tpu_ext.compilation.cache_report`
show: the root, who set it, its entries and size, entries of other torch_tpu releases, and this
process's hits and misses.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
import threading
import warnings
from collections.abc import MutableMapping
from importlib import metadata
from typing import Any

from . import cache

__all__ = ["report", "restore", "setup", "tpu_on_host", "writable"]

logger = logging.getLogger("transformers_tpu_ext")

#: Google's PCI vendor id, and the class of processing accelerators (a TPU; Google's network cards are class 0x02).
_GOOGLE_VENDOR = "0x1ae0"
_ACCELERATOR_CLASS = "0x12"

_lock = threading.Lock()
_set_value: str | None = None  # what this process set, while it is set
_ever_set: str | None = None  # the last value this process set (torch_tpu may be using it)
_plan: cache.CachePlan | None = None
_announced: set[str] = set()


# ---------------------------------------------------------------------------------------------
# Facts


def torch_tpu_version() -> str | None:
    for name in ("torch_tpu", "torch-tpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        except Exception:  # noqa: BLE001 - a broken installation: as if absent
            return None
    return None


def tpu_on_host(sysfs: str = "/sys/bus/pci/devices") -> bool:
    """Whether a TPU chip sits on this host's PCI bus (a Google processing accelerator), read from sysfs."""
    for device in glob.glob(os.path.join(sysfs, "*")):
        try:
            with open(os.path.join(device, "vendor"), encoding="ascii") as file:
                if file.read().strip().lower() != _GOOGLE_VENDOR:
                    continue
            with open(os.path.join(device, "class"), encoding="ascii") as file:
                if file.read().strip().lower().startswith(_ACCELERATOR_CLASS):
                    return True
        except OSError:
            continue
    return False


def compiled_already() -> bool:
    """Whether the TPU backend, already loaded and initialised in this process, looked up programs."""
    torch = sys.modules.get("torch")
    tpu = getattr(torch, "tpu", None) if torch is not None else None
    if tpu is None:
        return False
    try:
        with warnings.catch_warnings():  # torch_tpu 0.2.0 marks is_initialized() experimental, with a warning
            warnings.simplefilter("ignore")
            initialised = getattr(tpu, "is_initialized", None)
            if callable(initialised) and not initialised():
                return False
            requests = getattr(tpu, "_get_cache_requests", None)
            return bool(callable(requests) and int(requests()) > 0)
    except Exception:  # noqa: BLE001 - never start or break the backend from here
        return False


def writable(path: str) -> bool:
    """Whether ``path`` is a writable directory, or could be created (its nearest existing ancestor is one)."""
    path = os.path.abspath(path)
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return False
        probe = parent
    return os.path.isdir(probe) and os.access(probe, os.W_OK | os.X_OK)


def facts(environ: MutableMapping[str, str] | None = None) -> cache.Facts:
    environ = os.environ if environ is None else environ
    setting = cache.parse_setting(environ.get(cache.CACHE_ENV))
    on_host = tpu_on_host()
    # The installed release names the default directory; only looked up when it can matter.
    version = torch_tpu_version() if (on_host or setting == "on") else None
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    return cache.Facts(
        torch_tpu_version=version,
        tpu_on_host=on_host,
        compiled_already=compiled_already(),
        home=os.path.expanduser("~"),
        cwd=cwd,
    )


# ---------------------------------------------------------------------------------------------
# Setting up


def setup(environ: MutableMapping[str, str] | None = None) -> cache.CachePlan | None:
    """Set torch_tpu's cache root when the plan says so (at activation). Never raises."""
    global _set_value, _ever_set, _plan
    environ = os.environ if environ is None else environ
    try:
        with _lock:
            process = environ is os.environ
            if process and _ever_set is not None and not environ.get(cache.ROOT_ENV) and compiled_already():
                # Re-activated after deactivate(): torch_tpu kept the root this process gave it.
                environ[cache.ROOT_ENV] = _set_value = _ever_set
                return _plan
            plan = cache.plan(environ, facts(environ), writable)
            if plan.action == "set" and plan.root is not None:
                environ[cache.ROOT_ENV] = _set_value = plan.root
                if process:
                    _ever_set = plan.root
            _plan = plan
        _announce(plan)
        return plan
    except Exception as error:  # noqa: BLE001 - activation must go on
        logger.debug("transformers-tpu-ext: setting up the compile cache failed: %r", error)
        return None


def _announce(plan: cache.CachePlan) -> None:
    key = f"{plan.action}:{plan.explicit}:{plan.root}:{plan.reason}"
    if key in _announced:
        return
    _announced.add(key)
    if plan.action == "set":
        logger.info("transformers-tpu-ext: %s (%s=off turns this off)", plan.reason, cache.CACHE_ENV)
    elif plan.action == "off" and plan.explicit:
        from .. import log

        log.warn(f"transformers-tpu-ext: the persistent compile cache is off: {plan.reason}", stacklevel=3)
    elif plan.case == "late":
        logger.info("transformers-tpu-ext: the persistent compile cache is off: %s", plan.reason)
    else:
        logger.debug("transformers-tpu-ext: compile cache: %s", plan.reason)


def restore(environ: MutableMapping[str, str] | None = None) -> None:
    """Remove the variable this process set (``deactivate()``), if nobody changed it since."""
    global _set_value
    environ = os.environ if environ is None else environ
    with _lock:
        if _set_value is not None and environ.get(cache.ROOT_ENV) == _set_value:
            del environ[cache.ROOT_ENV]
        _set_value = None


def current_plan() -> cache.CachePlan | None:
    """The plan of the last :func:`setup` (None before activation)."""
    return _plan


# ---------------------------------------------------------------------------------------------
# Reporting


def _scan(directory: str) -> dict[str, int]:
    entries = size = 0
    for folder, _, files in os.walk(directory):
        for name in files:
            if name.endswith(".bin"):
                entries += 1
                try:
                    size += os.path.getsize(os.path.join(folder, name))
                except OSError:
                    pass
    return {"entries": entries, "bytes": size}


def process_stats() -> dict[str, int] | None:
    """This process's compile-cache requests, hits and misses, from the TPU backend (None if it has none)."""
    torch = sys.modules.get("torch")
    tpu = getattr(torch, "tpu", None) if torch is not None else None
    if tpu is None:
        return None
    try:
        functions = {name: getattr(tpu, f"_get_cache_{name}", None) for name in ("requests", "hits", "misses")}
        if not all(callable(f) for f in functions.values()):
            return None
        return {name: int(f()) for name, f in functions.items()}
    except Exception:  # noqa: BLE001
        return None


def report(environ: MutableMapping[str, str] | None = None) -> dict[str, Any]:
    """The compile cache of this process as a JSON-able dict (see ``docs/compile-cache.md``)."""
    environ = os.environ if environ is None else environ
    root = environ.get(cache.ROOT_ENV) or environ.get(cache.TORCH_TPU_CACHE_VARIABLES[1]) or None
    plan = _plan if _plan is not None else cache.plan(environ, facts(environ), writable)
    result: dict[str, Any] = {
        "root": root,
        "set_by": None if root is None else ("transformers-tpu-ext" if root == _set_value else "environment"),
        "setting": environ.get(cache.CACHE_ENV) or "auto",
        "reason": plan.reason,
        "process": process_stats(),
    }
    if root is not None and "://" not in root:
        result["writable"] = writable(root)
        result.update(_scan(root) if os.path.isdir(root) else {"entries": 0, "bytes": 0})
        parent = os.path.dirname(os.path.normpath(root))
        if os.path.basename(os.path.normpath(root)).startswith(("torch_tpu-", "other-backend")) and os.path.isdir(parent):
            others = {}
            for name in sorted(os.listdir(parent)):
                path = os.path.join(parent, name)
                if path != os.path.normpath(root) and os.path.isdir(path):
                    others[name] = {"path": path, **_scan(path)}
            result["other_releases"] = others
    return result
