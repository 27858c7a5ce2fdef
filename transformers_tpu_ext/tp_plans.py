"""Old import path of :mod:`transformers_tpu_ext.parallelism.tp_plans`, kept working because the docs named it."""

import sys

from .parallelism import tp_plans as _module

sys.modules[__name__] = _module
