"""Layout primitives (ALT paper §4.1): one small class per primitive.

Every primitive maps a tensor shape to a new shape and carries three views of the
same transformation:

* ``forward``: an element's index in the input shape -> its index in the new shape;
* ``backward``: an index in the new shape -> the input index it stores;
* ``apply`` / ``inverse_apply``: the data movement in NumPy.

Index maps work on ints, NumPy integer arrays and TIR expressions alike, so one
definition serves constant packing, tests and the TE rewrite pass.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .index import Index, index_min, product

Shape = tuple[int, ...]


def _is_int_imm(value: Any) -> bool:
    """True for a TVM integer constant (``IntImm`` of an int/uint dtype)."""
    if type(value).__name__ != "IntImm" or not hasattr(value, "value"):
        return False
    return str(getattr(value, "ty", "")).startswith(("int", "uint"))


def _as_int(value: Any, what: str) -> int:
    """``value`` as a Python int; ``TypeError`` unless it is an integer.

    Python and NumPy integers (also 0-d integer arrays) and TVM ``IntImm`` constants
    are accepted. Bools, floats (even integral ones such as ``2.0``), strings and
    symbolic expressions are refused rather than truncated.
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an int, got the bool {value!r}")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
        return int(value)
    if _is_int_imm(value):
        return int(value.value)
    raise TypeError(f"{what} must be an int, got {value!r} of type {type(value).__name__}")


def _int_tuple(values: Any, what: str, example: str) -> tuple[int, ...]:
    """``values`` (a sequence of integers) as a tuple of Python ints, else ``TypeError``."""
    ordered = not isinstance(values, (str, bytes, Mapping, Set)) and isinstance(values, Iterable)
    if not ordered or (isinstance(values, np.ndarray) and values.ndim != 1):
        raise TypeError(f"{what} must be a sequence of ints, e.g. {example}, "
                        f"got {values!r} of type {type(values).__name__}")
    values = tuple(values)
    return tuple(_as_int(v, f"{what}[{k}]") for k, v in enumerate(values))


def _check_dim(dim: int, shape: Shape, what: str) -> None:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{what}: dim must be an int, got {dim!r} of type {type(dim).__name__}")
    if not 0 <= dim < len(shape):
        raise ValueError(f"{what}: dim={dim} is out of range for a {len(shape)}-d shape {shape}; "
                         f"allowed 0..{len(shape) - 1}")


def _positive_int(value: Any, what: str) -> int:
    value = _as_int(value, what)
    if value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


def _non_negative_int(value: Any, what: str) -> int:
    value = _as_int(value, what)
    if value < 0:
        raise ValueError(f"{what} must be a non-negative int, got {value!r}")
    return value


def _set(prim: Any, name: str, value: Any) -> None:
    object.__setattr__(prim, name, value)


def _init_dim(prim: Any) -> None:
    _set(prim, "dim", _as_int(prim.dim, f"{prim.kind}: dim"))


class Primitive(abc.ABC):
    """A layout primitive applied to a tensor whose current shape is ``shape``."""

    kind: ClassVar[str]
    #: True for the one-to-one primitives of the paper's Table 1 (split, reorder, fuse).
    basic: ClassVar[bool] = False

    @abc.abstractmethod
    def out_shape(self, shape: Shape) -> Shape:
        """The new shape; raises ``ValueError`` when the primitive does not fit ``shape``."""

    @abc.abstractmethod
    def forward(self, index: list[Index], shape: Shape, context: Any = None) -> list[Index]:
        """Map an index in ``shape`` to the index in ``out_shape(shape)``."""

    @abc.abstractmethod
    def backward(self, index: list[Index], shape: Shape) -> list[Index]:
        """Map an index in ``out_shape(shape)`` back to the index in ``shape``."""

    @abc.abstractmethod
    def apply(self, array: np.ndarray) -> np.ndarray:
        """Move data of shape ``shape`` into the new layout."""

    @abc.abstractmethod
    def inverse_apply(self, array: np.ndarray, shape: Shape) -> np.ndarray:
        """Move data in the new layout back to ``shape``."""

    @abc.abstractmethod
    def inverse(self, shape: Shape) -> Primitive:
        """The primitive that undoes this one (applied to ``out_shape(shape)``)."""

    def expands_data(self, shape: Shape) -> bool:
        """True when the new layout stores more elements than ``shape`` (pad, overlap)."""
        return product(self.out_shape(shape)) != product(shape)

    def to_json(self) -> dict[str, Any]:
        fields = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}
        return {"kind": self.kind, **fields}


@dataclass(frozen=True)
class Split(Primitive):
    """Split dimension ``dim`` into ``factors`` (outermost first); their product must equal it."""

    dim: int
    factors: tuple[int, ...]
    kind: ClassVar[str] = "split"
    basic: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _init_dim(self)
        factors = _int_tuple(self.factors, "split: factors", "[4] or [2, 4] (outer to inner)")
        _set(self, "factors", factors)
        if len(factors) < 1:
            raise ValueError("split: factors must not be empty; give at least one factor, e.g. [2, 4]")
        for f in factors:
            _positive_int(f, f"split: factor {f!r} in factors={list(factors)}")

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim(self.dim, shape, "split")
        if product(self.factors) != shape[self.dim]:
            raise ValueError(
                f"split: factors {list(self.factors)} multiply to {product(self.factors)}, "
                f"not to dimension {self.dim} of extent {shape[self.dim]} (pad the dimension first "
                f"if the tile does not divide it)")
        return shape[: self.dim] + self.factors + shape[self.dim + 1:]

    def forward(self, index, shape, context=None):
        x = index[self.dim]
        parts = []
        for k in range(len(self.factors)):
            inner = product(self.factors[k + 1:])
            part = x // inner if inner > 1 else x
            if k > 0:
                part = part % self.factors[k]
            parts.append(part)
        return list(index[: self.dim]) + parts + list(index[self.dim + 1:])

    def backward(self, index, shape):
        m = len(self.factors)
        parts = index[self.dim: self.dim + m]
        x = parts[0]
        for f, p in zip(self.factors[1:], parts[1:]):
            x = x * f + p
        return list(index[: self.dim]) + [x] + list(index[self.dim + m:])

    def apply(self, array):
        return array.reshape(self.out_shape(array.shape))

    def inverse_apply(self, array, shape):
        return array.reshape(shape)

    def inverse(self, shape):
        return Fuse(tuple(range(self.dim, self.dim + len(self.factors))))


@dataclass(frozen=True)
class Fuse(Primitive):
    """Fuse the consecutive dimensions ``dims`` into one (row-major)."""

    dims: tuple[int, ...]
    kind: ClassVar[str] = "fuse"
    basic: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _set(self, "dims", _int_tuple(self.dims, "fuse: dims", "[1, 2]"))
        d = self.dims
        if len(d) < 1 or any(b != a + 1 for a, b in zip(d, d[1:])):
            raise ValueError(f"fuse: dims must be consecutive and ascending, got {list(d)}")

    def out_shape(self, shape: Shape) -> Shape:
        for d in self.dims:
            _check_dim(d, shape, "fuse")
        lo, hi = self.dims[0], self.dims[-1] + 1
        return shape[:lo] + (product(shape[lo:hi]),) + shape[hi:]

    def forward(self, index, shape, context=None):
        lo, hi = self.dims[0], self.dims[-1] + 1
        x = index[lo]
        for k in range(lo + 1, hi):
            x = x * shape[k] + index[k]
        return list(index[:lo]) + [x] + list(index[hi:])

    def backward(self, index, shape):
        lo, hi = self.dims[0], self.dims[-1] + 1
        return Split(lo, tuple(shape[lo:hi])).forward(index, self.out_shape(shape))

    def apply(self, array):
        return array.reshape(self.out_shape(array.shape))

    def inverse_apply(self, array, shape):
        return array.reshape(shape)

    def inverse(self, shape):
        lo, hi = self.dims[0], self.dims[-1] + 1
        return Split(lo, tuple(shape[lo:hi]))


@dataclass(frozen=True)
class Reorder(Primitive):
    """Permute dimensions: new dimension ``k`` is old dimension ``perm[k]`` (0-based)."""

    perm: tuple[int, ...]
    kind: ClassVar[str] = "reorder"
    basic: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _set(self, "perm", _int_tuple(self.perm, "reorder: perm", "[0, 2, 1]"))
        if sorted(self.perm) != list(range(len(self.perm))):
            raise ValueError(f"reorder: perm={list(self.perm)} is not a permutation of "
                             f"0..{len(self.perm) - 1} (each dim exactly once)")

    def out_shape(self, shape: Shape) -> Shape:
        if sorted(self.perm) != list(range(len(shape))):
            raise ValueError(f"reorder: perm={list(self.perm)} is not a permutation of "
                             f"0..{len(shape) - 1} for shape {shape}")
        return tuple(shape[p] for p in self.perm)

    def forward(self, index, shape, context=None):
        return [index[p] for p in self.perm]

    def backward(self, index, shape):
        out = [None] * len(self.perm)
        for k, p in enumerate(self.perm):
            out[p] = index[k]
        return out

    def apply(self, array):
        self.out_shape(array.shape)
        return np.ascontiguousarray(np.transpose(array, self.perm))

    def inverse_apply(self, array, shape):
        return np.ascontiguousarray(np.transpose(array, np.argsort(self.perm)))

    def inverse(self, shape):
        return Reorder(tuple(int(i) for i in np.argsort(self.perm)))


@dataclass(frozen=True)
class Unfold(Primitive):
    """Overlapped tiling: dimension ``dim`` of extent D becomes (T, tile_size).

    Tile ``t`` holds elements ``t*stride .. t*stride + tile_size - 1`` with
    ``T = ceil((D - tile_size) / stride) + 1``; elements past D in the last tile are zero.
    A sliding-window access ``V*i + r`` (window M) is rewritten with the paper's
    equation (1): tile ``i // P`` and offset ``V*(i % P) + r`` where ``P = stride / V``.
    """

    dim: int
    tile_size: int
    stride: int
    kind: ClassVar[str] = "unfold"

    def __post_init__(self) -> None:
        _init_dim(self)
        _set(self, "tile_size", _positive_int(self.tile_size, "unfold: tile_size"))
        _set(self, "stride", _positive_int(self.stride, "unfold: stride"))

    def num_tiles(self, extent: int) -> int:
        return -(-(extent - self.tile_size) // self.stride) + 1

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim(self.dim, shape, "unfold")
        d = shape[self.dim]
        if self.tile_size > d:
            raise ValueError(f"unfold: tile_size={self.tile_size} is larger than dimension "
                             f"{self.dim} of extent {d}")
        return shape[: self.dim] + (self.num_tiles(d), self.tile_size) + shape[self.dim + 1:]

    @property
    def covers(self) -> bool:
        """Every element lies in some tile (no gaps between tiles)."""
        return self.tile_size >= self.stride

    def forward(self, index, shape, context=None):
        x = index[self.dim]
        mapped = None
        if context is not None:
            mapped = context.sliding_window(x, self, shape[self.dim])
        if mapped is None:
            if not self.covers:
                raise ValueError(
                    f"unfold(dim={self.dim}, tile_size={self.tile_size}, stride={self.stride}) "
                    f"leaves gaps between tiles, so only sliding-window accesses "
                    f"stride*i + r can be mapped into it")
            if self.tile_size == self.stride and shape[self.dim] % self.stride == 0:
                mapped = (x // self.stride, x % self.stride)  # tiles that partition the dim: a split
            else:
                tile = index_min(x // self.stride, self.num_tiles(shape[self.dim]) - 1)
                mapped = (tile, x - tile * self.stride)
        return list(index[: self.dim]) + list(mapped) + list(index[self.dim + 1:])

    def backward(self, index, shape):
        t, o = index[self.dim], index[self.dim + 1]
        return list(index[: self.dim]) + [t * self.stride + o] + list(index[self.dim + 2:])

    def apply(self, array):
        shape = self.out_shape(array.shape)
        n_tiles, d = shape[self.dim], array.shape[self.dim]
        pos = np.arange(n_tiles)[:, None] * self.stride + np.arange(self.tile_size)[None, :]
        out = np.take(array, np.minimum(pos, d - 1), axis=self.dim)
        valid = (pos < d).reshape((1,) * self.dim + pos.shape + (1,) * (array.ndim - self.dim - 1))
        return np.where(valid, out, np.zeros((), array.dtype))

    def inverse_apply(self, array, shape):
        if not self.covers:
            raise ValueError(f"fold: unfold with tile_size={self.tile_size} < stride={self.stride} "
                             f"dropped elements and cannot be inverted")
        d = shape[self.dim]
        x = np.arange(d)
        tile = np.minimum(x // self.stride, self.num_tiles(d) - 1)
        return np.ascontiguousarray(array[(slice(None),) * self.dim + (tile, x - tile * self.stride)])

    def inverse(self, shape):
        if not self.covers:
            raise ValueError(f"unfold(dim={self.dim}, tile_size={self.tile_size}, stride={self.stride}) "
                             f"has no inverse: tile_size < stride leaves gaps whose elements are not "
                             f"stored anywhere")
        return Fold(self.dim, self.stride, shape[self.dim], self.tile_size)


@dataclass(frozen=True)
class Fold(Primitive):
    """Inverse of :class:`Unfold`: merge (tiles, tile_size) at ``dim`` back into ``length``."""

    dim: int
    stride: int
    length: int
    tile_size: int | None = None
    kind: ClassVar[str] = "fold"

    def __post_init__(self) -> None:
        _init_dim(self)
        _set(self, "stride", _positive_int(self.stride, "fold: stride"))
        _set(self, "length", _positive_int(self.length, "fold: length"))
        if self.tile_size is not None:
            _set(self, "tile_size", _positive_int(self.tile_size, "fold: tile_size"))

    def _unfold(self, shape: Shape) -> Unfold:
        _check_dim(self.dim, shape, "fold")
        if self.dim + 1 >= len(shape):
            raise ValueError(f"fold: dim={self.dim} needs a tile dimension after it in shape {shape}")
        tile = self.tile_size if self.tile_size is not None else shape[self.dim + 1]
        unfold = Unfold(self.dim, tile, self.stride)
        expect = unfold.out_shape(shape[: self.dim] + (self.length,) + shape[self.dim + 2:])
        if expect != tuple(shape):
            raise ValueError(f"fold(dim={self.dim}, stride={self.stride}, length={self.length}) "
                             f"expects shape {expect}, got {tuple(shape)}")
        return unfold

    def out_shape(self, shape: Shape) -> Shape:
        self._unfold(shape)
        return shape[: self.dim] + (self.length,) + shape[self.dim + 2:]

    def forward(self, index, shape, context=None):
        return self._unfold(shape).backward(index, self.out_shape(shape))

    def backward(self, index, shape):
        return self._unfold(shape).forward(index, self.out_shape(shape))

    def apply(self, array):
        return self._unfold(array.shape).inverse_apply(array, self.out_shape(array.shape))

    def inverse_apply(self, array, shape):
        return self._unfold(shape).apply(array)

    def inverse(self, shape):
        return self._unfold(shape)

    def expands_data(self, shape: Shape) -> bool:
        return False


def _pad_amount(amount: int | tuple[int, int], what: str) -> tuple[int, int]:
    """``(before, after)`` from an int (appended) or a pair; refuses floats and negatives."""
    allowed = "an int (appended at the end) or a pair (before, after) of ints"
    if isinstance(amount, (int, np.integer)) and not isinstance(amount, (bool, np.bool_)):
        pair = (0, amount)
    elif isinstance(amount, (tuple, list, np.ndarray)) and np.ndim(amount) == 1:
        if len(amount) != 2:
            raise ValueError(f"{what}: amount must be {allowed}, got {amount!r} with {len(amount)} entries")
        pair = tuple(amount)
    else:
        raise TypeError(f"{what}: amount must be {allowed}, got {amount!r} of type {type(amount).__name__}")
    before, after = (_as_int(a, f"{what}: amount {amount!r}: {name}") for a, name in zip(pair, ("before", "after")))
    if before < 0 or after < 0:
        raise ValueError(f"{what}: amount must be non-negative, got {amount!r}")
    return before, after


def _init_pad(prim: Any) -> None:
    _init_dim(prim)
    _set(prim, "before", _non_negative_int(prim.before, f"{prim.kind}: before"))
    _set(prim, "after", _non_negative_int(prim.after, f"{prim.kind}: after"))


@dataclass(frozen=True)
class Pad(Primitive):
    """Append zeros to dimension ``dim``: ``before`` at the start, ``after`` at the end."""

    dim: int
    before: int
    after: int
    kind: ClassVar[str] = "pad"

    def __post_init__(self) -> None:
        _init_pad(self)

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim(self.dim, shape, "pad")
        return shape[: self.dim] + (shape[self.dim] + self.before + self.after,) + shape[self.dim + 1:]

    def forward(self, index, shape, context=None):
        out = list(index)
        if self.before:
            out[self.dim] = out[self.dim] + self.before
        return out

    def backward(self, index, shape):
        out = list(index)
        if self.before:
            out[self.dim] = out[self.dim] - self.before
        return out

    def apply(self, array):
        self.out_shape(array.shape)
        widths = [(0, 0)] * array.ndim
        widths[self.dim] = (self.before, self.after)
        return np.pad(array, widths)

    def inverse_apply(self, array, shape):
        sl = [slice(None)] * array.ndim
        sl[self.dim] = slice(self.before, self.before + shape[self.dim])
        return np.ascontiguousarray(array[tuple(sl)])

    def inverse(self, shape):
        return Unpad(self.dim, self.before, self.after)


@dataclass(frozen=True)
class Unpad(Primitive):
    """Inverse of :class:`Pad`: drop ``before`` and ``after`` elements of dimension ``dim``.

    Unpad discards data, so it has no exact inverse. :meth:`inverse` and
    :meth:`inverse_apply` raise ``ValueError`` unless called with ``lossy=True``, which
    gives the zero-filling :class:`Pad` (exact only when the dropped elements were padding).
    """

    dim: int
    before: int
    after: int
    kind: ClassVar[str] = "unpad"

    def __post_init__(self) -> None:
        _init_pad(self)

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim(self.dim, shape, "unpad")
        left = shape[self.dim] - self.before - self.after
        if left < 1:
            raise ValueError(f"unpad: removing {self.before}+{self.after} from dimension {self.dim} "
                             f"of extent {shape[self.dim]} leaves nothing")
        return shape[: self.dim] + (left,) + shape[self.dim + 1:]

    def _pad(self) -> Pad:
        return Pad(self.dim, self.before, self.after)

    def forward(self, index, shape, context=None):
        return self._pad().backward(index, self.out_shape(shape))

    def backward(self, index, shape):
        return self._pad().forward(index, self.out_shape(shape))

    def apply(self, array):
        return self._pad().inverse_apply(array, self.out_shape(array.shape))

    def _lossy_error(self, shape: Shape, what: str) -> ValueError:
        return ValueError(
            f"unpad(dim={self.dim}, before={self.before}, after={self.after}) discards "
            f"{self.before + self.after} elements of dimension {self.dim} (extent {shape[self.dim]}), "
            f"so {what} cannot restore them; pass lossy=True to zero-fill them with "
            f"pad({self.dim}, ({self.before}, {self.after})) (exact only if they were padding)")

    def inverse_apply(self, array, shape, *, lossy: bool = False):
        if not lossy and (self.before or self.after):
            raise self._lossy_error(shape, "inverse_apply")
        return self._pad().apply(array)

    def inverse(self, shape, *, lossy: bool = False):
        if not lossy and (self.before or self.after):
            raise self._lossy_error(shape, "inverse")
        return self._pad()

    def expands_data(self, shape: Shape) -> bool:
        return False


@dataclass(frozen=True)
class StoreAt(Primitive):
    """Attach a guest tensor to this (host) tensor at the end of dimension ``dim``.

    The guest's shape is the host's current shape without ``dim`` (the paper's example:
    a bias vector of length O stored as an extra column of the O x I weight matrix).
    Host elements keep their indices; guest element ``g`` lands at ``g`` with the
    host's old extent inserted at position ``dim``.
    """

    dim: int
    guest_shape: tuple[int, ...]
    key: Any = None
    kind: ClassVar[str] = "store_at"

    def __post_init__(self) -> None:
        _init_dim(self)
        _set(self, "guest_shape", _int_tuple(self.guest_shape, "store_at: guest_shape", "(64,)"))

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim(self.dim, shape, "store_at")
        expect = shape[: self.dim] + shape[self.dim + 1:]
        if self.guest_shape != expect:
            raise ValueError(f"store_at: a guest stored at dim {self.dim} of a host of shape {shape} "
                             f"must have shape {expect}, got {self.guest_shape}")
        return shape[: self.dim] + (shape[self.dim] + 1,) + shape[self.dim + 1:]

    def forward(self, index, shape, context=None):
        return list(index)

    def backward(self, index, shape):
        return list(index)

    def guest_forward(self, index: list[Index], shape: Shape) -> list[Index]:
        """Index of guest element ``index`` in the host's new layout."""
        return list(index[: self.dim]) + [shape[self.dim]] + list(index[self.dim:])

    def apply(self, array, guest: np.ndarray | None = None):
        self.out_shape(array.shape)
        if guest is None:
            raise ValueError("store_at: apply needs the guest array (pass guests=[...])")
        if tuple(guest.shape) != self.guest_shape:
            raise ValueError(f"store_at: guest array has shape {guest.shape}, expected {self.guest_shape}")
        return np.concatenate([array, np.expand_dims(guest.astype(array.dtype), self.dim)], axis=self.dim)

    def inverse_apply(self, array, shape):
        return DecoupleAt(self.dim).apply(array)

    def extract_guest(self, array: np.ndarray) -> np.ndarray:
        """The guest's data from a host array in this primitive's output layout."""
        return np.ascontiguousarray(np.take(array, array.shape[self.dim] - 1, axis=self.dim))

    def inverse(self, shape):
        return DecoupleAt(self.dim)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "dim": self.dim, "guest_shape": list(self.guest_shape),
                "key": self.key if isinstance(self.key, (str, int, type(None))) else repr(self.key)}


@dataclass(frozen=True)
class DecoupleAt(Primitive):
    """Inverse of :class:`StoreAt`: detach the last slot of dimension ``dim``."""

    dim: int
    kind: ClassVar[str] = "decouple_at"

    def __post_init__(self) -> None:
        _init_dim(self)

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim(self.dim, shape, "decouple_at")
        if shape[self.dim] < 2:
            raise ValueError(f"decouple_at: dimension {self.dim} of extent {shape[self.dim]} "
                             f"holds no attached tensor")
        return shape[: self.dim] + (shape[self.dim] - 1,) + shape[self.dim + 1:]

    def forward(self, index, shape, context=None):
        return list(index)

    def backward(self, index, shape):
        return list(index)

    def apply(self, array):
        sl = [slice(None)] * array.ndim
        sl[self.dim] = slice(0, array.shape[self.dim] - 1)
        return np.ascontiguousarray(array[tuple(sl)])

    def inverse_apply(self, array, shape):
        raise ValueError("decouple_at: the detached guest data is gone; re-attach it with store_at")

    def inverse(self, shape):
        host = shape[: self.dim] + (shape[self.dim] - 1,) + shape[self.dim + 1:]
        return StoreAt(self.dim, host[: self.dim] + host[self.dim + 1:])

    def expands_data(self, shape: Shape) -> bool:
        return False


PRIMITIVES: dict[str, type[Primitive]] = {
    cls.kind: cls for cls in (Split, Fuse, Reorder, Unfold, Fold, Pad, Unpad, StoreAt, DecoupleAt)
}


def primitive_from_json(record: Mapping[str, Any]) -> Primitive:
    """Rebuild a primitive from :meth:`Primitive.to_json` output.

    Raises
    ------
    TypeError
        ``record`` is not a mapping, or a field has the wrong type.
    ValueError
        Unknown ``kind``, unknown or missing fields, or invalid values.
    """
    if not isinstance(record, Mapping):
        raise TypeError(f"a layout primitive record must be a dict such as "
                        f"{{'kind': 'split', 'dim': 1, 'factors': [2, 4]}}, got {record!r}")
    record = dict(record)
    kind = record.pop("kind", None)
    if not isinstance(kind, str) or kind not in PRIMITIVES:
        raise ValueError(f"unknown layout primitive {kind!r}; known: {sorted(PRIMITIVES)}")
    cls = PRIMITIVES[kind]
    names = [f.name for f in dataclasses.fields(cls)]
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    unknown = sorted(set(record) - set(names))
    missing = [n for n in required if n not in record]
    if unknown or missing:
        raise ValueError(f"layout primitive {kind!r} takes fields {names}; "
                         f"unknown: {unknown}, missing: {missing} in {record!r}")
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    return cls(**fields)
