"""A depthwise conv's padded window, copied per output tile, split where the input's tiles end."""

import numpy as np
import pytest
import torch
from tvm import tirx

from alt_tvm.strategies.alt.window import tile_edges


def test_tile_edges_are_where_the_tile_index_changes():
    w, t = tirx.Var("w", "int32"), tirx.Var("t", "int32")
    # a 3x3 window of 30 columns over tiles of 28, starting one column left of the tile
    index = tirx.floordiv(w - 1, 28) + t
    assert tile_edges(index, w, 30) == {1, 29}
    assert tile_edges(tirx.floormod(w + 27, 28), w, 30) == {1, 29}
    # stride 2 over two input tiles: 57 columns from one column left of tile 2t
    assert tile_edges(tirx.floordiv(w + 27, 28) + 2 * t, w, 57) == {1, 29}
    assert tile_edges(w + t * 30, w, 30) == set()  # no division: nothing to split
    assert tile_edges(tirx.floordiv(w + t, 28), w, 30) is None  # edges move with t
    assert tile_edges(tirx.floordiv(w * w, 28), w, 30) is None  # not linear in w


def _pad_blocks(built, *, vectorized: bool = False):
    """Names of the depthwise kernels' pad blocks that copy (not the blocks ``loop_partition``
    wraps the pieces in), with ``vectorized`` those whose loop over the lanes is vectorized."""
    import tvm

    names = []
    for gvar in built.mod.get_global_vars():
        func = built.mod[gvar]
        if isinstance(func, tvm.tirx.PrimFunc) and '"groups"' in func.script():
            lines = func.script().splitlines()
            names += [line.split('"')[1] for before, line in zip(lines, lines[1:])
                      if 'T.sblock("pad' in line and "partition" not in line and "common" not in line
                      and (not vectorized or "T.vectorized(" in before)]
    return names


@pytest.mark.parametrize("channels,size,kernel,stride", [(32, 56, 3, 1), (48, 56, 3, 2), (72, 28, 5, 2),
                                                          (96, 14, 5, 1)])
def test_a_depthwise_conv_after_a_tiled_producer_splits_its_window_and_matches_pytorch(channels, size, kernel,
                                                                                      stride):
    from alt_tvm.graph.build import build

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(channels, channels, 1),  # writes the tiled layout the depthwise conv reads
        torch.nn.Conv2d(channels, channels, kernel, stride=stride, padding=kernel // 2, groups=channels),
        torch.nn.ReLU6()).eval()
    x = torch.randn(1, channels, size, size)
    built = build(model, example_inputs=[x], strict=True, strategy_options={"alt": {"fuse_blocks": False}})
    assert len(_pad_blocks(built)) > 1  # one copy of the pad block per piece of the window
    assert _pad_blocks(built, vectorized=True) == _pad_blocks(built)  # copied a vector at a time
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_window_over_a_row_major_input_is_left_whole():
    """Read in place from a row-major input, the window's indices divide only through the
    parallel loop's binding; that loop is not split (its tiles go to different threads)."""
    from alt_tvm.graph.build import build

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(116, 116, 3, stride=2, padding=1, groups=116)).eval()
    x = torch.randn(1, 116, 28, 28)
    built = build(model, example_inputs=[x], strict=True)
    assert _pad_blocks(built) == ["pad"]
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
