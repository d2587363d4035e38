"""alt-tvm: joint data-layout and loop optimisation, and operator strategies, for Apache TVM."""

__version__ = "0.1.0"


def build(model, target=None, **options):
    """Build a model with alt-tvm's strategies; see :func:`alt_tvm.graph.build.build`."""
    from alt_tvm.graph.build import build as _build

    return _build(model, target, **options)


def pipeline(**options):
    """alt-tvm's build as a Relax pipeline for ``tvm.compile(mod, target, relax_pipeline=...)``;
    see :func:`alt_tvm.graph.build.pipeline`."""
    from alt_tvm.graph.build import pipeline as _pipeline

    return _pipeline(**options)


def tune(model, **options):
    """Tune a model's partitions into a log; see :func:`alt_tvm.integration.tune`."""
    from alt_tvm.integration import tune as _tune

    return _tune(model, **options)


def load(path, **options):
    """Load an artifact written by ``CompiledModel.export``; see :func:`alt_tvm.deploy.load.load`."""
    from alt_tvm.deploy.load import load as _load

    return _load(path, **options)
