"""A model call's inputs and outputs: aligned arrays read in place, others copied, outputs
copied out, so no call can change what an earlier one returned."""

import numpy as np
import pytest
import torch
from torch import nn

from alt_tvm.deploy.model import ALIGNMENT, aligned
from alt_tvm.graph.build import build


class _Viewed(nn.Module):
    """Its output is a reshape of its input: the VM returns a view of the input tensor."""

    def forward(self, x):
        return x.reshape(1, 3 * 8 * 8)


class _Scaled(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def _misaligned(array):
    """A C-ordered copy of ``array`` whose data is 16 bytes off an ALIGNMENT boundary."""
    buffer = np.empty(array.nbytes + 2 * ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % ALIGNMENT + 16
    out = buffer[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def _pointer(tensor):
    return np.from_dlpack(tensor).ctypes.data


def test_aligned_copies_only_what_is_not_aligned():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    off = _misaligned(x)
    assert off.ctypes.data % ALIGNMENT == 16
    fixed = aligned(off)
    assert fixed.ctypes.data % ALIGNMENT == 0 and fixed.flags.c_contiguous
    np.testing.assert_array_equal(fixed, x)
    assert aligned(fixed) is fixed
    transposed = aligned(np.ascontiguousarray(x).transpose(2, 1, 0))  # not C-ordered: copied C-ordered
    assert transposed.flags.c_contiguous and transposed.ctypes.data % ALIGNMENT == 0
    np.testing.assert_array_equal(transposed, x.transpose(2, 1, 0))


def test_an_aligned_input_is_read_in_place_and_another_is_copied():
    torch.manual_seed(0)
    module = _Scaled().eval()
    x = torch.randn(1, 3, 8, 8)
    built = build(module, example_inputs=[x])
    want = module(x).numpy()
    inplace, off = aligned(x.numpy()), _misaligned(x.numpy())
    (tensor,) = built._to_device([inplace])
    assert _pointer(tensor) == inplace.ctypes.data  # no copy
    (copied,) = built._to_device([off])
    assert _pointer(copied) != off.ctypes.data and _pointer(copied) % ALIGNMENT == 0
    for arrays in ([inplace], [off], [inplace]):
        np.testing.assert_allclose(built(*arrays)[0], want, rtol=1e-6)
    readonly = x.numpy().copy()
    readonly.flags.writeable = False  # DLPack cannot mark it read-only: copied
    np.testing.assert_allclose(built(readonly)[0], want, rtol=1e-6)


@pytest.mark.parametrize("place", ["in place", "copied"])
def test_a_later_call_does_not_change_an_earlier_output(place):
    """The output is a view of the input inside the VM: it is copied out, so the caller may
    reuse its input array."""
    module = _Viewed().eval()
    x = torch.randn(1, 3, 8, 8)
    built = build(module, example_inputs=[x])
    prepare = aligned if place == "in place" else _misaligned
    first_input = prepare(np.ones((1, 3, 8, 8), np.float32))
    first = built(first_input)[0]
    first_input[...] = 5.0
    built(prepare(np.full((1, 3, 8, 8), 7.0, np.float32)))
    np.testing.assert_array_equal(first, np.ones((1, 192), np.float32))


def test_seeded_inputs_are_one_rule_for_model_calls_and_in_model_timing():
    from alt_tvm.deploy.model import seeded_inputs
    from alt_tvm.in_model import model_inputs

    shapes, dtypes = [(2, 5), (64,), (3,)], ["float32", "int64", "bool"]
    first = seeded_inputs(shapes=shapes, dtypes=dtypes, seed=3)
    again = seeded_inputs(shapes=shapes, dtypes=dtypes, seed=3)
    other = seeded_inputs(shapes=shapes, dtypes=dtypes, seed=4)
    for a, b, shape, dtype in zip(first, again, shapes, dtypes):
        np.testing.assert_array_equal(a, b)
        assert a.shape == shape and a.dtype == np.dtype(dtype) and a.ctypes.data % ALIGNMENT == 0
    assert not np.array_equal(first[0], other[0])
    assert set(np.unique(first[1])) == {0, 1}  # valid token ids and indices for any table of two or more

    built = build(_Scaled().eval(), example_inputs=[torch.randn(1, 3, 8, 8)])
    for a, b in zip(built.random_inputs(seed=7), model_inputs(built, seed=7)):
        np.testing.assert_array_equal(a, b)
