"""What the ``torch.backends`` entry point does, once the package is imported.

The entry point itself is ``_transformers_tpu_ext_autoload.load`` (a module outside this package, so
that even a failing package ``__init__`` cannot fail ``import torch``). It imports this module, which
imports the package: the package's ``__init__`` sets up logging, checks the settings and activates
the plugin (a failure there is one warning). :func:`load` then installs the simulated TPU when
``TRANSFORMERS_TPU_EXT_SIMULATE`` asks for it. Nothing here raises.
"""

from __future__ import annotations

import os

from . import log
from .testing.chips import SIMULATE_ENV, parse_spec, simulate_requested

__all__ = ["SIMULATE_ENV", "load"]


def load() -> None:
    spec = os.environ.get(SIMULATE_ENV, "")
    try:
        if not simulate_requested(spec):
            return
        try:
            kwargs = parse_spec(spec)
        except ValueError:
            return  # an invalid value: activation already said so, naming the variable and its keys
        from .testing import install

        install(**kwargs)
    except BaseException as error:  # noqa: BLE001 - never fail the user's `import torch`
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
        log.warn(
            f"transformers-tpu-ext: {SIMULATE_ENV}={spec.strip()!r}: the simulated TPU could not be installed "
            f"({type(error).__name__}: {error}); the plugin itself is active.",
            stacklevel=2,
        )
