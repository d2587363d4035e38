"""Task extraction and the build apply one partition + strategy-selection rule."""

from collections import Counter

import numpy as np
import pytest
import torch
from tvm import relax

import alt_tvm
from alt_tvm.graph.frontend import load_model
from alt_tvm.graph.partition import plan_partitions
from alt_tvm.graph.prepare import prepare
from alt_tvm.graph.propagate import AltLayoutPass
from alt_tvm.integration import extract_tasks
from alt_tvm.strategies.base import Partition, PartitionContext
from alt_tvm.target import host


class TwoBlocks(torch.nn.Module):
    """Two identical conv+ReLU blocks (one task of weight 2), then a linear layer with a bias."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.a = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = torch.relu(self.a(x))
        x = torch.relu(self.b(x))
        return self.fc(torch.flatten(x, 1))


INPUTS = (torch.rand(1, 3, 8, 8),)


@pytest.mark.parametrize("variant", ["alt", "alt-wp"])
def test_tasks_are_exactly_the_partitions_the_build_lowers(variant):
    model = TwoBlocks().eval()
    options = {"alt": {"layout_levels": 1}}
    compiled = alt_tvm.build(model, example_inputs=INPUTS, variant=variant, strategy_options=options)
    tasks = extract_tasks(model, example_inputs=INPUTS, variant=variant, strategy_options=options)
    assert {t.key: t.weight for t in tasks} == dict(Counter(compiled.report.workloads))
    assert sum(t.weight for t in tasks) == 4
    assert all(t.variant == variant and t.options == options["alt"] for t in tasks)
    with torch.no_grad():
        np.testing.assert_allclose(compiled(INPUTS[0].numpy())[0], model(*INPUTS).numpy(), rtol=1e-4, atol=1e-4)


def test_variant_changes_the_tasks_as_it_changes_the_build():
    model = TwoBlocks().eval()
    fused = {t.key for t in extract_tasks(model, example_inputs=INPUTS)}
    alone = {t.key for t in extract_tasks(model, example_inputs=INPUTS, variant="alt-wp")}
    assert all(key.endswith("epilogue=") for key in alone)  # ALT-WP: no epilogue fused
    assert any("relu" in key for key in fused) and not fused & alone


def test_a_task_lowers_like_its_partition():
    model = TwoBlocks().eval()
    (task, *_) = extract_tasks(model, example_inputs=INPUTS)
    lowered = task.lower(None)
    assert len(lowered.arg_specs) == len(lowered.func.params)
    default = task.lower(task.space.params(*task.space.default()))
    assert [spec for spec in default.arg_specs] == lowered.arg_specs  # same layouts, only loops may differ


def test_the_build_and_the_plan_agree_on_selection():
    mod = prepare(load_model(TwoBlocks().eval(), example_inputs=INPUTS).mod)
    plan = plan_partitions(mod["main"], target=host())
    assert [plan.strategy_of(p).name for p in plan.partitions] == ["alt"] * 4
    lowering = AltLayoutPass()
    lowering(mod)
    assert len(lowering.report.workloads) == len(plan.partitions)


def test_preferred_input_layout_is_the_layout_implement_requires():
    """The conv strategy names the layout its unpadded input must arrive in without lowering."""
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    w = relax.const(np.ones((32, 16, 1, 1), np.float32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    func = bb.get()["main"]
    plan = plan_partitions(func, target=host())
    (partition,) = plan.partitions
    strategy = plan.strategy_of(partition)
    preferred = strategy.preferred_input_layout(partition.anchor, PartitionContext(partition, host(), "alt", {}))
    context = PartitionContext(Partition(partition.anchor), host(), "alt", {})
    strategy.implement(partition.anchor, context)
    (required,) = context.conversions.values()
    assert preferred is not None and preferred.primitives == required.primitives
