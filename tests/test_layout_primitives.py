"""Property tests of the layout primitives: shapes, index maps, NumPy data movement, inverses."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alt_tvm.layout import Layout, Split, Unfold

MAX_ELEMS = 4096


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def shapes(draw, max_rank=4):
    rank = draw(st.integers(1, max_rank))
    return tuple(draw(st.integers(1, 7)) for _ in range(rank))


@st.composite
def layouts(draw, *, advanced=True, max_steps=4):
    """A random valid primitive sequence on a random shape."""
    layout = Layout(draw(shapes()))
    kinds = ["split", "reorder", "fuse"] + (["unfold", "pad"] if advanced else [])
    for _ in range(draw(st.integers(0, max_steps))):
        shape = layout.shape
        if np.prod(shape) > MAX_ELEMS // 4:
            break
        kind = draw(st.sampled_from(kinds))
        dim = draw(st.integers(0, len(shape) - 1))
        if kind == "split" and len(shape) < 6:
            outer = draw(st.sampled_from(_divisors(shape[dim])))
            layout = layout.split(dim, [outer, shape[dim] // outer])
        elif kind == "reorder":
            layout = layout.reorder(draw(st.permutations(range(len(shape)))))
        elif kind == "fuse" and len(shape) > 1:
            hi = draw(st.integers(dim, len(shape) - 1))
            layout = layout.fuse(range(dim, hi + 1))
        elif kind == "unfold" and len(shape) < 6:
            tile = draw(st.integers(1, shape[dim]))
            stride = draw(st.integers(1, tile))  # covering tiles: invertible
            layout = layout.unfold(dim, tile, stride)
        elif kind == "pad":
            layout = layout.pad(dim, (draw(st.integers(0, 2)), draw(st.integers(0, 3))))
    return layout


def _data(shape):
    return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) + 1


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_apply_then_inverse_apply_round_trips(layout):
    x = _data(layout.orig_shape)
    packed = layout.apply(x)
    assert packed.shape == layout.shape
    np.testing.assert_array_equal(layout.inverse_apply(packed), x)


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_inverse_layout_undoes_layout(layout):
    x = _data(layout.orig_shape)
    inverse = layout.inverse()
    assert inverse.shape == layout.orig_shape
    np.testing.assert_array_equal(inverse.apply(layout.apply(x)), x)


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_apply_agrees_with_forward_index_map(layout):
    x = _data(layout.orig_shape)
    packed = layout.apply(x)
    index = list(np.indices(layout.orig_shape))
    new_index = layout.forward(index)
    for i, extent in zip(new_index, layout.shape):
        assert np.all((0 <= i) & (i < extent))
    np.testing.assert_array_equal(packed[tuple(new_index)], x)


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_backward_index_map_reads_every_stored_element(layout):
    x = _data(layout.orig_shape)
    packed = layout.apply(x)
    checks = []
    old = layout.backward(list(np.indices(layout.shape)), checks=checks)
    inside = np.ones(layout.shape, dtype=bool)
    for i, extent in checks:
        inside &= (0 <= i) & (i < extent)
    assert inside.sum() == x.size or layout.expands_data
    clipped = tuple(np.clip(i, 0, e - 1) for i, e in zip(old, layout.orig_shape))
    # Every position that stores a real element holds the element backward() names;
    # positions outside the original tensor hold padding zeros.
    np.testing.assert_array_equal(packed[inside], x[clipped][inside])
    assert np.all(packed[~inside] == 0)


@settings(max_examples=100, deadline=None)
@given(layouts(advanced=False))
def test_basic_primitives_are_bijective(layout):
    assert layout.is_bijective and not layout.expands_data
    x = _data(layout.orig_shape)
    packed = layout.apply(x)
    assert sorted(packed.ravel()) == sorted(x.ravel())


@settings(max_examples=100, deadline=None)
@given(layouts())
def test_json_round_trip(layout):
    again = Layout.from_json(json.dumps(layout.to_json()))
    assert again == layout and again.shape == layout.shape


def test_paper_unfold_example():
    # The paper's example: {1,2,3,4,5} unfolded with B=3, S=2 is {{1,2,3},{3,4,5}}.
    layout = Layout((5,)).unfold(0, 3, 2)
    np.testing.assert_array_equal(layout.apply(np.arange(1, 6)), [[1, 2, 3], [3, 4, 5]])
    assert layout.shape == (2, 3) and layout.expands_data


def test_unfold_last_tile_is_zero_filled():
    layout = Layout((6,)).unfold(0, 4, 3)
    np.testing.assert_array_equal(layout.apply(np.arange(1, 7)), [[1, 2, 3, 4], [4, 5, 6, 0]])


def test_paper_blocked_layout_example():
    # §4.1.1: fuse(2,3,4), split(2, [O/4, 4, H*W]), reorder -> N (O/4) (HW) 4 from NHWO.
    n, h, w, o = 2, 3, 5, 8
    layout = Layout((n, h, w, o)).fuse([1, 2, 3]).split(1, [h * w, o // 4, 4]).reorder([0, 2, 1, 3])
    assert layout.shape == (n, o // 4, h * w, 4)
    x = _data((n, h, w, o))
    packed = layout.apply(x)
    assert packed[1, 1, 7, 2] == x[1, 7 // w, 7 % w, 1 * 4 + 2]


def test_store_at_attaches_bias_to_weight_columns():
    weight = np.arange(12.0).reshape(3, 4)
    bias = np.array([100.0, 200.0, 300.0])
    layout = Layout(weight.shape).store_at(bias.shape, dim=1)
    packed = layout.apply(weight, guests=[bias])
    assert packed.shape == (3, 5)
    np.testing.assert_array_equal(packed[:, 4], bias)
    np.testing.assert_array_equal(layout.inverse_apply(packed), weight)
    np.testing.assert_array_equal(layout.extract_guest(packed), bias)
    assert layout.guest_forward(0, [2]) == [2, 4]
    # decouple_at is the inverse.
    assert layout.decouple_at(1).shape == weight.shape
    np.testing.assert_array_equal(layout.inverse().apply(packed), weight)


def test_store_at_then_split_maps_guest_through_later_primitives():
    weight = np.arange(8.0 * 3).reshape(8, 3)
    bias = np.arange(8.0) + 50
    layout = Layout(weight.shape).store_at((8,), dim=1).split(0, [2, 4]).reorder([0, 2, 1])
    packed = layout.apply(weight, guests=[bias])
    for o in range(8):
        assert packed[tuple(layout.guest_forward(0, [o]))] == bias[o]
    np.testing.assert_array_equal(layout.extract_guest(packed), bias)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: Layout((12, 5)).split(0, [5, 3]), r"factors \[5, 3\] multiply to 15, not to dimension 0 of extent 12"),
        (lambda: Layout((12, 5)).split(2, [3, 4]), r"dim=2 is out of range"),
        (lambda: Layout((12, 5)).split(0, [0, 12]), r"factor 0"),
        (lambda: Layout((12, 5)).reorder([0, 0]), r"perm=\[0, 0\] is not a permutation"),
        (lambda: Layout((12, 5)).reorder([0, 1, 2]), r"perm=\[0, 1, 2\]"),
        (lambda: Layout((12, 5, 2)).fuse([0, 2]), r"consecutive"),
        (lambda: Layout((12, 5)).unfold(1, 6, 2), r"tile_size=6 is larger than dimension 1 of extent 5"),
        (lambda: Layout((12, 5)).unfold(0, 4, 0), r"stride must be a positive int, got 0"),
        (lambda: Layout((12, 5)).pad(0, -1), r"non-negative"),
        (lambda: Layout((12, 5)).unpad(1, (3, 2)), r"leaves nothing"),
        (lambda: Layout((12, 5)).store_at((5,), dim=1), r"must have shape \(12,\)"),
        (lambda: Layout((12, 5)).fold(0, 2, 12), r"fold"),
        (lambda: Layout((0, 5)), r"positive"),
    ],
)
def test_invalid_primitives_raise_value_error_naming_the_value(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_apply_checks_array_shape():
    with pytest.raises(ValueError, match=r"array has shape \(3, 4\), layout expects \(4, 3\)"):
        Layout((4, 3)).apply(np.zeros((3, 4)))


def test_gapped_unfold_is_not_invertible():
    layout = Layout((9,)).unfold(0, 2, 3)
    assert layout.shape == (4, 2)  # ceil((9 - 2) / 3) + 1 tiles
    with pytest.raises(ValueError, match="cannot be inverted"):
        layout.inverse_apply(layout.apply(np.arange(9)))
    with pytest.raises(ValueError, match="leaves gaps"):
        layout.forward([4])


def test_from_json_rejects_unknown_schema_and_primitive():
    with pytest.raises(ValueError, match="schema"):
        Layout.from_json({"schema": 99, "shape": [2], "primitives": []})
    with pytest.raises(ValueError, match="unknown layout primitive 'twist'"):
        Layout.from_json({"schema": 1, "shape": [2], "primitives": [{"kind": "twist"}]})


def test_primitive_objects_are_values():
    assert Split(0, (2, 3)) == Split(0, [2, 3])
    assert Unfold(1, 4, 2).num_tiles(9) == 4


def test_dim_names_follow_primitives():
    layout = Layout((1, 64, 112, 112)).split(2, [28, 4]).split(4, [7, 16]).split(1, [4, 16])
    layout = layout.reorder([0, 3, 5, 1, 4, 6, 2])
    assert layout.dim_names(["n", "o", "h", "w"]) == ["n", "h_o", "w_o", "o_o", "h_i", "w_i", "o_i"]


@pytest.mark.parametrize("dim, extent", [(1, 24), (1, 72), (2, 16)])
def test_with_extent_keeps_the_tiles_and_stores_a_slice_as_the_whole_does(dim, extent):
    """A slice along a tiled dim, in the whole tensor's tiling, is the whole's layout cut at the
    slice's outer tiles (the operands of a concatenation written in its tiles)."""
    whole = Layout((1, 96, 32, 8)).unfold(3, 4, 4).split(1, [12, 8]).split(3, [4, 8]).reorder([0, 3, 1, 4, 5, 2, 6])
    part = whole.with_extent(dim, extent)
    array = np.random.default_rng(0).random((1, 96, 32, 8))
    index = [slice(None)] * 4
    index[dim] = slice(0, extent)
    mine = part.apply(array[tuple(index)])
    assert part.orig_shape[dim] == extent and mine.size == array[tuple(index)].size
    full = whole.apply(array)
    stored = [slice(None)] * full.ndim
    outer = next(d for d, (a, b) in enumerate(zip(part.shape, whole.shape)) if a != b)
    stored[outer] = slice(0, part.shape[outer])
    np.testing.assert_array_equal(mine, full[tuple(stored)])


@pytest.mark.parametrize("make, dim, extent", [
    (lambda: Layout((1, 32, 8, 8)).split(1, [4, 8]), 1, 12),   # 12 is no multiple of the 8-wide tile
    (lambda: Layout((1, 32, 8, 8)).pad(1, (0, 2)), 1, 16),     # a padded dim
    (lambda: Layout((1, 32, 8, 8)).fuse([1, 2]), 1, 16),       # a fused dim
])
def test_with_extent_refuses_tilings_the_change_cannot_carry(make, dim, extent):
    assert make().with_extent(dim, extent) is None


@pytest.mark.parametrize("dim, extent", [(4, 8), (1, 0), (1, True)])
def test_with_extent_names_a_bad_dim_or_extent(dim, extent):
    with pytest.raises(ValueError, match="with_extent"):
        Layout((1, 32, 8, 8)).with_extent(dim, extent)
