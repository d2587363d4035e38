"""The loop and layout knobs added to the conv/GEMM spaces: each decodes to a correct kernel."""

import numpy as np
import pytest
import torch
from conftest import one_record_log

import alt_tvm
from alt_tvm.integration import extract_tasks
from alt_tvm.layout.templates import conv_output_tiled, conv_output_two_level
from alt_tvm.strategies.alt.space import ConvSpace


class ConvRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 32, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


MODEL, INPUTS = ConvRelu().eval(), (torch.rand(1, 8, 16, 16),)


def test_two_level_template_is_a_bijection_with_the_paper_dim_order():
    shape = (1, 32, 16, 12)
    layout = conv_output_two_level(shape, spatial_tiles=[2, 3], channel_tile=8, outer_spatial_tiles=[4, 2],
                                   outer_channel_tile=2)
    # N H/(ht'ht) W/(wt'wt) O/(ot'ot) ht' wt' ot' ht wt ot
    assert layout.shape == (1, 2, 2, 2, 4, 2, 2, 2, 3, 8)
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    np.testing.assert_array_equal(layout.inverse_apply(layout.apply(data)), data)
    # Outer tiles of 1 store exactly like the one-level template.
    flat = conv_output_two_level(shape, spatial_tiles=[2, 3], channel_tile=8, outer_spatial_tiles=[1, 1],
                                 outer_channel_tile=1)
    one = conv_output_tiled(shape, spatial_tiles=[2, 3], channel_tile=8)
    np.testing.assert_array_equal(flat.apply(data).ravel(), one.apply(data).ravel())
    with pytest.raises(ValueError, match="2 spatial dims need 2 inner and 2 outer tiles"):
        conv_output_two_level(shape, spatial_tiles=[2, 3], channel_tile=8, outer_spatial_tiles=[4],
                              outer_channel_tile=2)


def test_two_level_space_rejects_outer_tiles_that_do_not_divide_before_building():
    space = ConvSpace(out_shape=(1, 32, 16, 16), in_channels_per_group=8, out_channels_per_group=32,
                      default={"spatial": [2, 8], "ot": 16, "it": 8, "reg": 4}, registers=32, lanes=16, levels=2)
    layout, loop = space.default()
    assert space.check(layout, loop) is None and space.params(layout, loop)["outer_ot"] == 1
    bad = dict(layout, s1_outer=4)  # 16 / 8 = 2 tiles along W: 4 does not divide them
    assert "s1_outer=4 does not divide the 2 tiles" in space.check(bad, loop)
    with pytest.raises(ValueError, match="invalid point"):
        space.params(bad, loop)
    one = ConvSpace(out_shape=(1, 32, 16, 16), in_channels_per_group=8, out_channels_per_group=32,
                    default={"spatial": [2, 8], "ot": 16, "it": 8, "reg": 4}, registers=32, lanes=16)
    layout, loop = one.default()
    assert one.check(layout, dict(loop, reduction_outer=True, rc_split=4)) is None
    assert "splitting the 8 input channels" in one.check(layout, dict(loop, reduction_outer=True, rc_split=8))
    assert "window_outer=False" in one.check(layout, dict(loop, reduction_outer=True, rc_split=4,
                                                          window_outer=True))
    assert one.check(layout, dict(loop, reduction_outer=True, rc_split=4, prefetch=True)) is None
    # That order's register blocks hold partial sums: an in-block epilogue would be a no-op point.
    assert "reduction_outer needs epilogue_in_block=False" in one.check(
        layout, dict(loop, reduction_outer=True, rc_split=4, epilogue_in_block=True))
    assert "prefetch needs reduction_outer" in one.check(layout, dict(loop, reduction_outer=False, prefetch=True))
    # A point written before the prefetch knob existed decodes to no prefetch.
    old = {k: v for k, v in dict(loop, reduction_outer=True, rc_split=4).items() if k != "prefetch"}
    assert one.decode(layout, old)["prefetch"] is False
    # The input tile prefetch: offered with the one-level order whose tasks are spatial tiles.
    assert one.check(layout, dict(loop, prefetch_input=True)) is None
    assert "prefetch_input needs reduction_outer=False" in one.check(
        layout, dict(loop, reduction_outer=True, rc_split=4, prefetch_input=True))
    assert one.decode(layout, {k: v for k, v in loop.items() if k != "prefetch_input"})["prefetch_input"] is False
    assert {k.name: k.choices for k in space.loop_knobs(space.default()[0])}["prefetch_input"] == (False,)
    with pytest.raises(ValueError, match="levels must be 1 or 2"):
        ConvSpace(out_shape=(1, 32, 16, 16), in_channels_per_group=8, out_channels_per_group=32,
                  default={"spatial": [2, 8], "ot": 16, "it": 8, "reg": 4}, registers=32, lanes=16, levels=3)


LOOP_VARIANTS = [
    {},
    {"unroll_window": True},
    {"window_outer": True, "rc_split": 4},
    {"epilogue_in_block": True},
    {"reduction_outer": True, "rc_split": 4},
    {"reduction_outer": True, "parallel_channels": True, "spatial": [4, 16], "reg": 8, "rc_split": 2},
    {"outer_spatial": [2, 1], "outer_ot": 2},
    {"outer_spatial": [4, 2], "outer_ot": 1, "window_outer": True, "epilogue_in_block": True},
]


@pytest.mark.parametrize("extra", LOOP_VARIANTS, ids=lambda e: ",".join(e) or "default")
def test_every_loop_and_layout_knob_builds_a_kernel_equal_to_pytorch(tmp_path, extra):
    (task,) = extract_tasks(MODEL, example_inputs=INPUTS, layout_levels=2)
    params = {"spatial": [2, 8], "ot": 16, "it": 8, "reg": 4, "weight_ot": 16, "weight_it": 8, "rc_split": 8,
              "parallel_channels": False, **extra}
    compiled = alt_tvm.build(MODEL, example_inputs=INPUTS, records=one_record_log(tmp_path / "one.jsonl", task, params))
    assert compiled.report.tuned == 1
    with torch.no_grad():
        np.testing.assert_allclose(compiled(INPUTS[0].numpy())[0], MODEL(*INPUTS).numpy(), rtol=1e-4, atol=1e-4)


def test_a_record_asking_reduction_outer_where_it_cannot_apply_is_rejected_not_fatal(tmp_path):
    """8 input channels in one block: nothing to run outside the rows. The record is
    refused with the reason, and the partition is built with its analytic tiling."""
    (task,) = extract_tasks(MODEL, example_inputs=INPUTS)
    params = {"spatial": [2, 8], "ot": 16, "it": 8, "reg": 4, "rc_split": 8, "reduction_outer": True}
    compiled = alt_tvm.build(MODEL, example_inputs=INPUTS, records=one_record_log(tmp_path / "bad.jsonl", task, params))
    assert compiled.report.tuned == 0
    assert "reduction_outer needs the input channels (8) split into blocks" in compiled.report.summary()
    with torch.no_grad():
        np.testing.assert_allclose(compiled(INPUTS[0].numpy())[0], MODEL(*INPUTS).numpy(), rtol=1e-4, atol=1e-4)


def test_two_level_tuning_space_is_selectable():
    (one,) = extract_tasks(MODEL, example_inputs=INPUTS)
    (two,) = extract_tasks(MODEL, example_inputs=INPUTS, layout_levels=2)
    names = lambda space: {k.name for k in space.layout_knobs}  # noqa: E731
    assert names(two.space) - names(one.space) == {"s0_outer", "s1_outer", "ot_outer"}
    assert {"unroll_window", "window_outer", "epilogue_in_block"} <= {k.name for k in one.space.loop_knobs(
        one.space.default()[0])}
    with pytest.raises(ValueError, match="layout_levels must be 1 or 2"):
        extract_tasks(MODEL, example_inputs=INPUTS, layout_levels=0)



def test_tiling_records_with_inconsistent_levels_are_refused():
    from alt_tvm.strategies.alt.tiling import DefaultConvTiling

    base = {"spatial": [2, 8], "ot": 16, "it": 8, "reg": 4}
    with pytest.raises(ValueError, match=r"outer_spatial \[2\] needs one tile per spatial dim \(2"):
        DefaultConvTiling.from_json({**base, "outer_spatial": [2], "outer_ot": 1})
    with pytest.raises(ValueError, match="a two-level tiling needs outer_ot >= 1, got 0"):
        DefaultConvTiling.from_json({**base, "outer_spatial": [2, 1]})
    with pytest.raises(ValueError, match="tiles must be positive"):
        DefaultConvTiling.from_json({**base, "reg": 0})
    assert DefaultConvTiling.from_json({**base, "outer_spatial": [2, 1], "outer_ot": 2}).two_level


def test_a_depthwise_space_offers_no_reduction_outer_order():
    """One input channel per group has no channel blocks to run outside the rows: the space
    does not offer the order (each such point would spend a trial on a build error)."""
    depthwise = ConvSpace(out_shape=(1, 32, 16, 16), in_channels_per_group=1, out_channels_per_group=1,
                          default={"spatial": [2, 8], "ot": 16, "it": 16, "reg": 4}, registers=32, lanes=16)
    layout, loop = depthwise.default()
    knobs = {k.name: k.choices for k in depthwise.loop_knobs(layout)}
    assert knobs["reduction_outer"] == (False,) and knobs["prefetch"] == (False,)
    assert knobs["prefetch_input"] == (False,)  # its input is read by the per-tile window copy
    assert "reduction_outer=True not in [False]" in depthwise.check(layout, dict(loop, reduction_outer=True))


@pytest.mark.parametrize("tokens, width", [(256, 160), (64, 256)])
def test_gemm_default_point_is_one_its_space_accepts(tokens, width):
    """SegFormer's attention projections: few weight panels, so the rule chunks ``k`` and groups
    the panels, but the panels do not run outermost (the weight fits the L2). The default point
    must still be a point of the space, or tuning fails on its first trial."""
    model = torch.nn.Linear(width, width).eval()
    tasks = extract_tasks(model, example_inputs=(torch.rand(1, tokens, width),))
    gemm = [t for t in tasks if t.key.startswith("matmul")]
    assert gemm
    for task in gemm:
        layout, loop = task.space.default()
        assert task.space.check(layout, loop) is None, (task.key, loop)
        params = task.space.params(layout, loop)
        assert params["panel_groups"] == 0 or (params["panels_outer"] and params["kc"]), params
