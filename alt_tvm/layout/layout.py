"""``Layout``: a tensor shape plus the sequence of layout primitives applied to it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from .index import Index
from .primitives import (
    DecoupleAt,
    Fold,
    Fuse,
    Pad,
    Primitive,
    Reorder,
    Shape,
    Split,
    StoreAt,
    Unfold,
    Unpad,
    _pad_amount,
    primitive_from_json,
)

SCHEMA_VERSION = 1


class Layout:
    """The layout of one tensor: its original shape and a sequence of primitives.

    Methods named after primitives return a new ``Layout`` (the object is immutable),
    so sequences chain::

        Layout((1, 64, 112, 112)).pad(2, 0).split(1, [4, 16]).reorder([0, 1, 3, 4, 2])

    Dimensions are 0-based and refer to the shape *at that point in the chain*.
    Invalid parameters raise ``ValueError`` immediately, naming the bad value.
    """

    __slots__ = ("_orig", "_steps", "_shapes")

    def __init__(self, shape: Sequence[int], primitives: Sequence[Primitive] = ()) -> None:
        orig = tuple(int(s) for s in shape)
        if any(s < 1 for s in orig):
            raise ValueError(f"Layout: every extent must be positive, got shape {orig}")
        shapes = [orig]
        for prim in primitives:
            shapes.append(tuple(prim.out_shape(shapes[-1])))
        self._orig = orig
        self._steps = tuple(primitives)
        self._shapes = tuple(shapes)

    # ----------------------------------------------------------------- queries
    @property
    def orig_shape(self) -> Shape:
        """Shape of the tensor in its canonical layout."""
        return self._orig

    @property
    def shape(self) -> Shape:
        """Shape of the tensor in this layout."""
        return self._shapes[-1]

    @property
    def primitives(self) -> tuple[Primitive, ...]:
        return self._steps

    @property
    def is_identity(self) -> bool:
        return not self._steps

    @property
    def expands_data(self) -> bool:
        """True if some primitive stores extra elements (pad, overlapping unfold, store_at).

        The paper's propagation rule never copies such sequences along element-wise paths.
        """
        return any(p.expands_data(s) for p, s in zip(self._steps, self._shapes))

    @property
    def is_bijective(self) -> bool:
        return not self.expands_data and not any(
            isinstance(p, (StoreAt, DecoupleAt, Unpad, Fold)) for p in self._steps)

    @property
    def guests(self) -> list[StoreAt]:
        """The ``store_at`` steps, in order (the tensors attached to this one)."""
        return [p for p in self._steps if isinstance(p, StoreAt)]

    # -------------------------------------------------------------- primitives
    def _then(self, prim: Primitive) -> Layout:
        return Layout(self._orig, self._steps + (prim,))

    def split(self, dim: int, factors: Sequence[int]) -> Layout:
        """Split ``dim`` into ``factors`` (outer to inner); their product must equal the extent."""
        return self._then(Split(dim, tuple(factors)))

    def reorder(self, perm: Sequence[int]) -> Layout:
        """Permute dimensions: new dimension ``k`` is the current dimension ``perm[k]``."""
        return self._then(Reorder(tuple(perm)))

    def fuse(self, dims: Sequence[int]) -> Layout:
        """Fuse consecutive dimensions ``dims`` into one."""
        return self._then(Fuse(tuple(dims)))

    def unfold(self, dim: int, tile_size: int, stride: int) -> Layout:
        """Overlapped tiling of ``dim`` into (tiles, ``tile_size``), tiles ``stride`` apart."""
        return self._then(Unfold(dim, tile_size, stride))

    def fold(self, dim: int, stride: int, length: int) -> Layout:
        """Undo an unfold: merge dims (``dim``, ``dim+1``) back into ``length`` elements."""
        return self._then(Fold(dim, stride, length))

    def pad(self, dim: int, amount: int | tuple[int, int]) -> Layout:
        """Pad ``dim`` with zeros: an int appends, ``(before, after)`` pads both ends."""
        before, after = _pad_amount(amount, "pad")
        return self._then(Pad(dim, before, after))

    def unpad(self, dim: int, amount: int | tuple[int, int]) -> Layout:
        """Remove padding from ``dim`` (the inverse of :meth:`pad`)."""
        before, after = _pad_amount(amount, "unpad")
        return self._then(Unpad(dim, before, after))

    def store_at(self, guest: Any, dim: int) -> Layout:
        """Attach ``guest`` (a ``te.Tensor``, or a shape) at the end of ``dim`` of this tensor.

        The guest's shape must be this tensor's current shape without ``dim``. A
        ``te.Tensor`` guest is recognised by the rewrite pass, which then reads it from
        this tensor's buffer.
        """
        if hasattr(guest, "op") and hasattr(guest, "shape"):
            shape, key = tuple(int(s) for s in guest.shape), guest
        else:
            shape, key = tuple(int(s) for s in guest), None
        return self._then(StoreAt(dim, shape, key))

    def decouple_at(self, dim: int) -> Layout:
        """Detach the tensor last attached at ``dim`` (the inverse of :meth:`store_at`)."""
        return self._then(DecoupleAt(dim))

    def dim_names(self, names: Sequence[str]) -> list[str]:
        """Names for this layout's dimensions, derived from the original ones (for readable TIR)."""
        names = list(names)
        if len(names) != len(self._orig):
            raise ValueError(f"dim_names: got {len(names)} names for a {len(self._orig)}-d shape")
        for prim in self._steps:
            names = _rename(prim, names)
        return names

    # -------------------------------------------------------------- index maps
    def forward(self, index: Sequence[Index], context: Any = None) -> list[Index]:
        """Map an index of the original shape to its index in this layout."""
        index = list(index)
        if len(index) != len(self._orig):
            raise ValueError(f"Layout.forward: index has {len(index)} entries, shape {self._orig} "
                             f"has {len(self._orig)} dims")
        for prim, shape in zip(self._steps, self._shapes):
            index = prim.forward(index, shape, context)
        return index

    def backward(self, index: Sequence[Index], *, checks: list | None = None) -> list[Index]:
        """Map an index of this layout to the original index it stores.

        Positions that hold padding map to indices outside some intermediate shape. When
        ``checks`` is a list, every ``(index, extent)`` pair that must satisfy
        ``0 <= index < extent`` for the position to hold a real element is appended to it.
        """
        index = list(index)
        if len(index) != len(self.shape):
            raise ValueError(f"Layout.backward: index has {len(index)} entries, layout shape "
                             f"{self.shape} has {len(self.shape)} dims")
        for prim, shape in zip(reversed(self._steps), reversed(self._shapes[:-1])):
            index = prim.backward(index, shape)
            if checks is not None:
                checks.extend(zip(index, shape))
        return index

    def guest_forward(self, guest: int | Any, index: Sequence[Index], context: Any = None) -> list[Index]:
        """Map an index of an attached tensor (by position or key) to its index here."""
        slots = [i for i, p in enumerate(self._steps) if isinstance(p, StoreAt)]
        pos = self._guest_position(guest, slots)
        step = slots[pos]
        index = self._steps[step].guest_forward(list(index), self._shapes[step])
        for prim, shape in zip(self._steps[step + 1:], self._shapes[step + 1:-1]):
            index = prim.forward(index, shape, context)
        return index

    def _guest_position(self, guest: int | Any, slots: list[int]) -> int:
        if isinstance(guest, int):
            if not 0 <= guest < len(slots):
                raise ValueError(f"guest {guest} out of range: this layout has {len(slots)} guests")
            return guest
        for pos, step in enumerate(slots):
            key = self._steps[step].key
            if key is not None and key.same_as(guest):
                return pos
        raise ValueError(f"{guest!r} is not attached to this layout with store_at")

    # ------------------------------------------------------------------ NumPy
    def apply(self, array: np.ndarray, *, guests: Sequence[np.ndarray] = ()) -> np.ndarray:
        """Move ``array`` (original shape) into this layout; ``guests`` feed ``store_at`` steps."""
        array = np.asarray(array)
        if tuple(array.shape) != self._orig:
            raise ValueError(f"Layout.apply: array has shape {array.shape}, layout expects {self._orig}")
        n_guests = len(self.guests)
        if len(guests) != n_guests:
            raise ValueError(f"Layout.apply: layout has {n_guests} store_at guests, got {len(guests)} arrays")
        it = iter(guests)
        for prim in self._steps:
            array = prim.apply(array, next(it)) if isinstance(prim, StoreAt) else prim.apply(array)
        return array

    def inverse_apply(self, array: np.ndarray) -> np.ndarray:
        """Move ``array`` in this layout back to the original shape (guests are dropped)."""
        array = np.asarray(array)
        if tuple(array.shape) != self.shape:
            raise ValueError(f"Layout.inverse_apply: array has shape {array.shape}, "
                             f"layout shape is {self.shape}")
        for prim, shape in zip(reversed(self._steps), reversed(self._shapes[:-1])):
            array = prim.inverse_apply(array, shape)
        return array

    def extract_guest(self, array: np.ndarray, guest: int = 0) -> np.ndarray:
        """Read back the data of attached tensor number ``guest`` from ``array`` in this layout."""
        slots = [i for i, p in enumerate(self._steps) if isinstance(p, StoreAt)]
        step = slots[self._guest_position(guest, slots)]
        array = np.asarray(array)
        for prim, shape in zip(reversed(self._steps[step + 1:]), reversed(self._shapes[step + 1:-1])):
            array = prim.inverse_apply(array, shape)
        return self._steps[step].extract_guest(array)

    # -------------------------------------------------------------- inversion
    def inverse(self) -> Layout:
        """The layout on :attr:`shape` whose primitives undo this one's."""
        prims = [p.inverse(s) for p, s in zip(reversed(self._steps), reversed(self._shapes[:-1]))]
        return Layout(self.shape, prims)

    # ---------------------------------------------------------- serialisation
    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, "shape": list(self._orig),
                "primitives": [p.to_json() for p in self._steps]}

    @classmethod
    def from_json(cls, record: dict[str, Any] | str) -> Layout:
        if isinstance(record, str):
            record = json.loads(record)
        if record.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"layout record has schema {record.get('schema')!r}, "
                             f"this alt_tvm reads schema {SCHEMA_VERSION}")
        return cls(record["shape"], [primitive_from_json(p) for p in record["primitives"]])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self._orig == other._orig and self._steps == other._steps

    def __hash__(self) -> int:
        return hash((self._orig, tuple(repr(p) for p in self._steps)))

    def __repr__(self) -> str:
        steps = "".join(f".{_describe(p)}" for p in self._steps)
        return f"Layout({self._orig}){steps}"


def _rename(prim: Primitive, names: list[str]) -> list[str]:
    if isinstance(prim, Split):
        n = names[prim.dim]
        parts = [f"{n}_o", f"{n}_i"] if len(prim.factors) == 2 else [f"{n}_{k}" for k in range(len(prim.factors))]
        return names[: prim.dim] + parts + names[prim.dim + 1:]
    if isinstance(prim, Fuse):
        lo, hi = prim.dims[0], prim.dims[-1] + 1
        return names[:lo] + ["_".join(names[lo:hi])] + names[hi:]
    if isinstance(prim, Reorder):
        return [names[p] for p in prim.perm]
    if isinstance(prim, Unfold):
        n = names[prim.dim]
        return names[: prim.dim] + [f"{n}_t", f"{n}_w"] + names[prim.dim + 1:]
    if isinstance(prim, Fold):
        return names[: prim.dim] + [names[prim.dim].removesuffix("_t")] + names[prim.dim + 2:]
    return names


def _describe(prim: Primitive) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in prim.to_json().items() if k != "kind")
    return f"{prim.kind}({fields})"
