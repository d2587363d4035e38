"""alt-tvm: joint data-layout and loop optimisation, and operator strategies, for Apache TVM."""

__version__ = "0.1.0"


def build(model, target=None, **options):
    """Build a model with alt-tvm's strategies; see :func:`alt_tvm.graph.build.build`."""
    from alt_tvm.graph.build import build as _build

    return _build(model, target, **options)
