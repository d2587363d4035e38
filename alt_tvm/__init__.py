"""alt-tvm: joint data-layout and loop optimisation, and operator strategies, for Apache TVM."""

__version__ = "0.1.0"
