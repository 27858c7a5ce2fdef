"""The ``torch.backends`` entry point of transformers-tpu-ext, outside the package on purpose.

torch calls :func:`load` at the end of ``import torch`` and turns any exception into a failed
``import torch``. Importing the entry point's module is part of that call, so this module lives
outside the ``transformers_tpu_ext`` package and imports only the standard library: a failure
anywhere in the package (its ``__init__`` included) happens inside :func:`load`, where it becomes one
message and ``import torch`` goes on without the plugin. See ``docs/architecture.md``.
"""

from __future__ import annotations


def load() -> None:
    """Import (= activate) transformers-tpu-ext; install the simulated TPU if asked. Never raises."""
    try:
        from transformers_tpu_ext import _autoload

        _autoload.load()
    except BaseException as error:  # noqa: BLE001 - never fail the user's `import torch`
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
        _report(error)


def _report(error: BaseException) -> None:
    message = (
        f"transformers-tpu-ext could not be loaded at import torch ({type(error).__name__}: {error}); "
        "torch and Transformers run without the plugin (`python -c 'import transformers_tpu_ext'` shows the "
        "whole error)."
    )
    try:
        import warnings

        warnings.warn(message, UserWarning, stacklevel=2)
    except BaseException:  # noqa: BLE001 - e.g. -W error: say it without raising
        try:
            import sys

            sys.stderr.write(f"UserWarning: {message}\n")
        except BaseException:  # noqa: BLE001
            pass
