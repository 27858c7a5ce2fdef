"""Old import path of :mod:`transformers_tpu_ext.generation.policy`, kept working because the docs named it."""

import sys

from .generation import policy as _module

sys.modules[__name__] = _module
