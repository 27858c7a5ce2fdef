"""Activation: lazy, idempotent, thread-safe, reversible.

``activate()`` checks the settings (one warning per invalid ``TRANSFORMERS_TPU_EXT_*`` value), then
registers one post-import hook (``_post_import``) per enabled patch on its ``TARGET`` module (the hook fires at
once when the module is already imported). When it fires, the hook checks that the plugin is still
active (post-import hooks cannot be unregistered), passes the version gate, then calls the patch's
``apply``. ``deactivate()`` reverts every applied patch, in reverse order. ``status()`` tells each
patch's state: armed (waiting for its target's import), applied, skipped or disabled.

Warnings: a library outside its supported range gives one warning for all of its patches; a patch
that fails to apply (its target changed shape) gives one warning of its own, naming the installed
and the tested versions.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
import threading
from types import ModuleType
from typing import Callable

from . import config, log
from .core import _post_import
from .log import TransformersTPUExtWarning
from . import registry

__all__ = [
    "TransformersTPUExtWarning",
    "activate",
    "active_patches",
    "deactivate",
    "is_active",
    "skipped_patches",
    "status",
]

logger = logging.getLogger("transformers_tpu_ext")


_lock = threading.RLock()
_active = False
_hooked: set[str] = set()  # patches whose post-import hook is registered (for the process' life)
_applying: set[str] = set()
_applied: dict[str, ModuleType] = {}
_skipped: dict[str, str] = {}
_gated: dict[str, str] = {}  # distribution -> the reason its patches are skipped (warned once)
_noted_untested: set[str] = set()  # distributions whose "untested release" note was logged


def _patch_module(name: str) -> ModuleType:
    return importlib.import_module(registry.module_name(name))


def activate() -> None:
    """Turn the plugin on. Safe to call any number of times, from any thread."""
    global _active
    # Import the patch modules before taking the lock: an import may have to wait for another
    # thread's import, whose post-import hook may be waiting for the lock.
    targets: dict[str, str] = {}
    broken: dict[str, str] = {}
    for name in registry.REGISTRY:
        try:
            targets[name] = _patch_module(name).TARGET
        except Exception as error:  # noqa: BLE001 - one broken patch module must not stop the others
            broken[name] = f"failed to import ({type(error).__name__}: {error})"
    with _lock:
        if _active:
            return
        _active = True
        disabled = config.disabled_patches()
        new_hooks: list[str] = []
        already_imported: list[tuple[str, ModuleType]] = []
        for name in registry.REGISTRY:
            if disabled is None or name in disabled:
                _skipped[name] = f"disabled by {config.DISABLE_ENV}"
                continue
            if name in broken:
                _skipped[name] = broken[name]
                continue
            if name not in _hooked:
                _hooked.add(name)
                new_hooks.append(name)
            elif (module := sys.modules.get(targets[name])) is not None:
                # Re-activation: the hook already fired (or is still pending for a later import).
                already_imported.append((name, module))
    for name, reason in broken.items():
        if name in _skipped:
            log.warn(f"transformers-tpu-ext: patch {name!r} skipped: {reason}", stacklevel=2)
    from .settings import warn_about_problems

    warn_about_problems()
    if disabled is not None:  # TRANSFORMERS_TPU_EXT_DISABLE=1: the plugin changes nothing
        from .compilation import persistent

        persistent.setup()  # torch_tpu's persistent compile cache (never raises)
    # Outside the lock: applying a patch may import modules whose own hooks need the lock.
    for name in new_hooks:
        _post_import.register(functools.partial(_on_import, name), targets[name])
    for name, module in already_imported:
        _on_import(name, module)


class _ImportWatch:
    """Mixin swapped onto a module's ``ModuleSpec`` while the module is still being imported.

    A post-import hook can see a module before its code has finished: the hooks fire from inside
    the loader's ``exec_module``, and a newly registered hook fires at once for a module that is in
    ``sys.modules`` while it still executes (the entry point runs inside ``import torch``, which a
    Transformers module may be in the middle of; or another thread is importing it). The import
    system clears ``spec._initializing`` once the module's code has run; the callbacks queued here
    run at that moment, on the importing thread.
    """

    _tpu_ext_callbacks: list

    def __setattr__(self, key: str, value: object) -> None:
        super().__setattr__(key, value)
        if key == "_initializing" and not value:
            _run_deferred(self)


def _run_deferred(spec: object) -> None:
    with _lock:
        callbacks = spec.__dict__.pop("_tpu_ext_callbacks", [])
        if isinstance(spec, _ImportWatch):
            object.__setattr__(spec, "__class__", type(spec).__bases__[1])
    for callback in callbacks:
        callback()


def _defer_until_imported(module: ModuleType, callback: Callable[[], None]) -> bool:
    """Queue ``callback`` for the end of ``module``'s import if that import is still running."""
    spec = getattr(module, "__spec__", None)
    if spec is None or not getattr(spec, "_initializing", False):
        return False
    with _lock:
        if not isinstance(spec, _ImportWatch):
            try:
                watched = type(f"Watched{type(spec).__name__}", (_ImportWatch, type(spec)), {})
                object.__setattr__(spec, "__class__", watched)
            except TypeError:  # an unusual spec class: patch the module as it is
                return False
            object.__setattr__(spec, "_tpu_ext_callbacks", [])
        spec._tpu_ext_callbacks.append(callback)
    if not getattr(spec, "_initializing", False):  # the import finished while we were watching
        _run_deferred(spec)
    return True


def _on_import(name: str, module: ModuleType) -> None:
    """Post-import hook of one patch. Never raises: an exception here would fail the user's import."""
    try:
        if _defer_until_imported(module, functools.partial(_on_import, name, module)):
            return
        with _lock:
            if not _active or name in _applied or name in _applying:
                return
            disabled = config.disabled_patches()
            if disabled is None or name in disabled:
                return
            _applying.add(name)
        gated = False
        try:
            from .core import versions

            patch = _patch_module(name)
            reason = versions.version_gate(patch.DISTRIBUTION)
            gated = reason is not None
            if reason is None:
                _note_untested(patch.DISTRIBUTION)
                reason = _changed_target(patch, module)
            if reason is None:
                patch.apply(module)
        except Exception as error:  # noqa: BLE001 - a broken patch must not break the import
            reason = f"failed to apply ({type(error).__name__}: {error})"
            try:
                note = versions.untested(patch.DISTRIBUTION)
            except Exception:  # noqa: BLE001
                note = None
            if note:  # an untested release whose target changed shape: say which versions
                reason += f": {note}"
            try:
                patch.revert()
            except Exception:  # noqa: BLE001
                pass
        with _lock:
            _applying.discard(name)
            if reason is None and _active:
                _applied[name] = patch
                _skipped.pop(name, None)
                logger.debug("transformers-tpu-ext: applied patch %r", name)
                return
            if reason is None:  # deactivated while applying
                patch.revert()
                return
            first = _skipped.get(name) != reason
            _skipped[name] = reason
            if gated:  # one warning per distribution, for all of its patches
                first = first and _gated.get(patch.DISTRIBUTION) != reason
                _gated[patch.DISTRIBUTION] = reason
        if first and gated:
            log.warn(f"transformers-tpu-ext: {_gate_message(patch.DISTRIBUTION, reason)}", stacklevel=2)
        elif first:
            log.warn(f"transformers-tpu-ext: patch {name!r} skipped: {reason}", stacklevel=2)
    except Exception as error:  # noqa: BLE001
        logger.warning("transformers-tpu-ext: post-import hook for %r failed: %r", name, error)


def _changed_target(patch: ModuleType, module: ModuleType) -> str | None:
    """Why ``patch`` stands aside because its target no longer holds what it relies on (``RELIES_ON``),
    naming the installed and the tested releases; ``None`` when everything holds."""
    from .core import relies, versions

    changed = relies.check(module, tuple(getattr(patch, "RELIES_ON", ())))
    if changed is None:
        return None
    dist = patch.DISTRIBUTION
    tested = versions.tested_versions(dist)
    return (
        f"stands aside: {dist} {versions.installed_version(dist)} changed what it relies on ({changed}); "
        f"tested with {dist} {', '.join(tested) or '(none listed)'}"
    )


def _patches_of(distribution: str) -> list[str]:
    names = []
    for name in registry.REGISTRY:
        try:
            if _patch_module(name).DISTRIBUTION == distribution:
                names.append(name)
        except Exception:  # noqa: BLE001
            pass
    return names


def _gate_message(distribution: str, reason: str) -> str:
    from .core.versions import SUPPORTED

    names = _patches_of(distribution)
    return (
        f"{reason}. Its {len(names)} patch{'es' if len(names) != 1 else ''} ({', '.join(names)}) are skipped and "
        f"{distribution} runs unpatched; install a supported release: "
        f"pip install '{distribution}{SUPPORTED.get(distribution, '')}'"
    )


def _note_untested(distribution: str) -> None:
    """Log once per distribution (info) that its installed release is allowed but untested."""
    with _lock:
        if distribution in _noted_untested:
            return
        _noted_untested.add(distribution)
    from .core.versions import untested

    note = untested(distribution)
    if note:
        logger.info(
            "transformers-tpu-ext: %s; its patches are applied and each is checked as it is applied", note
        )


def deactivate() -> None:
    """Turn the plugin off and restore every original object exactly."""
    global _active
    with _lock:
        _active = False
        from .compilation import persistent

        persistent.restore()
        for name in reversed(list(_applied)):
            try:
                _applied[name].revert()
            except Exception as error:  # noqa: BLE001
                logger.warning("transformers-tpu-ext: reverting %r failed: %r", name, error)
        _applied.clear()
        _skipped.clear()
        _gated.clear()


def is_active() -> bool:
    return _active


def active_patches() -> list[str]:
    """Names of the patches applied right now, in registry order."""
    with _lock:
        return [name for name in registry.REGISTRY if name in _applied]


def status() -> dict[str, str]:
    """The state of every patch, in registry order.

    - ``"applied"``: its wrappers are installed now;
    - ``"armed"``: the plugin is active and the patch applies when its target module is imported
      (right after ``import torch``, before Transformers is imported, every patch is armed);
    - ``"disabled"``: turned off by ``TRANSFORMERS_TPU_EXT_DISABLE``;
    - ``"skipped"``: not applied, for the reason ``skipped_patches()`` gives (an unsupported version,
      a target that changed shape, a patch module that failed to import);
    - ``"inactive"``: the plugin is not active (``deactivate()``, or not activated yet).
    """
    with _lock:
        states = {}
        for name in registry.REGISTRY:
            reason = _skipped.get(name, "")
            if name in _applied:
                states[name] = "applied"
            elif reason.startswith("disabled"):
                states[name] = "disabled"
            elif reason:
                states[name] = "skipped"
            elif _active:
                states[name] = "armed"
            else:
                states[name] = "inactive"
        return states


def skipped_patches() -> dict[str, str]:
    """Patches that were disabled or skipped, with the reason (for ``transformers-tpu doctor``)."""
    with _lock:
        return dict(_skipped)


def _reset() -> None:
    """Forget every patch's state (for tests). Registered post-import hooks outlive this."""
    global _active
    deactivate()
    with _lock:
        _active = False
        _hooked.clear()
        _applying.clear()
        _noted_untested.clear()
