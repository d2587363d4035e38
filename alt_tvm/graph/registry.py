"""The operator-strategy registry: which implementation builds which Relax operator.

A strategy registers for Relax operator names and target kinds with a priority and an
applicability check. At build time :func:`select` returns, per operator call, the
applicable strategy of highest priority among those the user allows; if none applies,
the call keeps TVM's own legalization and the build reports it as a fallback.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class OpInfo:
    """What a strategy sees of one Relax operator call.

    Attributes
    ----------
    op
        Relax operator name, e.g. ``"relax.nn.conv2d"``.
    attrs
        The call's attributes as plain Python values.
    input_shapes, input_dtypes
        Static shapes and dtypes of the call's tensor arguments.
    constants
        The constant arguments' data by argument position (weights), else absent.
    output_shape, output_dtype
        The call's result.
    target_kind
        ``"llvm"``, ``"cuda"``, ...
    target_name, options
        The hardware description's name, and the per-strategy options of the build.
    """

    op: str
    attrs: dict[str, Any]
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_shape: tuple[int, ...]
    output_dtype: str
    target_kind: str
    constants: dict[int, np.ndarray] = field(default_factory=dict, compare=False, hash=False)
    #: ``alt_tvm.target.HardwareTarget.name`` ("host", "kirin990", "vta", ...)
    target_name: str = "host"
    #: per-strategy options given to the build (``strategy_options={name: ...}``)
    options: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


class Strategy(abc.ABC):
    """One way of implementing some Relax operators (subclasses are registered singletons)."""

    #: Name users pass in ``strategies=[...]``.
    name: str = ""
    #: Relax operator names this strategy can implement.
    ops: tuple[str, ...] = ()
    #: Target kinds (``tvm.target.Target.kind.name``) it generates code for.
    target_kinds: tuple[str, ...] = ("llvm",)
    #: Higher wins when several strategies apply.
    priority: int = 0
    #: Opt-in strategies are only considered when the build names them in ``strategies``
    #: or gives them ``strategy_options`` (they stay silent in fallback reports otherwise).
    opt_in: bool = False
    #: The strategy lowers a zero-padding producer of its anchor as part of the partition
    #: (``context.partition.prologue``); others get the pad computed separately.
    absorbs_pad: bool = False

    @abc.abstractmethod
    def applicable(self, info: OpInfo) -> str | None:
        """``None`` if this strategy can implement ``info``, else the reason it cannot."""

    @abc.abstractmethod
    def implement(self, anchor: Any, context: Any) -> Any:
        """Build the implementation of a partition anchored at ``anchor`` (see alt_tvm.graph.build).

        ``context.params`` holds tuned parameters for the partition's workload, or None.
        """

    def space(self, anchor: Any, context: Any) -> Any:
        """The tuning space (``alt_tvm.tuning.space.Space``) of a partition, or None if not tunable."""
        return None


_REGISTRY: list[Strategy] = []


def register_strategy(strategy: Strategy) -> Strategy:
    """Add ``strategy`` to the registry; registering the same class again replaces it.

    A name may cover several strategies (the ``alt`` family has one per operator kind).
    """
    if not strategy.name or not strategy.ops:
        raise ValueError(f"a strategy needs a name and ops, got name={strategy.name!r}, ops={strategy.ops!r}")
    for i, existing in enumerate(_REGISTRY):
        if type(existing) is type(strategy):
            _REGISTRY[i] = strategy
            return strategy
    _REGISTRY.append(strategy)
    return strategy


def registered_strategies() -> tuple[Strategy, ...]:
    return tuple(_REGISTRY)


def strategy_names() -> tuple[str, ...]:
    return tuple(sorted({s.name for s in _REGISTRY}))


def check_names(names: Iterable[str] | None) -> tuple[str, ...] | None:
    """Validate user-given strategy names against the registry."""
    if names is None:
        return None
    names = tuple(names)
    known = strategy_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; registered: {list(known)}")
    return names


def select(info: OpInfo, *, allowed: Sequence[str] | None = None) -> tuple[Strategy | None, list[str]]:
    """The best applicable strategy for ``info`` and the reasons the others were skipped."""
    reasons: list[str] = []
    candidates = [s for s in _REGISTRY if info.op in s.ops and info.target_kind in s.target_kinds]
    if allowed is not None:
        candidates = [s for s in candidates if s.name in allowed]
    else:
        candidates = [s for s in candidates if not s.opt_in or s.name in info.options]
    for strategy in sorted(candidates, key=lambda s: -s.priority):
        why_not = strategy.applicable(info)
        if why_not is None:
            return strategy, reasons
        reasons.append(f"{strategy.name}: {why_not}")
    return None, reasons
