"""SConv direct convolution (Ferrari et al., "Advancing Direct Convolution using Convolution
Slicing Optimization and ISA Extensions", §4-§6): the cache/tiling analysis (``csa``), the
kernel generator (``kernel``) and the opt-in ``sconv`` build strategy (``strategy``).

Importing the package registers the strategy.
"""

from . import strategy  # noqa: F401  (registration)
