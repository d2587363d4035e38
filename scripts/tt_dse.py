"""Same as ``alt-tvm dse``: see :mod:`alt_tvm.cli.dse`."""

import sys

from alt_tvm.cli.dse import main

if __name__ == "__main__":
    sys.exit(main())
