"""``Layout``: a tensor shape plus the sequence of layout primitives applied to it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .index import Index, product
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
    _int_tuple,
    _is_int_imm,
    _pad_amount,
    primitive_from_json,
)

SCHEMA_VERSION = 1
#: Largest element count (and extent) of any shape in a layout: TVM indexes buffers with int64.
MAX_ELEMENTS = 2**63 - 1


class Layout:
    """The layout of one tensor: its original shape and a sequence of primitives.

    Methods named after primitives return a new ``Layout`` (the object is immutable),
    so sequences chain::

        Layout((1, 64, 112, 112)).pad(2, 0).split(1, [4, 16]).reorder([0, 1, 3, 4, 2])

    Dimensions are 0-based and refer to the shape *at that point in the chain*.
    Invalid parameters raise immediately, naming the bad value: ``TypeError`` for a
    value of the wrong type (sizes, dims and factors must be ints: Python or NumPy
    integers, never floats or bools), ``ValueError`` for a value out of range.
    """

    __slots__ = ("_orig", "_steps", "_shapes")

    def __init__(self, shape: Sequence[int], primitives: Sequence[Primitive] = ()) -> None:
        orig = _int_tuple(shape, "Layout: shape", "(1, 64, 56, 56)")
        if any(s < 1 for s in orig):
            raise ValueError(f"Layout: every extent must be positive, got shape {orig}")
        if isinstance(primitives, Primitive) or not isinstance(primitives, Iterable):
            raise TypeError(f"Layout: primitives must be a sequence of Primitive objects, "
                            f"e.g. [Split(1, (4, 16))], got {primitives!r}")
        primitives = tuple(primitives)
        _check_size(orig)
        shapes = [orig]
        for k, prim in enumerate(primitives):
            if not isinstance(prim, Primitive):
                raise TypeError(f"Layout: primitives[{k}] must be a layout Primitive (Split, Fuse, ...), "
                                f"got {prim!r} of type {type(prim).__name__}")
            shapes.append(tuple(prim.out_shape(shapes[-1])))
            _check_size(shapes[-1])
        self._orig = orig
        self._steps = primitives
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
    def stores_each_once(self) -> bool:
        """True if every element is stored exactly once, with padding allowed: a bijective
        layout or a padded one (a padded channel tile), not an overlapping unfold."""
        lossy_or_attached = (StoreAt, DecoupleAt, Unpad, Fold)
        return all(isinstance(p, Pad) or (not p.expands_data(s) and not isinstance(p, lossy_or_attached))
                   for p, s in zip(self._steps, self._shapes))

    @property
    def innermost_dim(self) -> tuple[int, int] | None:
        """``(original dim, extent)`` of the innermost stored dim when it is a tile of one
        original dim (a channel vector of a tiled map: ``(1, 16)``), else None."""
        index = [0] * len(self.shape)
        index[-1] = 1
        moved = [i for i, v in enumerate(self.backward(index)) if v != 0]
        return (moved[0], int(self.shape[-1])) if len(moved) == 1 else None

    @property
    def guests(self) -> list[StoreAt]:
        """The ``store_at`` steps, in order (the tensors attached to this one)."""
        return [p for p in self._steps if isinstance(p, StoreAt)]

    # -------------------------------------------------------------- primitives
    def _then(self, prim: Primitive) -> Layout:
        return Layout(self._orig, self._steps + (prim,))

    def split(self, dim: int, factors: Sequence[int]) -> Layout:
        """Split ``dim`` into ``factors`` (outer to inner); their product must equal the extent.

        ``factors`` is always a sequence: a bare int is refused rather than guessed at
        (TVM's ``split(factor=4)`` means an inner tile of 4; here write ``[extent // 4, 4]``).
        """
        if isinstance(factors, (int, np.integer, float, np.floating)) or _is_int_imm(factors):
            hint = ""
            if isinstance(dim, int) and 0 <= dim < len(self.shape) and isinstance(factors, (int, np.integer)):
                extent = self.shape[dim]
                if factors >= 1 and extent % factors == 0:
                    hint = (f"; for tiles of {factors} on dimension {dim} (extent {extent}) "
                            f"use [{extent // factors}, {factors}]")
            raise TypeError(f"split: factors must be a sequence of ints, e.g. [4] or [2, 4] (outer to inner, "
                            f"product = the dimension's extent), got the {type(factors).__name__} {factors!r}{hint}")
        return self._then(Split(dim, factors))

    def reorder(self, perm: Sequence[int]) -> Layout:
        """Permute dimensions: new dimension ``k`` is the current dimension ``perm[k]``."""
        return self._then(Reorder(perm))

    def fuse(self, dims: Sequence[int]) -> Layout:
        """Fuse consecutive dimensions ``dims`` into one."""
        return self._then(Fuse(dims))

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
        """Remove ``amount`` elements from ``dim``: an int from the end, ``(before, after)`` both ends.

        The removed elements are gone: :meth:`inverse` and :meth:`inverse_apply` of a
        layout containing ``unpad`` raise unless called with ``lossy=True``.
        """
        before, after = _pad_amount(amount, "unpad")
        return self._then(Unpad(dim, before, after))

    def store_at(self, guest: Any, dim: int) -> Layout:
        """Attach ``guest`` (a ``te.Tensor``, or a shape) at the end of ``dim`` of this tensor.

        The guest's shape must be this tensor's current shape without ``dim``. A
        ``te.Tensor`` guest is recognised by the rewrite pass, which then reads it from
        this tensor's buffer.
        """
        if hasattr(guest, "op") and hasattr(guest, "shape"):
            shape, key = _int_tuple(guest.shape, "store_at: guest tensor shape", "(64,)"), guest
        elif isinstance(guest, (str, bytes)) or not isinstance(guest, Iterable):
            raise TypeError(f"store_at: guest must be a te.Tensor or a shape (a sequence of ints, e.g. (64,)), "
                            f"got {guest!r} of type {type(guest).__name__}")
        else:
            shape, key = _int_tuple(guest, "store_at: guest shape", "(64,)"), None
        return self._then(StoreAt(dim, shape, key))

    def decouple_at(self, dim: int) -> Layout:
        """Detach the tensor last attached at ``dim`` (the inverse of :meth:`store_at`).

        A ``store_at`` earlier in this layout must have attached a tensor whose slot is
        still the last element of ``dim``; otherwise ``ValueError``. To detach a slot a
        tensor arrived with (attached by another layout), build the layout explicitly:
        ``Layout(shape, [DecoupleAt(dim)])``.
        """
        prim = DecoupleAt(dim)
        prim.out_shape(self.shape)  # type and range of dim first
        attached = self._attached()
        if not attached[prim.dim]:
            where = [d for d, n in enumerate(attached) if n]
            raise ValueError(f"decouple_at: nothing is attached at dim {prim.dim} of shape {self.shape}: "
                             f"no earlier store_at left a tensor at the end of that dim "
                             f"(dims with an attached tensor: {where})")
        return self._then(prim)

    def _attached(self) -> list[int]:
        """Per dim of :attr:`shape`, how many store_at slots end it (LIFO for decouple_at)."""
        att = [0] * len(self._orig)
        for prim in self._steps:
            att = _track_attached(prim, att)
        return att

    def with_extent(self, dim: int, extent: int) -> Layout | None:
        """The same tiling for a tensor whose ``dim`` has ``extent`` elements: each split of
        that dim keeps its inner factors and scales its outer one (a concatenation's operand
        in its output's channel tiles). None where the primitives cannot carry the change: a
        pad, unfold or fuse of that dim, an attached tensor, or inner tiles not dividing ``extent``.

        Raises
        ------
        ValueError
            If ``dim`` is not a dimension of :attr:`orig_shape` or ``extent < 1``.
        """
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 0 <= dim < len(self._orig):
            raise ValueError(f"with_extent: dim={dim!r}; expected a dim of shape {self._orig}")
        if isinstance(extent, bool) or not isinstance(extent, (int, np.integer)) or extent < 1:
            raise ValueError(f"with_extent: extent={extent!r}; expected an int >= 1")
        new, position, steps = int(extent), int(dim), []
        for prim in self._steps:
            if isinstance(prim, Split) and prim.dim == position:
                inner = product(prim.factors[1:])
                if new % inner:
                    return None
                new //= inner
                prim = Split(position, (new, *prim.factors[1:]))
            elif isinstance(prim, Split):
                position += len(prim.factors) - 1 if prim.dim < position else 0
            elif isinstance(prim, Reorder):
                position = prim.perm.index(position)
            elif isinstance(prim, Fuse) and position not in prim.dims:
                position -= len(prim.dims) - 1 if prim.dims[-1] < position else 0
            elif isinstance(prim, (Unfold, Pad)) and prim.dim != position:
                position += 1 if isinstance(prim, Unfold) and prim.dim < position else 0
            else:
                return None
            steps.append(prim)
        shape = list(self._orig)
        shape[dim] = int(extent)
        return Layout(shape, steps)

    def dim_names(self, names: Sequence[str]) -> list[str]:
        """Names for this layout's dimensions, derived from the original ones (for readable TIR)."""
        if isinstance(names, str) or not isinstance(names, Iterable):
            raise TypeError(f"dim_names: names must be a sequence of str, e.g. ['n', 'c', 'h', 'w'], got {names!r}")
        names = list(names)
        bad = [n for n in names if not isinstance(n, str)]
        if bad:
            raise TypeError(f"dim_names: names must be str, got {bad[0]!r} in {names!r}")
        if len(names) != len(self._orig):
            raise ValueError(f"dim_names: got {len(names)} names for a {len(self._orig)}-d shape")
        for prim in self._steps:
            names = _rename(prim, names)
        return names

    # -------------------------------------------------------------- index maps
    def forward(self, index: Sequence[Index], context: Any = None) -> list[Index]:
        """Map an index of the original shape to its index in this layout.

        Entries are ints, integer NumPy arrays or integer TIR expressions. Concrete
        entries (ints, arrays, ``IntImm``) outside ``0 <= i < extent`` raise ``IndexError``,
        as do concrete elements this layout does not store (dropped by ``unpad`` or
        ``decouple_at``); symbolic expressions are not range-checked.
        """
        orig = _checked_index(index, self._orig, "Layout.forward", "shape")
        index = orig
        for prim, shape in zip(self._steps, self._shapes):
            index = prim.forward(index, shape, context)
        _check_stored(index, self.shape, orig, "Layout.forward")
        return index

    def backward(self, index: Sequence[Index], *, checks: list | None = None) -> list[Index]:
        """Map an index of this layout to the original index it stores.

        Positions that hold padding map to indices outside some intermediate shape. When
        ``checks`` is a list, every ``(index, extent)`` pair that must satisfy
        ``0 <= index < extent`` for the position to hold a real element is appended to it.
        """
        index = _checked_index(index, self.shape, "Layout.backward", "layout shape")
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
        guest_index = _checked_index(index, self._steps[step].guest_shape, "Layout.guest_forward", "guest shape")
        index = self._steps[step].guest_forward(guest_index, self._shapes[step])
        for prim, shape in zip(self._steps[step + 1:], self._shapes[step + 1:-1]):
            index = prim.forward(index, shape, context)
        _check_stored(index, self.shape, guest_index, "Layout.guest_forward")
        return index

    def _guest_position(self, guest: int | Any, slots: list[int]) -> int:
        if isinstance(guest, (bool, np.bool_)):
            raise TypeError(f"guest must be a position (int) or an attached te.Tensor, got {guest!r}")
        if isinstance(guest, (int, np.integer)):
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
        if isinstance(guests, (str, bytes, np.ndarray)) or not isinstance(guests, Sequence):
            raise TypeError(f"Layout.apply: guests must be a list of arrays (one per store_at), got {guests!r}")
        guests = [np.asarray(g) for g in guests]
        if len(guests) != n_guests:
            raise ValueError(f"Layout.apply: layout has {n_guests} store_at guests, got {len(guests)} arrays")
        it = iter(guests)
        for prim in self._steps:
            array = prim.apply(array, next(it)) if isinstance(prim, StoreAt) else prim.apply(array)
        return array

    def inverse_apply(self, array: np.ndarray, *, lossy: bool = False) -> np.ndarray:
        """Move ``array`` in this layout back to the original shape (guests are dropped).

        Parameters
        ----------
        array
            Data in this layout (shape :attr:`shape`).
        lossy
            Allow ``unpad`` steps, whose removed elements come back as zeros.

        Raises
        ------
        ValueError
            ``array`` has the wrong shape, or a step dropped data (``unpad`` without
            ``lossy``, ``decouple_at``, an ``unfold`` with gaps).
        """
        array = np.asarray(array)
        if tuple(array.shape) != self.shape:
            raise ValueError(f"Layout.inverse_apply: array has shape {array.shape}, "
                             f"layout shape is {self.shape}")
        for prim, shape in zip(reversed(self._steps), reversed(self._shapes[:-1])):
            if isinstance(prim, Unpad):
                array = prim.inverse_apply(array, shape, lossy=lossy)
            else:
                array = prim.inverse_apply(array, shape)
        return array

    def extract_guest(self, array: np.ndarray, guest: int = 0) -> np.ndarray:
        """Read back the data of attached tensor number ``guest`` from ``array`` in this layout."""
        slots = [i for i, p in enumerate(self._steps) if isinstance(p, StoreAt)]
        step = slots[self._guest_position(guest, slots)]
        array = np.asarray(array)
        if tuple(array.shape) != self.shape:
            raise ValueError(f"Layout.extract_guest: array has shape {array.shape}, "
                             f"layout shape is {self.shape}")
        for prim, shape in zip(reversed(self._steps[step + 1:]), reversed(self._shapes[step + 1:-1])):
            array = prim.inverse_apply(array, shape)
        return self._steps[step].extract_guest(array)

    # -------------------------------------------------------------- inversion
    def inverse(self, *, lossy: bool = False) -> Layout:
        """The layout on :attr:`shape` whose primitives undo this one's.

        Parameters
        ----------
        lossy
            Invert ``unpad`` steps too. ``unpad`` discards elements, so the only layout
            "undoing" it is a ``pad`` that fills them with zeros: exact when they were
            padding (e.g. ``layout.inverse().inverse()`` for a padded ``layout``), wrong
            otherwise. Without ``lossy`` such a layout raises, like TVM's
            ``IndexMap.inverse`` for a map that is not bijective.

        Returns
        -------
        Layout
            Maps a tensor of shape :attr:`shape` to :attr:`orig_shape`. ``pad`` steps
            become ``unpad``, ``store_at`` becomes ``decouple_at`` (the guest is dropped) and
            ``decouple_at`` becomes a ``store_at`` whose guest must be passed to ``apply``.

        Raises
        ------
        ValueError
            An ``unpad`` step without ``lossy``, or an ``unfold`` with gaps between tiles.
        """
        prims = []
        for p, s in zip(reversed(self._steps), reversed(self._shapes[:-1])):
            prims.append(p.inverse(s, lossy=lossy) if isinstance(p, Unpad) else p.inverse(s))
        return Layout(self.shape, prims)

    # ---------------------------------------------------------- serialisation
    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, "shape": list(self._orig),
                "primitives": [p.to_json() for p in self._steps]}

    @classmethod
    def from_json(cls, record: Mapping[str, Any] | str | bytes) -> Layout:
        """Rebuild a layout from :meth:`to_json` output (a dict, or that dict as JSON text).

        Raises
        ------
        TypeError
            ``record`` is neither a str/bytes nor a dict, or a field has the wrong type.
        ValueError
            Malformed JSON, a wrong schema, missing keys or invalid primitives.
        """
        expected = "a dict {'schema': 1, 'shape': [...], 'primitives': [...]} or that dict as JSON text"
        if isinstance(record, (str, bytes, bytearray)):
            try:
                record = json.loads(record)
            except json.JSONDecodeError as err:
                raise ValueError(f"Layout.from_json: not valid JSON ({err}); expected {expected}") from None
        if not isinstance(record, Mapping):
            raise TypeError(f"Layout.from_json: expected {expected}, got {type(record).__name__} {record!r}")
        if record.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"layout record has schema {record.get('schema')!r}, "
                             f"this alt_tvm reads schema {SCHEMA_VERSION}")
        missing = [k for k in ("shape", "primitives") if k not in record]
        if missing:
            raise ValueError(f"Layout.from_json: record lacks {missing}; expected {expected}")
        prims = record["primitives"]
        if not isinstance(prims, (list, tuple)):
            raise TypeError(f"Layout.from_json: 'primitives' must be a list of primitive records, got {prims!r}")
        steps = []
        for k, prim in enumerate(prims):
            try:
                steps.append(primitive_from_json(prim))
            except (TypeError, ValueError) as err:
                if type(err) not in (TypeError, ValueError):
                    raise
                raise type(err)(f"Layout.from_json: primitives[{k}]: {err}") from None
        return cls(record["shape"], steps)

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


def _check_size(shape: Shape) -> None:
    if product(shape) > MAX_ELEMENTS:
        raise ValueError(f"Layout: shape {shape} has {product(shape)} elements, more than int64 indexing "
                         f"allows ({MAX_ELEMENTS})")


def _track_attached(prim: Primitive, att: list[int]) -> list[int]:
    """``att`` (store_at slots ending each dim) after ``prim``; slots moved off a dim's end are lost."""
    att = list(att)
    if isinstance(prim, StoreAt):
        att[prim.dim] += 1
    elif isinstance(prim, DecoupleAt):
        att[prim.dim] = max(att[prim.dim] - 1, 0)
    elif isinstance(prim, Split):
        keep = att[prim.dim] if len(prim.factors) == 1 else 0
        att[prim.dim: prim.dim + 1] = [0] * (len(prim.factors) - 1) + [keep]
    elif isinstance(prim, Fuse):
        lo, hi = prim.dims[0], prim.dims[-1] + 1
        att[lo:hi] = [att[lo] if hi - lo == 1 else 0]
    elif isinstance(prim, Reorder):
        att = [att[p] for p in prim.perm]
    elif isinstance(prim, Unfold):
        att[prim.dim: prim.dim + 1] = [0, 0]
    elif isinstance(prim, Fold):
        att[prim.dim: prim.dim + 2] = [0]
    elif isinstance(prim, (Pad, Unpad)) and prim.after:
        att[prim.dim] = 0
    return att


def _checked_index(index: Any, shape: Shape, where: str, shape_name: str) -> list[Index]:
    """``index`` as a list, after checking its length, entry types and concrete entries' range."""
    allowed = "ints, integer NumPy arrays or integer TIR expressions"
    if isinstance(index, (str, bytes)) or not isinstance(index, Iterable):
        raise TypeError(f"{where}: index must be a sequence of {len(shape)} entries ({allowed}), got {index!r}")
    index = list(index)
    if len(index) != len(shape):
        raise ValueError(f"{where}: index has {len(index)} entries, {shape_name} {shape} "
                         f"has {len(shape)} dims")
    for dim, (i, extent) in enumerate(zip(index, shape)):
        value = None
        if isinstance(i, (bool, np.bool_)):
            raise TypeError(f"{where}: index entry {dim} is the bool {i!r}; entries must be {allowed}")
        if isinstance(i, (int, np.integer)):
            value = int(i)
        elif isinstance(i, np.ndarray):
            if i.dtype.kind not in "iu":
                raise TypeError(f"{where}: index entry {dim} is an array of dtype {i.dtype}; entries must be {allowed}")
            bad = i[(i < 0) | (i >= extent)]
            if bad.size:
                value = int(bad.flat[0])
        elif _is_int_imm(i):
            value = int(i.value)
        elif not str(getattr(i, "ty", "")).startswith(("int", "uint")):
            raise TypeError(f"{where}: index entry {dim} is {i!r} of type {type(i).__name__}; "
                            f"entries must be {allowed}")
        if value is not None and not 0 <= value < extent:
            raise IndexError(f"{where}: index {value} is out of range for dimension {dim} of "
                             f"{shape_name} {shape}; allowed 0..{extent - 1}")
    return index


def _check_stored(index: list[Index], shape: Shape, orig: list[Index], where: str) -> None:
    """Raise ``IndexError`` if a concrete entry of a mapped ``index`` lies outside ``shape``."""
    for dim, (i, extent) in enumerate(zip(index, shape)):
        if isinstance(i, np.ndarray):
            bad = i[(i < 0) | (i >= extent)]
            value = int(bad.flat[0]) if bad.size else None
        elif isinstance(i, (int, np.integer)) or _is_int_imm(i):
            value = int(i.value) if _is_int_imm(i) else int(i)
            value = None if 0 <= value < extent else value
        else:
            value = None
        if value is not None:
            shown = orig if not any(isinstance(o, np.ndarray) for o in orig) else "(array index)"
            raise IndexError(f"{where}: element {shown} is not stored in this layout (an unpad or "
                             f"decouple_at step dropped it): it maps to index {value} outside dimension "
                             f"{dim} of layout shape {shape}")
