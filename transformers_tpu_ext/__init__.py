"""transformers-tpu-ext: plain Hugging Face Transformers code, correct and fast on Cloud TPUs.

Importing this package activates the plugin; so does merely having it installed (torch calls its
``torch.backends`` entry point at the end of ``import torch``). On a machine without a TPU it
changes nothing. See ``docs/architecture.md``.
"""

from __future__ import annotations

from . import log as _log

_log.setup()  # before anything logs: the plugin's logger follows Transformers' verbosity

from ._version import __version__  # noqa: E402
from .activation import (  # noqa: E402
    TransformersTPUExtWarning,
    activate,
    active_patches,
    deactivate,
    is_active,
    skipped_patches,
    status,
)

__all__ = [
    "TransformersTPUExtWarning",
    "__version__",
    "activate",
    "active_patches",
    "deactivate",
    "is_active",
    "skipped_patches",
    "status",
    "warmup",
]


def __getattr__(name: str):  # noqa: ANN202 - lazy exports keep `import transformers_tpu_ext` cheap
    if name == "warmup":  # one warmup for every work: generate (default), serve, train
        from .compilation.warmups import warmup

        return warmup
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _bootstrap() -> None:
    """Activate at import; a failure of ours is one warning, never a failed import."""
    try:
        activate()
    except Exception as error:  # noqa: BLE001
        try:
            deactivate()
        except Exception:  # noqa: BLE001
            pass
        _log.warn(
            f"transformers-tpu-ext could not activate ({type(error).__name__}: {error}); "
            "Transformers runs unpatched.",
            stacklevel=2,
        )


_bootstrap()


def _simulate_without_autoload() -> None:
    """``TRANSFORMERS_TPU_EXT_SIMULATE`` under ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``: the entry point that
    installs the simulated TPU at ``import torch`` does not run, so importing the package does it."""
    import os

    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "1":
        from . import _autoload

        _autoload.load()  # never raises: a problem is one warning


_simulate_without_autoload()
