"""Old import path of :mod:`transformers_tpu_ext.generation.config`, kept working because the docs named it."""

import sys

from .generation import config as _module

sys.modules[__name__] = _module
