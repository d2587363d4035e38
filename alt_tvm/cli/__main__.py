"""``python -m alt_tvm.cli``: the ``alt-tvm`` command."""

import sys

from alt_tvm.cli import main

sys.exit(main())
