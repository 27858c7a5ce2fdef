"""``python -m transformers_tpu_ext.cli``: the ``transformers-tpu`` command."""

import sys

from . import main

sys.exit(main())
