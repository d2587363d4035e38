"""Group a Relax dataflow graph into "complex operator + element-wise epilogue" partitions.

A partition starts at an *anchor* (a call a strategy implements: conv, matmul) and
extends along its single-consumer chain of element-wise ops of the same output shape
(bias add, activation, residual add, batch-norm arithmetic ...). The whole partition
becomes one kernel, and the anchor's output layout is shared by every epilogue tensor —
the paper's layout propagation along element-wise paths (§4.2), which is what lets the
epilogue fuse into the anchor's loop nest. Beyond the epilogue a partition grows only by
the fusion patterns its strategy declares (:mod:`alt_tvm.strategies.pattern`), matched here
without knowing what they fuse.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tvm import relax

from alt_tvm.strategies.base import (
    OpInfo,
    Partition,
    Strategy,
    attrs_dict,
    const_value,
    dtype_of,
    op_name,
    static_shape,
    workload_key,
)
from alt_tvm.strategies.epilogue import UNARY_EPILOGUE, joinable
from alt_tvm.strategies.pattern import FusionPattern, Match, MatchContext
from alt_tvm.strategies.registry import fusion_patterns, select, strategy_ops
from alt_tvm.target import HardwareTarget


def consumers(func: relax.Function) -> dict:
    """For every variable, the variables bound from it (or ``"output"`` for the function result)."""
    users: dict = {}
    body = func.body
    for block in body.blocks:
        for binding in block.bindings:
            for var in relax.analysis.free_vars(binding.value):
                users.setdefault(var, []).append(binding.var)
    for var in relax.analysis.free_vars(body.body):
        users.setdefault(var, []).append("output")
    return users


def _joins(binding: relax.VarBinding, region: set, shape: tuple[int, ...]) -> bool:
    """Can ``binding`` join an epilogue region (element-wise, same shape, reads the region)?"""
    name = op_name(binding.value)
    if not joinable(binding.value):
        return False
    if static_shape(binding.var) != shape:
        return False
    args = list(binding.value.args)
    if name in UNARY_EPILOGUE:
        return args[0] in region
    # One operand comes from the region; the other may be a constant or any tensor
    # broadcasting to the output (bias, batch-norm scale, residual, or the region itself).
    return any(a in region for a in args) and all(static_shape(a) is not None for a in args)


class _Blocked:
    """The variables in a partition or claimed as another anchor's prologue."""

    def __init__(self, taken: set, claimed: Mapping) -> None:
        self.taken, self.claimed = taken, claimed

    def __contains__(self, var: Any) -> bool:
        return var in self.taken or var in self.claimed


def find_partitions(func: relax.Function, *, is_anchor: Callable[[relax.VarBinding], bool],
                    epilogues: bool = True, strategy_of: Callable[[relax.VarBinding], Strategy] | None = None,
                    target: HardwareTarget | None = None,
                    strategy_options: Mapping[str, Any] | None = None,
                    declined: Mapping[Any, str] | None = None) -> list[Partition]:
    """Partitions of ``func``'s dataflow blocks, anchored where ``is_anchor`` says.

    The epilogue is the largest run of element-wise ops after the anchor that reads the
    anchor's value (a chain, or a small DAG such as GELU's ``x * (1 + erf(x))``) and whose
    intermediate values are used nowhere else: only the last value leaves the kernel.
    With ``epilogues=False`` every partition is its anchor alone (the ALT-WP ablation), but
    for the patterns that absorb a producer (:attr:`~alt_tvm.strategies.pattern.FusionPattern.absorbs`).

    The partition then grows by the first fusion pattern of its strategy
    (``strategy_of(anchor).patterns``) that matches and whose check passes on ``target`` with
    the strategy's ``strategy_options``. A pattern whose prologue is itself an anchor
    (:attr:`~alt_tvm.strategies.pattern.FusionPattern.claims_anchor`) is matched over the
    whole block first, so that its prologue does not start a partition of its own.
    ``declined`` maps anchor vars to the name of a pattern they do not grow by (a tuning
    decision built that fused workload unfused).
    """
    users = consumers(func)
    options = dict(strategy_options or {})
    declined = dict(declined or {})
    partitions: list[Partition] = []
    taken: set = set()

    def patterns(binding: relax.VarBinding) -> list[FusionPattern]:
        if strategy_of is None:
            return []
        return [p for p in strategy_of(binding).patterns
                if (epilogues or p.absorbs) and op_name(binding.value) in p.anchor]

    def fuses(pattern: FusionPattern, binding: relax.VarBinding, match: Match) -> bool:
        if declined.get(binding.var) == pattern.name:
            return False
        strategy = strategy_of(binding)
        return pattern.accepts(strategy, binding, match, target, options.get(strategy.name))

    def epilogue_of(binding: relax.VarBinding, later: Sequence[relax.Binding]) -> list[relax.VarBinding]:
        return _epilogue(binding, later, users, taken, is_anchor)

    ahead = [p for p in fusion_patterns() if p.claims_anchor] if strategy_of else []
    for block in func.body.blocks:
        bindings = list(block.bindings)
        producers = {b.var: b for b in bindings if isinstance(b, relax.VarBinding)}
        claimed: dict = {}  # a claimed prologue's var -> the anchor var that claims it

        context = partial(MatchContext, bindings=bindings, users=users, producers=producers,
                          taken=_Blocked(taken, claimed), is_anchor=is_anchor, epilogue=epilogue_of)

        found: dict = {}  # anchor var -> (pattern, match) claimed before partitions form
        for pos, binding in enumerate(bindings):
            if not isinstance(binding, relax.VarBinding):
                continue
            for shape in ahead:
                if not (epilogues or shape.absorbs):
                    continue
                match = shape.match(Partition(binding), context(position=pos))
                if match is None or not is_anchor(binding):
                    continue
                own = next((p for p in patterns(binding) if p.name == shape.name), None)
                if own is not None and fuses(own, binding, match):
                    found[binding.var] = (own, match)
                    claimed.update((b.var, binding.var) for b in match.prologue)
                    break
        for pos, binding in enumerate(bindings):
            if binding.var in taken or binding.var in claimed or not isinstance(binding, relax.VarBinding) \
                    or not is_anchor(binding):
                continue
            part = Partition(binding)
            if epilogues:
                part.epilogue = _epilogue(binding, bindings[pos + 1:], users, taken, is_anchor)
            if binding.var in found:
                part.pattern, match = found[binding.var]
                part.prologue, part.tail = list(match.prologue), list(match.tail)
            else:
                for pattern in patterns(binding):
                    if pattern.claims_anchor:
                        continue
                    match = pattern.match(part, context(position=pos))
                    if match is not None and fuses(pattern, binding, match):
                        part.pattern = pattern
                        part.prologue, part.tail = list(match.prologue), list(match.tail)
                        break
            taken.update(b.var for b in part.bindings)
            partitions.append(part)
    return partitions


def _epilogue(anchor: relax.VarBinding, later: Sequence[relax.Binding], users: dict, taken: set,
              is_anchor: Callable[[relax.VarBinding], bool]) -> list[relax.VarBinding]:
    """The epilogue of ``anchor`` among the ``later`` bindings (:func:`find_partitions`)."""
    part = Partition(anchor)
    shape = static_shape(anchor.var)
    region = {anchor.var}
    for binding in later:
        if binding.var in taken or not isinstance(binding, relax.VarBinding):
            continue
        if not any(v in region for v in relax.analysis.free_vars(binding.value)):
            continue
        if is_anchor(binding) or not _joins(binding, region, shape):
            break
        part.epilogue.append(binding)
        region.add(binding.var)
    _trim(part, users)
    return part.epilogue


def tail_pieces(partition: Partition) -> list[Partition]:
    """The partitions to lower one by one when ``partition``'s fused kernel cannot be built
    (its pattern's :attr:`~alt_tvm.strategies.pattern.FusionPattern.pieces`); ``[]`` for none."""
    return partition.pieces()


def _trim(part: Partition, users: dict) -> None:
    """Drop epilogue ops from the end until only the last value is used outside the partition."""
    while part.epilogue:
        members = {b.var for b in part.bindings}
        leaking = [b.var for b in part.bindings[:-1]
                   if any(isinstance(u, str) or u not in members for u in users.get(b.var, []))]
        if not leaking:
            return
        part.epilogue.pop()


def op_info(binding: relax.VarBinding, target: HardwareTarget, *,
            options: Mapping[str, Any] | None = None) -> OpInfo:
    """What a strategy sees of one Relax call (:class:`~alt_tvm.strategies.base.OpInfo`)."""
    call = binding.value
    tensors = [a for a in call.args if static_shape(a) is not None]
    constants = {i: const_value(a) for i, a in enumerate(call.args) if const_value(a) is not None}
    return OpInfo(
        op=op_name(call), attrs=attrs_dict(call.attrs),
        input_shapes=tuple(static_shape(a) for a in tensors), input_dtypes=tuple(dtype_of(a) for a in tensors),
        output_shape=static_shape(binding.var) or (), output_dtype=dtype_of(binding.var) or "",
        target_kind=target.to_tvm().kind.name, constants=constants, target_name=target.name,
        options=dict(options or {}))


def strategy_named(binding: relax.VarBinding, name: str, target: HardwareTarget, *,
                   options: Mapping[str, Any] | None = None) -> tuple[Strategy | None, list[str]]:
    """The strategy ``name`` if it applies to ``binding`` (opt-in or not), else None and why not."""
    options = dict(options or {})
    return select(op_info(binding, target, options={**options, name: options.get(name, {})}), allowed=[name])


@dataclass
class PartitionPlan:
    """The partitions of a function and the strategy chosen for each (:func:`plan_partitions`)."""

    partitions: list[Partition]
    #: anchor var -> the strategy that lowers its partition
    strategies: dict = field(default_factory=dict)
    #: anchor op -> why no strategy took it (calls of ops some strategy registers for)
    fallbacks: dict[str, list[str]] = field(default_factory=dict)
    #: workload key -> why the strategy ``chosen`` for it could not lower it
    refused: dict[str, str] = field(default_factory=dict)
    #: workload key -> the strategy ``chosen`` for it, where that replaced the priority rule
    overridden: dict[str, str] = field(default_factory=dict)
    #: anchor var of a piece -> the workload key of the fused partition it was split from
    #: (``unfused``): the in-model stage times the pieces as that workload
    pieces_of: dict = field(default_factory=dict)
    #: workload keys ``unfused`` named that were split here
    split: set[str] = field(default_factory=set)

    def strategy_of(self, partition: Partition) -> Strategy:
        return self.strategies[partition.anchor.var]


def plan_partitions(func: relax.Function, *, target: HardwareTarget, variant: str = "alt",
                    allowed: Sequence[str] | None = None,
                    strategy_options: Mapping[str, Any] | None = None,
                    chosen: Mapping[str, str] | None = None,
                    unfused: Collection[str] | None = None) -> PartitionPlan:
    """Partition ``func`` and select a strategy for every partition: the one rule that the
    build and task extraction both apply, so a task is tuned for exactly the program the
    build makes.

    Parameters
    ----------
    func
        A Relax function after :func:`alt_tvm.graph.prepare.prepare`.
    target
        The hardware the partitions are lowered for.
    variant
        ``"alt-wp"`` partitions have no epilogue (ALT paper §7 ablation); the others do.
    allowed
        Strategy names the user restricted the build to (None: every non-opt-in strategy,
        and the opt-in ones given options).
    strategy_options
        Options per strategy name, handed to ``applicable`` through ``OpInfo.options``.
    chosen
        Workload key -> the strategy measured fastest for it in the model (a tuning log's
        decisions): it replaces the priority rule where it applies and the user allows it;
        where not, the reason is in ``refused``. Workload keys do not depend on the
        strategy, so the partitions are found again with the chosen strategies (which may
        absorb a pad producer or not).
    unfused
        Workload keys of fused partitions (a pattern with
        :attr:`~alt_tvm.strategies.pattern.FusionPattern.pieces`) that a tuning log's decisions
        build as their pieces: their anchors do not grow by that pattern. A key whose
        partition fuses nothing here is named in ``refused``.
    """
    options = dict(strategy_options or {})
    anchor_ops = strategy_ops()
    plan = PartitionPlan([])
    overrides: dict = {}  # anchor var -> the chosen strategy
    declined: dict = {}  # anchor var -> the pattern a decision split its partition from

    def is_anchor(binding: relax.VarBinding) -> bool:
        name = op_name(binding.value)
        if name not in anchor_ops:
            return False
        if binding.var in overrides:
            plan.strategies[binding.var] = overrides[binding.var]
            return True
        strategy, reasons = select(op_info(binding, target, options=options), allowed=allowed)
        if strategy is None:
            known = plan.fallbacks.setdefault(name, [])
            known.extend(r for r in reasons if r not in known)
            return False
        plan.strategies[binding.var] = strategy
        return True

    def partition() -> list[Partition]:
        return find_partitions(func, is_anchor=is_anchor, epilogues=variant != "alt-wp",
                               strategy_of=lambda b: plan.strategies[b.var], target=target,
                               strategy_options=options, declined=declined)

    plan.partitions = partition()
    split = _split(plan, set(unfused or ()), declined)
    if split:
        plan.partitions = partition()
        plan.pieces_of = {p.anchor.var: split[p.anchor.var] for p in plan.partitions if p.anchor.var in split}
    for part in plan.partitions if chosen else []:
        key = workload_key(part)
        name = chosen.get(key)
        if name is None or name == plan.strategy_of(part).name:
            continue
        if allowed is not None and name not in allowed:
            plan.refused[key] = f"the log chose strategy {name!r}, which this build excludes ({list(allowed)})"
            continue
        strategy, reasons = strategy_named(part.anchor, name, target, options=options)
        if strategy is None:
            plan.refused[key] = f"the log chose strategy {name!r}, which does not apply: {'; '.join(reasons)}"
            continue
        overrides[part.anchor.var] = strategy
        plan.overridden[key] = name
    if overrides:
        plan.partitions = partition()
    return plan


def _split(plan: PartitionPlan, unfused: set[str], declined: dict) -> dict:
    """Decline the pattern of each of ``plan``'s partitions whose key ``unfused`` names (into
    ``declined``); returns its bindings' vars -> its key."""
    members: dict = {}
    for part in plan.partitions if unfused else []:
        key = workload_key(part)
        if key not in unfused:
            continue
        if part.pattern is None or not part.pieces():
            plan.refused[key] = "the log builds this workload as the pieces of a fusion, but it fuses nothing here"
            continue
        declined[part.anchor.var] = part.pattern.name
        plan.split.add(key)
        members.update((b.var, key) for b in part.bindings)
    return members
