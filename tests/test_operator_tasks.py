"""Tuning spaces for the kernels no strategy implements (pools, concatenations, means,
element-wise chains, kernels TVM fused): tasks, spaces, records the build applies."""

import warnings

import numpy as np
import pytest
import torch
from conftest import check_space, torch_to_onnx
from torch import nn

from alt_tvm.graph.build import build
from alt_tvm.graph.in_layout import OPERATOR_STRATEGY, OperatorSchedule
from alt_tvm.integration import _operator_budget, extract_tasks, tune
from alt_tvm.operator_tasks import OperatorTask
from alt_tvm.records import RecordWarning, RecordWriter, TuningRecord, load_records, target_key
from alt_tvm.target import board


class _DenseBlock(nn.Module):
    """DenseNet's pattern: a stem, a padded max pool, two branches concatenated, batch norm and
    ReLU on the concatenation, a 1x1 conv, a global mean and a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.a, self.b = nn.Conv2d(32, 32, 3, padding=1), nn.Conv2d(32, 32, 1)
        self.norm = nn.BatchNorm2d(96)
        self.project = nn.Conv2d(96, 64, 1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        y = self.pool(torch.relu(self.stem(x)))
        y = torch.relu(self.norm(torch.cat([y, self.a(y), self.b(y)], 1)))
        return self.fc(self.project(y).mean((2, 3)))


#: AVX2 (8 lanes), which every machine of the project runs: the kernels do not depend on the host's vectors.
TARGET = "cpu:haswell"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.manual_seed(0)
    module = _DenseBlock().eval()
    with torch.no_grad():
        module.norm.running_mean.uniform_(-0.5, 0.5)
        module.norm.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 32, 32)
    path = tmp_path_factory.mktemp("operators") / "dense_block.onnx"
    torch_to_onnx(module, (x,), path, dynamo=False)
    with torch.no_grad():
        return str(path), x.numpy(), module(x).numpy()


@pytest.fixture(scope="module")
def tasks(model):
    found = extract_tasks(model[0], target=TARGET, operators=100)
    return [t for t in found if isinstance(t, OperatorTask)]


def test_every_operator_kernel_has_a_task(model, tasks):
    compiled = build(model[0], target=TARGET)
    np.testing.assert_allclose(compiled(model[1])[0], model[2], rtol=1e-4, atol=1e-4)
    kinds = {t.kernel.kind for t in tasks}
    assert {"operator", "elementwise"} <= kinds, kinds
    assert all(t.strategy.name == OPERATOR_STRATEGY and t.partition is None for t in tasks)
    keys = {t.key for t in tasks}
    operator_kernels = [k for k in compiled.report.kernels if k.kind in ("operator", "elementwise")]
    assert operator_kernels and all(k.workload in compiled.report.tunable for k in operator_kernels)
    # Every operator kernel the build emits is a task, unless none of its knobs changes it.
    assert keys <= compiled.report.tunable
    pool = next(t for t in tasks if "max_pool2d" in t.key)
    assert pool.kernel.output is not None and not pool.kernel.output.is_identity  # computed in channel vectors
    assert "pad_at" in [k.name for k in pool.space.loop_knobs({})]


def test_spaces_start_at_the_rule_and_compute_the_same(tasks):
    for task in tasks:
        check_space(task, points=2)


def test_the_build_applies_tuned_knobs(model, tasks, tmp_path):
    target = board(TARGET)
    log = tmp_path / "operators.jsonl"
    rng = np.random.default_rng(1)
    chosen = {}
    with RecordWriter(log) as writer:
        for task in tasks:
            layout, default = task.space.default()
            loop = default
            while loop == default:
                loop = task.space.random_loop(layout, rng)
            chosen[task.key] = task.space.params(layout, loop)
            writer.write(TuningRecord(workload_key=task.key, target=target_key(target.to_tvm()),
                                      candidate={"strategy": OPERATOR_STRATEGY, "params": chosen[task.key]},
                                      latencies_ms=(1.0,)))
    untuned = build(model[0], target=TARGET)
    tuned = build(model[0], target=TARGET, records=str(log))
    assert tuned.report.tuned_operators == set(chosen)
    assert tuned.report.changed_by_log
    np.testing.assert_allclose(tuned(model[1])[0], untuned(model[1])[0], rtol=1e-5, atol=1e-5)
    info = tuned.kernel_info()
    marks = {info[k.name].tuning for k in tuned.report.kernels if k.workload in chosen}
    assert marks == {"tuned"}
    assert {untuned.kernel_info()[k.name].tuning for k in untuned.report.kernels if k.workload in chosen} == {"default"}


def test_bad_tuned_knobs_keep_the_defaults(model, tasks, tmp_path):
    target = board(TARGET)
    log = tmp_path / "bad.jsonl"
    task = tasks[0]
    with RecordWriter(log) as writer:
        writer.write(TuningRecord(workload_key=task.key, target=target_key(target.to_tvm()),
                                  candidate={"strategy": OPERATOR_STRATEGY, "params": {"split": 12}},
                                  latencies_ms=(1.0,)))
    with pytest.warns(RecordWarning, match="split=12"):
        compiled = build(model[0], target=TARGET, records=str(log))
    assert not compiled.report.tuned_operators


def test_schedule_knobs_are_checked():
    for bad, match in (({"chunks": -1}, "chunks=-1"), ({"split": 12}, "split=12"), ({"lanes": -4}, "lanes=-4")):
        with pytest.raises(ValueError, match=match):
            OperatorSchedule(**bad)


@pytest.mark.parametrize(("trials", "strategy_tasks", "expected"), [(200, 35, 25), (200, 100, 0), (200, 90, 10),
                                                                    (16, 2, 2)])
def test_operator_budget(trials, strategy_tasks, expected):
    assert _operator_budget(trials, strategy_tasks) == expected


def test_tune_measures_operator_kernels(model, tmp_path):
    log = tmp_path / "tune.jsonl"
    measured = []

    def measure(task, params):  # any point off an operator kernel's defaults is faster
        measured.append(task.key)
        default = task.space.params(*task.space.default())
        return 1.0 if isinstance(task, OperatorTask) and params not in (None, default) else 2.0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tune(model[0], trials=48, log=str(log), target=TARGET, verify=False, progress=False, measure=measure,
             cost_model=None, features="knobs", revalidate=0)
    operator_keys = {r.workload_key for r in load_records(log) if r.candidate.get("strategy") == OPERATOR_STRATEGY}
    assert operator_keys and operator_keys <= set(measured)
    # The faster points the run found for operator kernels, the build applies.
    compiled = build(model[0], target=TARGET, records=str(log))
    assert compiled.report.tuned_operators and compiled.report.tuned_operators <= operator_keys
