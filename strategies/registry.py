"""The operator-strategy registry: which implementation builds which Relax operator.

A strategy registers for Relax operator names and target kinds with a priority and an
applicability check. :func:`select` returns, per operator call, the applicable strategy
of highest priority among those the user allows; if none applies, the call keeps TVM's
own legalization and the build reports it as a fallback.

The built-in strategy families are the sub-packages of ``alt_tvm.strategies``; each
registers its strategies, with the fusion patterns they declare (:func:`fusion_patterns`),
when imported, and :func:`registered_strategies` imports them all the first time it is
asked (so no list of built-ins is kept anywhere).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .base import OpInfo, Strategy
from .pattern import FusionPattern, declared_patterns

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


_FAMILIES_LOADED = False


def load_families() -> None:
    """Import every strategy family (each sub-package of ``alt_tvm.strategies``) once."""
    global _FAMILIES_LOADED
    if _FAMILIES_LOADED:
        return
    _FAMILIES_LOADED = True  # before importing: a family may query the registry while it loads
    try:
        package = importlib.import_module(__package__)
        for module in pkgutil.iter_modules(package.__path__):
            if module.ispkg:
                importlib.import_module(f"{__package__}.{module.name}")
    except BaseException:
        _FAMILIES_LOADED = False
        raise


def registered_strategies() -> tuple[Strategy, ...]:
    """Every registered strategy (the built-in families are loaded on the first call)."""
    load_families()
    return tuple(_REGISTRY)


def strategy_ops() -> frozenset[str]:
    """The Relax operators some registered strategy implements (the possible partition anchors)."""
    return frozenset(op for s in registered_strategies() for op in s.ops)


def fusion_patterns() -> tuple[FusionPattern, ...]:
    """The fusion patterns the registered strategies declare (:attr:`Strategy.patterns`), each
    name once, in registration order."""
    return declared_patterns(registered_strategies())


def strategy_names() -> tuple[str, ...]:
    """The names users may pass in ``strategies=[...]``."""
    return tuple(sorted({s.name for s in registered_strategies()}))


def check_names(names: Iterable[str] | None) -> tuple[str, ...] | None:
    """Validate user-given strategy names against the registry.

    Raises
    ------
    TypeError
        If ``names`` is a single string (``"sconv"`` would read as ``s, c, o, n, v``) or
        not an iterable of strings.
    ValueError
        If a name is not registered.
    """
    if names is None:
        return None
    if isinstance(names, str):
        raise TypeError(f"strategies must be a list of strategy names, e.g. [{names!r}], not the string {names!r}")
    try:
        names = tuple(names)
    except TypeError:
        raise TypeError(f"strategies must be a list of strategy names, got {type(names).__name__}") from None
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"strategies must be strategy names (str), got {bad!r}")
    known = strategy_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; registered: {list(known)}")
    return names


def check_strategy_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate user-given ``strategy_options`` (strategy name -> that strategy's options).

    Raises
    ------
    TypeError
        If ``options`` is not a mapping.
    ValueError
        If it names a strategy that is not registered.
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"strategy_options must be a dict of strategy name -> options, got {type(options).__name__}")
    unknown = sorted(str(name) for name in set(options) - set(strategy_names()))
    if unknown:
        raise ValueError(f"strategy_options for unknown strategies {unknown}; registered: {list(strategy_names())}")
    return dict(options)


def select(info: OpInfo, *, allowed: Sequence[str] | None = None) -> tuple[Strategy | None, list[str]]:
    """The best applicable strategy for ``info`` and the reasons the others were skipped."""
    reasons: list[str] = []
    candidates = [s for s in registered_strategies() if info.op in s.ops and info.target_kind in s.target_kinds]
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
