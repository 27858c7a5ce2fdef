"""``python -m transformers_tpu_ext.launch`` and ``from transformers_tpu_ext import launch``: the launcher.

It lives in :mod:`transformers_tpu_ext.cli.launch` with the other commands; this path keeps working
because the docs name it.
"""

import sys

from .cli import launch as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
