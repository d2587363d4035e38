"""Same as ``alt-tvm tune``: see :mod:`alt_tvm.cli.tune`."""

import sys

from alt_tvm.cli.tune import main

if __name__ == "__main__":
    sys.exit(main())
