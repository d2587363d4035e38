"""Layout primitives refuse bad input with a clear error instead of truncating or wrapping.

The first tests are one exact probe per kind of bad input; then further hostile-user
probes; then checks that valid input, NumPy integers included, works.
"""

import json

import numpy as np
import pytest
from tvm import te, tirx

from alt_tvm.layout import DecoupleAt, Fold, Layout, Pad, Reorder, Split, StoreAt, Unpad
from alt_tvm.layout.primitives import primitive_from_json
from alt_tvm.layout.templates import (
    channels_last,
    conv_input_unfolded,
    conv_output_tiled,
    conv_output_two_level,
    conv_weight_tiled,
    matrix_tiled,
)


def _data(shape):
    return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) + 1


# ------------------------------------------------------------- one probe per kind
# 1. Float factors and shapes are refused, not truncated (split(1, [2.9, 4]) is not [2, 4]).
def test_float_split_factor_is_refused():
    with pytest.raises(TypeError, match=r"split: factors\[0\] must be an int, got 2\.9 of type float"):
        Layout((2, 8)).split(1, [2.9, 4])


@pytest.mark.parametrize("factor, shown", [
    (2.0, r"2\.0 of type float"),
    (np.float64(2), r"np\.float64\(2\.0\) of type float64"),
    (True, r"the bool True"),
    ("2", r"'2' of type str"),
])
def test_non_integral_split_factors_are_refused(factor, shown):
    with pytest.raises(TypeError, match=rf"split: factors\[0\] must be an int, got {shown}"):
        Layout((2, 8)).split(1, [factor, 4])


def test_float_numpy_factor_array_is_refused():
    with pytest.raises(TypeError, match=r"factors\[0\] must be an int"):
        Layout((2, 8)).split(1, np.array([2.0, 4.0]))


@pytest.mark.parametrize("shape, shown", [
    ((2.5, 4), r"2\.5 of type float"),
    ((2.0, 4), r"2\.0 of type float"),
    ((True, 4), r"the bool True"),
    (("3", 4), r"'3' of type str"),
    ((np.float32(3), 4), r"np\.float32\(3\.0\) of type float32"),
])
def test_non_integral_layout_shape_is_refused(shape, shown):
    with pytest.raises(TypeError, match=rf"Layout: shape\[0\] must be an int, got {shown}"):
        Layout(shape)


def test_split_primitive_refuses_float_factor_directly():
    with pytest.raises(TypeError, match=r"factors\[0\] must be an int, got 2\.5"):
        Split(0, (2.5, 2))


# 2. decouple_at with nothing attached is refused, not a silently dropped slot.
def test_decouple_at_without_store_at_is_refused():
    with pytest.raises(ValueError, match=r"decouple_at: nothing is attached at dim 1 of shape \(3, 4\)"):
        Layout((3, 4)).decouple_at(1)


@pytest.mark.parametrize("build, match", [
    (lambda: Layout((3, 4)).store_at((3,), 1).decouple_at(0), r"nothing is attached at dim 0 .*: \[1\]"),
    (lambda: Layout((3, 4)).store_at((3,), 1).decouple_at(1).decouple_at(1), r"nothing is attached at dim 1"),
    # The slot no longer ends dim 1 after a split or an appended pad.
    (lambda: Layout((3, 4)).store_at((3,), 1).split(1, [5, 1]).decouple_at(1), r"nothing is attached at dim 1"),
    (lambda: Layout((3, 4)).store_at((3,), 1).pad(1, 2).decouple_at(1), r"nothing is attached at dim 1"),
], ids=["other-dim", "twice", "after-split", "after-pad"])
def test_decouple_at_needs_a_slot_at_the_end_of_that_dim(build, match):
    with pytest.raises(ValueError, match=match):
        build()


# 3. forward() on an out-of-range index fails instead of wrapping.
@pytest.mark.parametrize("index, value, dim", [
    ([5, 0], 5, 0), ([-1, 0], -1, 0), ([0, 4], 4, 1), ([np.int64(3), 0], 3, 0),
    ([np.array([0, 3]), np.array([0, 0])], 3, 0), ([tirx.IntImm("int32", 7), 0], 7, 0),
])
def test_forward_out_of_range_index_is_refused(index, value, dim):
    with pytest.raises(IndexError, match=rf"Layout.forward: index {value} is out of range for dimension {dim} "
                                         rf"of shape \(3, 4\)"):
        Layout((3, 4)).forward(index)


def test_forward_wrong_number_of_indices_is_refused():
    with pytest.raises(ValueError, match=r"index has 1 entries, shape \(3, 4\) has 2 dims"):
        Layout((3, 4)).forward([0])


@pytest.mark.parametrize("index, match", [
    ([1.5, 0], r"index entry 0 is 1\.5 of type float"),
    ([True, 0], r"index entry 0 is the bool True"),
    ([tirx.FloatImm("float32", 1.0), 0], r"index entry 0 .* of type FloatImm"),
    ([tirx.Var("f", "float32"), 0], r"index entry 0 is f of type Var"),
    ([np.array([0.5]), np.array([0])], r"array of dtype float64"),
    (5, r"index must be a sequence of 2 entries"),
])
def test_forward_non_integer_index_is_refused(index, match):
    with pytest.raises(TypeError, match=match):
        Layout((3, 4)).forward(index)


def test_forward_of_element_dropped_by_unpad_is_refused():
    with pytest.raises(IndexError, match=r"element \[0, 4\] is not stored in this layout"):
        Layout((3, 5)).unpad(1, 1).forward([0, 4])
    with pytest.raises(IndexError, match=r"maps to index -1 outside dimension 1"):
        Layout((3, 5)).unpad(1, (1, 0)).forward([0, 0])


@pytest.mark.parametrize("index, exc, match", [
    ([0, 2, 0], IndexError, r"index 2 is out of range for dimension 1 of layout shape \(3, 2, 2\)"),
    ([-1, 0, 0], IndexError, r"index -1 is out of range for dimension 0"),
    ([0, 0], ValueError, r"index has 2 entries, layout shape \(3, 2, 2\) has 3 dims"),
])
def test_backward_out_of_range_index_is_refused(index, exc, match):
    with pytest.raises(exc, match=match):
        Layout((3, 4)).split(1, [2, 2]).backward(index)


@pytest.mark.parametrize("index, exc, match", [
    ([7], IndexError, r"index 7 is out of range for dimension 0 of guest shape \(3,\)"),
    ([1, 2], ValueError, r"index has 2 entries, guest shape \(3,\) has 1 dims"),
])
def test_guest_forward_out_of_range_index_is_refused(index, exc, match):
    with pytest.raises(exc, match=match):
        Layout((3, 4)).store_at((3,), 1).guest_forward(0, index)


def test_symbolic_indices_are_still_mapped():
    i, j = tirx.Var("i", "int32"), tirx.Var("j", "int32")
    out = Layout((3, 4)).split(1, [2, 2]).forward([i, j])
    assert len(out) == 3 and out[0].same_as(i)


# 4. unpad(...).inverse() is refused unless lossy=True (it cannot restore what was cut).
def test_unpad_inverse_is_refused_without_lossy():
    with pytest.raises(ValueError, match=r"unpad\(dim=0, before=0, after=2\) discards 2 elements .*lossy=True"):
        Layout((12,)).unpad(0, 2).inverse()


def test_unpad_inverse_apply_is_refused_without_lossy():
    with pytest.raises(ValueError, match=r"inverse_apply cannot restore them"):
        Layout((12,)).unpad(0, 2).inverse_apply(np.arange(10))


def test_unpad_lossy_inverse_zero_fills():
    layout = Layout((12,)).unpad(0, (1, 2))
    inverse = layout.inverse(lossy=True)
    assert inverse == Layout((9,)).pad(0, (1, 2))
    expect = np.array([0, *range(1, 10), 0, 0])
    np.testing.assert_array_equal(inverse.apply(np.arange(1, 10)), expect)
    np.testing.assert_array_equal(layout.inverse_apply(np.arange(1, 10), lossy=True), expect)


def test_double_inverse_of_padded_layout_needs_lossy():
    layout = Layout((12,)).pad(0, 2)
    with pytest.raises(ValueError, match="lossy=True"):
        layout.inverse().inverse()
    assert layout.inverse().inverse(lossy=True) == layout


def test_gapped_unfold_has_no_inverse():
    with pytest.raises(ValueError, match=r"unfold\(dim=0, tile_size=2, stride=3\) has no inverse"):
        Layout((9,)).unfold(0, 2, 3).inverse()


# 5. split(1, 4) and from_json(None) raise clear errors, not bare TypeError/AttributeError.
def test_split_with_int_factor_says_what_to_write():
    with pytest.raises(TypeError, match=r"split: factors must be a sequence of ints, e\.g\. \[4\].*"
                                        r"got the int 4; for tiles of 4 on dimension 1 \(extent 8\) use \[2, 4\]"):
        Layout((2, 8)).split(1, 4)


@pytest.mark.parametrize("record, exc, match", [
    (None, TypeError, r"Layout.from_json: expected a dict .* got NoneType None"),
    (42, TypeError, r"got int 42"),
    ("not json", ValueError, r"Layout.from_json: not valid JSON"),
    ("[1, 2]", TypeError, r"got list \[1, 2\]"),
    ({"schema": 1}, ValueError, r"record lacks \['shape', 'primitives'\]"),
    ({"schema": 1, "shape": [2, 8], "primitives": "split"}, TypeError, r"'primitives' must be a list"),
    ({"schema": 1, "shape": [2, 8], "primitives": [None]}, TypeError, r"primitives\[0\]: .* must be a dict"),
    ({"schema": 1, "shape": [2, 8], "primitives": [{"kind": "split", "dim": 1}]}, ValueError,
     r"primitives\[0\]: layout primitive 'split' takes fields \['dim', 'factors'\]; unknown: \[\], "
     r"missing: \['factors'\]"),
    ({"schema": 1, "shape": [2, 8], "primitives": [{"kind": "split", "dim": 1, "factors": [2, 4], "x": 1}]},
     ValueError, r"unknown: \['x'\]"),
    ({"schema": 1, "shape": [2, 8], "primitives": [{"kind": "split", "dim": 1, "factors": [2.5, 4]}]},
     TypeError, r"primitives\[0\]: split: factors\[0\] must be an int, got 2\.5"),
    ({"schema": 1, "shape": [2.5, 8], "primitives": []}, TypeError, r"shape\[0\] must be an int, got 2\.5"),
    ({"schema": 1, "shape": [2], "primitives": [{"kind": ["split"]}]}, ValueError, r"unknown layout primitive"),
], ids=["none", "int", "bad-json", "json-list", "no-keys", "prims-str", "prim-none", "missing-field",
        "unknown-field", "float-factor", "float-shape", "unhashable-kind"])
def test_from_json_rejects_malformed_records(record, exc, match):
    with pytest.raises(exc, match=match):
        Layout.from_json(record)


def test_primitive_from_json_rejects_non_dict():
    with pytest.raises(TypeError, match=r"a layout primitive record must be a dict"):
        primitive_from_json(None)


# ------------------------------------------------------------------ further probes
PROBES = [
    # Layout construction
    ("shape-int", lambda: Layout(5), TypeError, r"shape must be a sequence of ints, e\.g\. .*got 5 of type int"),
    ("shape-none", lambda: Layout(None), TypeError, r"shape must be a sequence of ints"),
    ("shape-str", lambda: Layout("34"), TypeError, r"got '34' of type str"),
    ("shape-negative", lambda: Layout((2, -1)), ValueError, r"every extent must be positive"),
    ("fuse-overflow", lambda: Layout((2**40, 2**40)).fuse([0, 1]), ValueError, r"more than int64 indexing allows"),
    ("shape-huge", lambda: Layout((2**70,)), ValueError, r"more than int64"),
    ("pad-overflow", lambda: Layout((2,)).pad(0, 2**63), ValueError, r"more than int64"),
    ("prims-str", lambda: Layout((2, 3), ["split"]), TypeError, r"primitives\[0\] must be a layout Primitive"),
    ("prims-single", lambda: Layout((2, 3), Reorder((1, 0))), TypeError, r"primitives must be a sequence"),
    # split
    ("split-zero", lambda: Layout((2, 8)).split(1, [0, 8]), ValueError, r"factor 0 .* must be a positive int"),
    ("split-negative", lambda: Layout((2, 8)).split(1, [-2, -4]), ValueError, r"factor -2 .* positive int"),
    ("split-product", lambda: Layout((2, 8)).split(1, [3, 3]), ValueError, r"multiply to 9, not to dimension 1"),
    ("split-empty", lambda: Layout((2, 8)).split(1, []), ValueError, r"factors must not be empty"),
    ("split-str", lambda: Layout((2, 8)).split(1, "24"), TypeError, r"factors must be a sequence of ints"),
    ("split-neg-dim", lambda: Layout((2, 8)).split(-1, [2, 4]), ValueError, r"dim=-1 is out of range .*0\.\.1"),
    ("split-float-dim", lambda: Layout((2, 8)).split(1.0, [2, 4]), TypeError, r"dim must be an int, got 1\.0"),
    ("split-bool-dim", lambda: Layout((2, 8)).split(True, [2, 4]), TypeError, r"dim must be an int, got the bool"),
    ("Split-int", lambda: Split(0, 4), TypeError, r"factors must be a sequence of ints"),
    # reorder
    ("reorder-dup", lambda: Layout((2, 3, 4)).reorder([1, 0, 0]), ValueError, r"perm=\[1, 0, 0\] is not a perm"),
    ("reorder-short", lambda: Layout((2, 3, 4)).reorder([0, 1]), ValueError, r"not a permutation of 0\.\.2"),
    ("reorder-float", lambda: Layout((2, 3, 4)).reorder([1.7, 0, 2]), TypeError, r"perm\[0\] must be an int"),
    ("reorder-int", lambda: Layout((2, 3, 4)).reorder(5), TypeError, r"perm must be a sequence of ints"),
    ("reorder-str", lambda: Layout((2, 3, 4)).reorder("102"), TypeError, r"perm must be a sequence of ints"),
    ("reorder-set", lambda: Layout((2, 3, 4)).reorder({0, 1, 2}), TypeError, r"of type set"),
    ("Reorder-dup", lambda: Reorder((0, 0)), ValueError, r"perm=\[0, 0\] is not a permutation"),
    # fuse
    ("fuse-gap", lambda: Layout((2, 3, 4)).fuse([0, 2]), ValueError, r"consecutive and ascending, got \[0, 2\]"),
    ("fuse-range", lambda: Layout((2, 3, 4)).fuse([2, 3]), ValueError, r"dim=3 is out of range"),
    ("fuse-descending", lambda: Layout((2, 3, 4)).fuse([1, 0]), ValueError, r"consecutive and ascending"),
    ("fuse-empty", lambda: Layout((2, 3, 4)).fuse([]), ValueError, r"consecutive and ascending, got \[\]"),
    ("fuse-int", lambda: Layout((2, 3, 4)).fuse(1), TypeError, r"dims must be a sequence of ints"),
    ("fuse-float", lambda: Layout((2, 3, 4)).fuse([0.5, 1.5]), TypeError, r"dims\[0\] must be an int"),
    # pad / unpad
    ("pad-negative", lambda: Layout((2, 3)).pad(0, (1, -1)), ValueError, r"non-negative"),
    ("pad-float-pair", lambda: Layout((2, 3)).pad(0, (1.5, 2)), TypeError, r"before must be an int, got 1\.5"),
    ("pad-float", lambda: Layout((2, 3)).pad(0, 1.5), TypeError, r"amount must be an int .* got 1\.5"),
    ("pad-triple", lambda: Layout((2, 3)).pad(0, (1, 2, 3)), ValueError, r"with 3 entries"),
    ("pad-str", lambda: Layout((2, 3)).pad(0, "2"), TypeError, r"got '2' of type str"),
    ("pad-bool-pair", lambda: Layout((2, 3)).pad(0, (True, 1)), TypeError, r"before must be an int, got the bool"),
    ("pad-dim", lambda: Layout((2, 3)).pad(5, 1), ValueError, r"dim=5 is out of range"),
    ("Pad-negative", lambda: Layout((2, 3), [Pad(0, -1, 2)]), ValueError, r"before must be a non-negative int"),
    ("Pad-float", lambda: Layout((2, 3), [Pad(0, 1.5, 2)]), TypeError, r"before must be an int, got 1\.5"),
    ("unpad-float", lambda: Layout((2, 3)).unpad(1, (1.5, 0)), TypeError, r"before must be an int"),
    ("unpad-all", lambda: Layout((2, 3)).unpad(1, (2, 1)), ValueError, r"leaves nothing"),
    ("Unpad-negative", lambda: Layout((2, 3), [Unpad(1, -1, 0)]), ValueError, r"non-negative int, got -1"),
    # unfold / fold
    ("unfold-zero", lambda: Layout((10,)).unfold(0, 0, 1), ValueError, r"tile_size must be a positive int, got 0"),
    ("unfold-neg-stride", lambda: Layout((10,)).unfold(0, 3, -1), ValueError, r"stride must be a positive int"),
    ("unfold-float", lambda: Layout((10,)).unfold(0, 2.5, 1), TypeError, r"tile_size must be an int, got 2\.5"),
    ("unfold-bool", lambda: Layout((10,)).unfold(0, True, 1), TypeError, r"tile_size must be an int, got the bool"),
    ("unfold-big", lambda: Layout((10,)).unfold(0, 11, 1), ValueError, r"tile_size=11 is larger than dimension 0"),
    ("unfold-dim", lambda: Layout((10,)).unfold(5, 2, 1), ValueError, r"dim=5 is out of range"),
    ("fold-length", lambda: Layout((10,)).unfold(0, 3, 2).fold(0, 2, -3), ValueError, r"length must be a positive"),
    ("fold-float", lambda: Layout((10,)).unfold(0, 3, 2).fold(0, 2, 10.0), TypeError, r"length must be an int"),
    ("fold-stride", lambda: Layout((10,)).unfold(0, 3, 2).fold(0, 2.0, 10), TypeError, r"fold: stride must be an int"),
    ("fold-last-dim", lambda: Layout((10,)).unfold(0, 3, 2).fold(1, 2, 10), ValueError, r"needs a tile dimension"),
    ("Fold-tile", lambda: Fold(0, 2, 9, 2.5), TypeError, r"fold: tile_size must be an int"),
    # store_at / guests
    ("store-float", lambda: Layout((3, 4)).store_at((2.5,), 1), TypeError, r"guest shape\[0\] must be an int"),
    ("store-int", lambda: Layout((3, 4)).store_at(3, 1), TypeError, r"guest must be a te\.Tensor or a shape"),
    ("store-none", lambda: Layout((3, 4)).store_at(None, 1), TypeError, r"guest must be a te\.Tensor or a shape"),
    ("StoreAt-float", lambda: StoreAt(1, (2.5,)), TypeError, r"guest_shape\[0\] must be an int"),
    ("apply-guests-none", lambda: Layout((3, 4)).store_at((3,), 1).apply(np.zeros((3, 4)), guests=None),
     TypeError, r"guests must be a list of arrays"),
    ("extract-shape", lambda: Layout((3, 4)).store_at((3,), 1).extract_guest(np.zeros((3, 4))), ValueError,
     r"extract_guest: array has shape \(3, 4\), layout shape is \(3, 5\)"),
    ("guest-bool", lambda: Layout((3, 4)).store_at((3,), 1).guest_forward(True, [1]), TypeError,
     r"guest must be a position \(int\)"),
    # dim_names
    ("names-none", lambda: Layout((3, 4)).dim_names(None), TypeError, r"names must be a sequence of str"),
    ("names-int", lambda: Layout((3, 4)).dim_names([1, 2]), TypeError, r"names must be str, got 1"),
    # templates
    ("tpl-float-tile", lambda: conv_output_tiled((1, 16, 8, 8), spatial_tiles=[4.0, 4], channel_tile=8),
     TypeError, r"spatial_tiles\[0\] must be an int, got 4\.0"),
    ("tpl-float-channel", lambda: conv_output_tiled((1, 16, 8, 8), spatial_tiles=[4, 4], channel_tile=8.5),
     TypeError, r"tile size for dimension 1 must be an int, got 8\.5"),
    ("tpl-int-tiles", lambda: conv_output_tiled((1, 16, 8, 8), spatial_tiles=4, channel_tile=8),
     TypeError, r"spatial_tiles must be a sequence of ints"),
    ("tpl-rank", lambda: conv_output_tiled((16,), spatial_tiles=[], channel_tile=8),
     ValueError, r"needs a rank >= 2 shape \(N O S\.\.\.\), got \(16,\)"),
    ("tpl-zero-stride", lambda: conv_input_unfolded((1, 16, 10, 10), spatial_tiles=[4, 4], channel_tile=8,
                                                    kernel=[3, 3], strides=[0, 1]),
     ValueError, r"strides: entry 0 in \[0, 1\] must be a positive int"),
    ("tpl-zero-kernel", lambda: conv_input_unfolded((1, 16, 10, 10), spatial_tiles=[4, 4], channel_tile=8,
                                                    kernel=[0, 3]),
     ValueError, r"kernel: entry 0 .* must be a positive int"),
    ("tpl-zero-dilation", lambda: conv_input_unfolded((1, 16, 10, 10), spatial_tiles=[4, 4], channel_tile=8,
                                                      kernel=[3, 3], dilation=[0, 1]),
     ValueError, r"dilation: entry 0 .* must be a positive int"),
    ("tpl-float-kernel", lambda: conv_input_unfolded((1, 16, 10, 10), spatial_tiles=[4, 4], channel_tile=8,
                                                     kernel=[3.0, 3]),
     TypeError, r"kernel\[0\] must be an int, got 3\.0"),
    ("tpl-weight-float", lambda: conv_weight_tiled((16, 8, 3, 3), out_tile=4.0, in_tile=2),
     TypeError, r"tile size for dimension 0 must be an int"),
    ("tpl-weight-rank", lambda: conv_weight_tiled((16,), out_tile=4, in_tile=2), ValueError, r"rank >= 2"),
    ("tpl-matrix-float", lambda: matrix_tiled((8, 8), tiles=[4, 2.0]), TypeError, r"tiles\[1\] must be an int"),
    ("tpl-matrix-int", lambda: matrix_tiled((8, 8), tiles=4), TypeError, r"tiles must be a sequence of ints"),
    ("tpl-channels-last-rank", lambda: channels_last((5,)), ValueError, r"channels_last: needs a rank >= 2"),
    ("tpl-two-level-zero", lambda: conv_output_two_level((1, 16, 8, 8), spatial_tiles=[2, 2], channel_tile=4,
                                                         outer_spatial_tiles=[0, 2], outer_channel_tile=2),
     ValueError, r"outer_spatial_tiles: entry 0 .* must be a positive int"),
]


@pytest.mark.parametrize("build, exc, match", [p[1:] for p in PROBES], ids=[p[0] for p in PROBES])
def test_hostile_probe_is_refused_clearly(build, exc, match):
    with pytest.raises(exc, match=match):
        build()


# -------------------------------------------------------------------- valid input works
def test_numpy_integers_are_accepted_and_normalised():
    i64, i32 = np.int64, np.int32
    layout = (Layout((i64(4), i32(6))).split(i64(1), np.array([2, 3])).reorder(np.array([2, 0, 1]))
              .pad(i64(1), (i64(1), i32(0))).fuse([i64(1), i64(2)]))
    plain = Layout((4, 6)).split(1, [2, 3]).reorder([2, 0, 1]).pad(1, (1, 0)).fuse([1, 2])
    assert layout == plain and hash(layout) == hash(plain)
    assert all(type(s) is int for s in layout.shape)
    # NumPy ints must not leak into to_json, where they would break json.dumps.
    assert Layout.from_json(json.dumps(layout.to_json())) == plain
    x = _data((4, 6))
    np.testing.assert_array_equal(layout.inverse_apply(layout.apply(x)), x)


def test_numpy_int_unfold_serialises():
    layout = Layout((4, 6)).unfold(np.int64(0), np.int64(2), np.int64(1)).pad(np.int64(1), np.int64(2))
    assert json.loads(json.dumps(layout.to_json()))["primitives"][0] == {
        "kind": "unfold", "dim": 0, "tile_size": 2, "stride": 1}


def test_tvm_shapes_are_accepted():
    weight, bias = te.placeholder((3, 4), name="w"), te.placeholder((3,), name="b")
    layout = Layout(weight.shape).store_at(bias, 1)
    assert layout.orig_shape == (3, 4) and layout.shape == (3, 5)


def test_forward_and_backward_agree_with_apply_for_valid_indices():
    layout = Layout((1, 16, 10, 10)).pad(2, (1, 1)).unfold(2, 6, 4).split(1, [2, 8]).reorder([0, 3, 1, 4, 5, 2])
    x = _data(layout.orig_shape)
    packed = layout.apply(x)
    index = list(np.indices(layout.orig_shape))
    np.testing.assert_array_equal(packed[tuple(layout.forward(index))], x)
    for point in [(0, 0, 0, 0), (0, 15, 9, 9), (0, np.int64(7), 4, 2)]:
        assert packed[tuple(layout.forward(point))] == x[tuple(int(p) for p in point)]
    back = layout.backward([0, 1, 1, 0, 3, 7])
    assert all(isinstance(b, int) for b in back)


def test_store_at_decouple_at_round_trip():
    weight, bias = _data((3, 4)), np.array([100, 200, 300])
    layout = Layout((3, 4)).store_at((3,), 1).reorder([1, 0])
    packed = layout.apply(weight, guests=[bias])
    np.testing.assert_array_equal(layout.extract_guest(packed), bias)
    # The slot moved to dim 0 with the reorder; decouple_at follows it.
    detached = layout.decouple_at(0)
    np.testing.assert_array_equal(detached.apply(weight, guests=[bias]), weight.T)
    # Two guests come off in LIFO order.
    two = Layout((3, 4)).store_at((3,), 1).store_at((5,), 0)
    assert two.decouple_at(0).decouple_at(1).shape == (3, 4)
    # A slot a tensor arrived with is detached with an explicit DecoupleAt.
    np.testing.assert_array_equal(Layout((3, 5), [DecoupleAt(1)]).apply(packed.T), weight)


def test_inverse_of_store_at_layout_still_detaches():
    layout = Layout((3, 4)).store_at((3,), 1).split(0, [3, 1])
    packed = layout.apply(_data((3, 4)), guests=[np.zeros(3, dtype=np.int64)])
    np.testing.assert_array_equal(layout.inverse().apply(packed), _data((3, 4)))


def test_valid_templates_still_round_trip():
    shape = (1, 8, 6, 6)
    x = _data(shape)
    for layout in (conv_output_tiled(shape, spatial_tiles=[4, np.int64(3)], channel_tile=np.int64(4)),
                   conv_input_unfolded(shape, spatial_tiles=[2, 2], channel_tile=4, kernel=[3, 3], strides=[],
                                       dilation=None),
                   matrix_tiled((6, 8), tiles=[4, 3])):
        data = x if layout.orig_shape == shape else _data(layout.orig_shape)
        np.testing.assert_array_equal(layout.inverse_apply(layout.apply(data)), data)
