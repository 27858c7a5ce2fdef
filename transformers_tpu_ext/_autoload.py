"""The ``torch.backends`` entry point: torch calls :func:`load` at the end of ``import torch``.

An exception escaping an entry point makes ``import torch`` itself fail, so :func:`load` never
raises: any failure becomes one warning. Importing this module imports the package, whose
``__init__`` activates the plugin (with the same guarantee).
"""

from __future__ import annotations

import os
import warnings

#: Set to ``1`` (or a spec such as ``chips=4,generation=v6e``) to install the simulated TPU in
#: every Python process at ``import torch``. See ``docs/simulated-tpu.md``.
SIMULATE_ENV = "TRANSFORMERS_TPU_EXT_SIMULATE"


def load() -> None:
    # Importing this module imported the package, whose __init__ activated the plugin (or warned).
    try:
        spec = os.environ.get(SIMULATE_ENV, "").strip()
        if spec and spec != "0":
            from .testing import install_from_env

            install_from_env(spec)
    except BaseException as error:  # noqa: BLE001 - never fail the user's `import torch`
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
        warnings.warn(
            f"transformers-tpu-ext: the torch.backends entry point failed "
            f"({type(error).__name__}: {error}); import torch goes on without the plugin.",
            stacklevel=2,
        )
