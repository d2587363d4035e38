"""The fusion-pattern contract: what a strategy family declares about the ops it fuses with a
partition's anchor beyond the element-wise epilogue.

A partition is an anchor call with its element-wise epilogue (:class:`~.base.Partition`). A
:class:`FusionPattern` grows it further: a *prologue* of bindings before the anchor (a zero
pad or a transpose the kernel reads through, a per-channel scale folded into the weights, a
layer norm of the rows it reads) and/or a *tail* of bindings after the epilogue (attention's
softmax and second product, an inverted-residual block's depthwise and 1x1 convs, a layer
norm of the result). A strategy lists the patterns it lowers in :attr:`~.base.Strategy.patterns`;
the partitioner (``alt_tvm.graph.partition``) matches them without knowing what they are, in
the order listed (those whose prologue is an anchor of its own first,
:attr:`FusionPattern.claims_anchor`), and the first that matches and passes its check is
taken. The pattern
object stays with the partition (:attr:`~.base.Partition.pattern`): it gives the partition's
part of the workload key and the pieces to lower one by one when the fused kernel cannot be
built. TVM's pattern registry (``relax.backend.pattern_registry``: a name, a pattern and a
check function per fused kernel) is the model.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tvm import relax

if TYPE_CHECKING:
    from alt_tvm.target import HardwareTarget

    from .base import Partition, Strategy


@dataclass(frozen=True)
class MatchContext:
    """What a pattern's matchers see of the dataflow block around one anchor.

    Attributes
    ----------
    bindings
        The block's bindings, in program order.
    position
        The anchor's index in ``bindings``.
    users
        Every variable -> the variables bound from it (``"output"`` for the function result).
    producers
        Every variable bound in the block by a :class:`relax.VarBinding` -> that binding.
    taken
        Variables already in a partition (or claimed as another anchor's prologue): a match
        may not use them.
    is_anchor
        Whether a binding starts a partition of its own (some strategy implements it).
    epilogue
        ``epilogue(binding, later)``: the element-wise epilogue the partitioner would give
        ``binding`` among the ``later`` bindings (for a tail whose ops have epilogues).
    """

    bindings: Sequence[relax.Binding]
    position: int
    users: Mapping[Any, list]
    producers: Mapping[Any, relax.VarBinding]
    taken: Container
    is_anchor: Callable[[relax.VarBinding], bool]
    epilogue: Callable[[relax.VarBinding, Sequence[relax.Binding]], list]

    @property
    def earlier(self) -> list:
        """The bindings before the anchor."""
        return list(self.bindings[:self.position])

    @property
    def later(self) -> list:
        """The bindings after the anchor."""
        return list(self.bindings[self.position + 1:])


@dataclass(frozen=True)
class Match:
    """The bindings a pattern adds to a partition: before the anchor, and after its epilogue."""

    prologue: tuple[relax.VarBinding, ...] = ()
    tail: tuple[relax.VarBinding, ...] = ()


#: ``matcher(partition, context)``: the bindings found, or None where the pattern does not match.
Matcher = Callable[["Partition", MatchContext], "Sequence[relax.VarBinding] | None"]
#: ``check(strategy, anchor, match, target, options)``: whether the strategy fuses this match
#: on this target, with the build's options for the strategy.
Check = Callable[["Strategy", relax.VarBinding, Match, "HardwareTarget", Any], bool]


@dataclass(frozen=True)
class FusionPattern:
    """A fusion a strategy family lowers as one kernel with the partition's anchor.

    Attributes
    ----------
    name
        Identifies the pattern (``"<family>.<fusion>"``); parsers of a partition's parts
        compare it.
    anchor
        The Relax ops the pattern grows from.
    tail
        Finds the bindings after the anchor's epilogue (non-empty to match), or None.
    prologue
        Finds the bindings before the anchor (``[]`` matches with none, None does not
        match), or None; called after ``tail``, with the tail in the partition.
    check
        Whether the anchor's strategy fuses the match on the target (None: always).
    key
        The partition's part of its workload key, after the epilogue's ops (None: none).
    pieces
        The partitions to lower one by one when the fused kernel cannot be built (None: the
        partition's ops go to TVM's legalization as they are).
    absorbs
        The prologue is absorbed into how the kernel reads its input (a pad, a transpose, a
        weight scaling) rather than computed as fused ops: the pattern holds in builds whose
        partitions fuse no epilogue (ALT-WP) as well.
    claims_anchor
        The prologue is an op that is itself an anchor, computed in the kernel: it is matched
        over the whole block before partitions form (otherwise it would start its own), and
        listed in :attr:`~.base.Partition.ops`.
    """

    name: str
    anchor: tuple[str, ...]
    tail: Matcher | None = None
    prologue: Matcher | None = None
    check: Check | None = field(default=None, compare=False)
    key: Callable[[Partition], str] | None = field(default=None, compare=False)
    pieces: Callable[[Partition], list[Partition]] | None = field(default=None, compare=False)
    absorbs: bool = False
    claims_anchor: bool = False

    def __post_init__(self) -> None:
        if not self.name or not self.anchor:
            raise ValueError(f"a fusion pattern needs a name and anchor ops, got name={self.name!r}, "
                             f"anchor={self.anchor!r}")
        if self.tail is None and self.prologue is None:
            raise ValueError(f"fusion pattern {self.name!r} needs a tail or a prologue matcher")
        if self.claims_anchor and (self.tail is not None or self.prologue is None):
            raise ValueError(f"fusion pattern {self.name!r}: claims_anchor needs a prologue matcher and no tail")

    def where(self, check: Check) -> FusionPattern:
        """The same pattern with the strategy's ``check`` (a family declares the shape once and
        each strategy its own decision)."""
        return replace(self, check=check)

    def match(self, partition: Partition, context: MatchContext) -> Match | None:
        """The bindings this pattern adds to ``partition`` (the anchor with its epilogue), or
        None where it does not match or would use a taken binding."""
        tail: Sequence[relax.VarBinding] = ()
        if self.tail is not None:
            tail = self.tail(partition, context) or ()
            if not tail:
                return None
        prologue: Sequence[relax.VarBinding] = ()
        if self.prologue is not None:
            grown = replace(partition, tail=list(tail))
            found = self.prologue(grown, context)
            if found is None:
                return None
            prologue = found
        match = Match(tuple(prologue), tuple(tail))
        if any(b.var in context.taken for b in (*match.prologue, *match.tail)):
            return None
        return match

    def accepts(self, strategy: Strategy, anchor: relax.VarBinding, match: Match, target: HardwareTarget,
                options: Any) -> bool:
        """Whether ``strategy`` fuses ``match`` (:attr:`check`; always where there is none)."""
        return self.check is None or bool(self.check(strategy, anchor, match, target, options))

    def workload_part(self, partition: Partition) -> str:
        """The partition's part of its workload key (:attr:`key`)."""
        return "" if self.key is None else self.key(partition)

    def split(self, partition: Partition) -> list[Partition]:
        """The partitions to lower one by one in place of ``partition`` (:attr:`pieces`)."""
        return [] if self.pieces is None else self.pieces(partition)


def declared_patterns(strategies: Sequence[Strategy]) -> tuple[FusionPattern, ...]:
    """The patterns ``strategies`` declare, each once, in declaration order."""
    seen: dict[str, FusionPattern] = {}
    for strategy in strategies:
        for pattern in strategy.patterns:
            seen.setdefault(pattern.name, pattern)
    return tuple(seen.values())
