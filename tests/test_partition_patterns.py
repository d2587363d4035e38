"""Fusion patterns (``alt_tvm.strategies.pattern``): strategies declare them, the partitioner
matches them generically, and a partition's key part and fallback pieces come from its pattern."""

from __future__ import annotations

import pytest
import torch

from alt_tvm.graph.frontend import load_model
from alt_tvm.graph.partition import plan_partitions, tail_pieces
from alt_tvm.graph.prepare import prepare
from alt_tvm.strategies.alt import patterns
from alt_tvm.strategies.alt.gemm import AltGemmStrategy
from alt_tvm.strategies.base import op_name, workload_key
from alt_tvm.strategies.pattern import FusionPattern, declared_patterns
from alt_tvm.strategies.registry import registered_strategies
from alt_tvm.target import host


def _tail(partition, context):
    return []


@pytest.mark.parametrize(("fields", "message"), [
    ({"name": "", "anchor": ("relax.matmul",), "tail": _tail}, "needs a name and anchor ops, got name=''"),
    ({"name": "x.y", "anchor": (), "tail": _tail}, r"anchor=\(\)"),
    ({"name": "x.y", "anchor": ("relax.matmul",)}, "'x.y' needs a tail or a prologue matcher"),
    ({"name": "x.y", "anchor": ("relax.matmul",), "tail": _tail, "prologue": _tail, "claims_anchor": True},
     "claims_anchor needs a prologue matcher and no tail"),
])
def test_a_pattern_without_its_parts_is_refused_naming_what_is_missing(fields, message):
    with pytest.raises(ValueError, match=message):
        FusionPattern(**fields)


def test_each_family_declares_the_patterns_it_lowers():
    declared = {type(s).__name__: [p.name for p in s.patterns] for s in registered_strategies()}
    assert declared["AltConvStrategy"] == ["alt.absorbed_input", "alt.channel_scale", "alt.block"]
    assert declared["AltConvCudaStrategy"] == ["alt.absorbed_input", "alt.block"]
    assert declared["AltGemmStrategy"] == ["alt.norm_before", "alt.norm_after"]
    assert declared["AltBatchMatmulStrategy"] == ["alt.attention"]
    assert declared["SConvStrategy"] == declared["TTEinsumStrategy"] == declared["VTAGemmStrategy"] == []
    names = [p.name for p in declared_patterns(registered_strategies())]
    assert len(names) == len(set(names)) == 6


class _GemmSoftmax(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16, bias=False)

    def forward(self, x):
        return torch.softmax(self.linear(x), dim=-1)


def _softmax_after(partition, context):
    """The softmax that alone reads the partition's value."""
    readers = context.users.get(partition.output, [])
    found = [b for b in context.later if len(readers) == 1 and b.var.same_as(readers[0])]
    return found if found and op_name(found[0].value) == "relax.nn.softmax" else []


SOFTMAX_AFTER = FusionPattern(name="test.softmax_after", anchor=("relax.matmul",), tail=_softmax_after,
                              key=lambda partition: "|then=softmax")


@pytest.mark.parametrize("fuses", [True, False])
def test_a_pattern_a_strategy_declares_is_matched_without_the_partitioner_knowing_it(monkeypatch, fuses):
    """A new fusion is declared on the strategy alone: the partitioner matches it, asks its
    check, and the partition's key part and pieces come from it."""
    calls = []

    def check(strategy, anchor, match, target, options):
        calls.append((type(strategy).__name__, [op_name(b.value) for b in match.tail], options))
        return fuses

    monkeypatch.setattr(AltGemmStrategy, "patterns", (*AltGemmStrategy.patterns, SOFTMAX_AFTER.where(check)))
    torch.manual_seed(0)
    imported = load_model(_GemmSoftmax().eval(), example_inputs=(torch.randn(1, 8, 16),))
    plan = plan_partitions(prepare(imported.mod)["main"], target=host(), strategy_options={"alt": {"k": 1}})
    (gemm,) = [p for p in plan.partitions if p.ops[0] == "relax.matmul"]
    assert calls == [("AltGemmStrategy", ["relax.nn.softmax"], {"k": 1})]
    if fuses:
        assert gemm.pattern.name == "test.softmax_after" and gemm.ops == ["relax.matmul", "relax.nn.softmax"]
        assert workload_key(gemm).endswith("|epilogue=|then=softmax")
        assert [p.ops for p in tail_pieces(gemm)] == []  # the pattern names no pieces
        assert len(plan.partitions) == 1
    else:
        assert gemm.pattern is None and not gemm.tail and "|then=" not in workload_key(gemm)
        assert [p.ops for p in plan.partitions] == [["relax.matmul"], ["relax.nn.softmax"]]


def test_the_parsers_read_a_partition_through_its_pattern():
    """``norm_of`` and ``norm_before`` answer from the partition's pattern, not from the ops."""
    from alt_tvm.strategies.base import Partition

    class _Binding:
        def __init__(self, name):
            self.var = name

    norm, anchor = _Binding("norm"), _Binding("anchor")
    partition = Partition(anchor, tail=[norm], pattern=patterns.NORM_AFTER)
    assert patterns.norm_of(partition) is norm and patterns.norm_before(partition) is None
    assert patterns.norm_of(Partition(anchor, tail=[norm])) is None
