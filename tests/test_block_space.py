"""The fused inverted-residual block's tuning space: its default is the untuned kernel,
every point lowers to a kernel that computes the same block, a tuned record is applied by
the build, and a record that does not fit the block is a clear error."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import check_space, one_record_log
from test_block_fusion import ALWAYS, _fused, _InvertedResidual, _MBConv, _Stem

import alt_tvm
from alt_tvm.integration import extract_tasks
from alt_tvm.strategies.alt.block import BlockTiling
from alt_tvm.strategies.alt.space import BlockSpace

SHAPE = (1, 3, 16, 16)


def _block_task(make, shape):
    """(model, input, its block's task) of the module ``make()`` builds, seeded."""
    torch.manual_seed(0)
    model = make()
    x = torch.randn(*shape)
    (task,) = [t for t in extract_tasks(model.eval(), example_inputs=[x], strategy_options=ALWAYS)
               if isinstance(t.space, BlockSpace)]
    return model, x, task


@pytest.fixture(scope="module")
def block():
    return _block_task(lambda: _InvertedResidual(c=16, o=24, stride=2), SHAPE)


@pytest.fixture(scope="module")
def stem():  # a network's first conv (3x3, stride 2, on the image) as the expand stage
    return _block_task(lambda: _Stem(m=32, o=16), (1, 3, 32, 32))


@pytest.fixture(scope="module")
def short():  # a block that ends at its depthwise conv (a squeeze-excitation reads that map)
    return _block_task(lambda: _MBConv(), SHAPE)


@pytest.mark.parametrize("which", ["block", "stem", "short"])
def test_the_space_starts_at_the_untuned_block_and_every_point_computes_the_same_block(which, request):
    _, _, task = request.getfixturevalue(which)
    check_space(task, points=6, loop_knobs=False)


def test_channel_tiles_are_wider_than_a_quarter_vector_and_a_scalar_block_is_refused(stem):
    _, _, task = stem
    space = task.space
    knobs = {k.name: k.choices for k in space.layout_knobs}
    assert min(knobs["ot"]) * 4 > space.lanes and min(knobs["mt"]) * 4 > space.lanes
    # Without vectors (one lane) every tile is offered; a register block of one value is refused.
    scalar = BlockSpace(geometry=space.geometry, default=BlockTiling.from_json(space.params(*space.default())),
                        registers=32, lanes=1, cores=space.cores, l2_bytes=space.l2_bytes)
    layout, loop = scalar.default()
    why = scalar.check({**layout, "s0": 1, "s1": 1, "ot": 1}, {**loop, "project_reg": 1})
    assert why is not None and "no loop to vectorize" in why


def test_bands_fit_the_l2_and_leave_a_band_per_core(block):
    _, _, task = block
    space = task.space
    g = space.geometry
    for s0 in space.layout_knobs[0].choices:
        rows = {k.name: k for k in space.loop_knobs({**space.default()[0], "s0": s0})}["band_rows"].choices
        for r in rows:
            assert r % s0 == 0 and g.oh % r == 0
            assert g.oh // r >= space.cores and g.band_bytes(r) <= space.l2_bytes


@pytest.mark.parametrize("edit, message", [
    (dict(band_rows=3), "band_rows=3 must divide the 8 output rows"),
    (dict(spatial=(3, 8)), "spatial tiles [3, 8] must divide the 8x8 output"),
    (dict(project_reg=0), "project_reg=0 must be in [1, 8]"),
    (dict(dw_reg=9), "dw_reg=9 must be in [1, 8]"),
    (dict(mt=0), "channel tiles ot=OT and mt=0 must be at least 1"),  # OT: the default's, which the target sets
    (dict(spatial=(1, 8), ot=1, project_reg=1), "a register block of one output value"),
])
def test_a_tiling_that_does_not_fit_the_block_names_the_value(block, edit, message):
    _, _, task = block
    default = BlockTiling.from_json(task.space.params(*task.space.default()))
    message = message.replace("ot=OT", f"ot={default.ot}")
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        task.lower(dataclasses.replace(default, **edit).to_json())


def test_a_record_that_is_not_a_block_tiling_is_a_clear_error():
    with pytest.raises(ValueError, match="not a block tiling record: .*'mt'"):
        BlockTiling.from_json({"spatial": [2, 8], "ot": 8, "band_rows": 2, "expand_reg": 1, "dw_reg": 1,
                               "project_reg": 1})


def test_a_tuned_block_is_built_from_the_log_and_matches_pytorch(block, tmp_path):
    model, x, task = block
    space = task.space
    layout, loop = space.default()
    knobs = {k.name: k for k in space.loop_knobs(layout)}
    tuned = space.params(layout, {**loop, "dw_reg": next(c for c in knobs["dw_reg"].choices if c != loop["dw_reg"])})
    built = alt_tvm.build(model, example_inputs=[x], strategy_options=ALWAYS, strict=True,
                          records=one_record_log(tmp_path / "block.jsonl", task, tuned))
    assert len(_fused(built)) == 1 and built.report.tuned == 1
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_block_record_that_does_not_fit_is_refused_and_the_block_built_untuned(block, tmp_path):
    model, x, task = block
    bad = {**task.space.params(*task.space.default()), "band_rows": 3}
    built = alt_tvm.build(model, example_inputs=[x], strategy_options=ALWAYS,
                          records=one_record_log(tmp_path / "bad.jsonl", task, bad))
    assert built.report.tuned == 0 and len(_fused(built)) == 1
    assert "band_rows=3 must divide the 8 output rows" in built.report.summary()
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_real_search_measures_block_candidates_and_the_build_applies_the_best(block, tmp_path):
    """The tuner's own measure (built and timed here, not faked) on the block's task."""
    from alt_tvm.records import load_records
    from alt_tvm.tuning.driver import tune_tasks

    model, x, task = block
    log = tmp_path / "real.jsonl"
    (summary,) = tune_tasks([task], trials=6, log=log, cost_model=None, features="knobs", progress=False,
                            revalidate=0, top_k=3)
    records = load_records(log, workload_key=task.key)
    assert summary.ok and len(records) == 6 and all(r.error_code is None for r in records)
    assert len({json.dumps(r.candidate["params"], sort_keys=True) for r in records}) > 1
    built = alt_tvm.build(model, example_inputs=[x], strategy_options=ALWAYS, records=str(log), strict=True)
    assert built.report.tuned == 1
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
