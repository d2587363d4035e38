"""alt-tvm: joint data-layout and loop optimisation, and operator strategies, for Apache TVM."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alt_tvm.options import BuildOptions, InModelConfig, TuneOptions

__version__ = "0.1.0"
__all__ = ["BuildOptions", "InModelConfig", "TuneOptions", "build", "load", "pipeline", "tune"]
_OPTIONS = ("BuildOptions", "InModelConfig", "TuneOptions")


def __getattr__(name: str) -> Any:
    # The options classes are imported on first use: loading an artifact imports no build code.
    if name in _OPTIONS:
        from alt_tvm import options

        return getattr(options, name)
    raise AttributeError(f"module 'alt_tvm' has no attribute {name!r}")


def build(model: Any, options: BuildOptions | None = None, **keywords: Any) -> Any:
    """Build a model with alt-tvm's strategies; see :func:`alt_tvm.graph.build.build`."""
    from alt_tvm.graph.build import build as _build

    return _build(model, options, **keywords)


def pipeline(options: BuildOptions | None = None, **keywords: Any) -> Any:
    """alt-tvm's build as a Relax pipeline for ``tvm.compile(mod, target, relax_pipeline=...)``;
    see :func:`alt_tvm.graph.build.pipeline`."""
    from alt_tvm.graph.build import pipeline as _pipeline

    return _pipeline(options, **keywords)


def tune(model: Any, options: TuneOptions | None = None, **keywords: Any) -> Any:
    """Tune a model's partitions into a log; see :func:`alt_tvm.integration.tune`."""
    from alt_tvm.integration import tune as _tune

    return _tune(model, options, **keywords)


def load(path: Any, **options: Any) -> Any:
    """Load an artifact written by ``CompiledModel.export``; see :func:`alt_tvm.deploy.load.load`."""
    from alt_tvm.deploy.load import load as _load

    return _load(path, **options)
