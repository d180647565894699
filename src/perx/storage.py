"""Circular storage of named fields with monotonic insertion ids.

Each field is an array of shape ``[capacity, *field_shape]``: a view into one row-major byte array that
keeps a transition's fields side by side (``Storage.rows``, ``[capacity, row_bytes]``), so a sampled
transition costs one or two cache lines instead of one per field (at N = 1e6 with six fields, a gather of
256 transitions took 2.2-2.6x less time than from six separate arrays). Transition number ``id``
(0, 1, 2, ... in insertion order) lives in slot ``id % capacity``; the oldest is overwritten first
(FIFO). An id is *live* while ``next_id - capacity <= id < next_id`` and *stale* once it has been
overwritten, which is how the buffer skips stale priority updates with no extra bookkeeping.

Invariant: a failed ``prepare`` (bad fields, shapes or dtypes) changes nothing; ``write`` only takes
what ``prepare`` returned, so a failed ``add``/``extend`` adds nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
from numba import njit

from perx._mmap import MappedCreateError, MappedFileError, MappedFolder, zeros
from perx._prefetch import AHEAD, prefetch
from perx.validation import _short, check_capacity, to_numpy

#: How values are cast into a field: numpy's ``same_kind`` rule, plus a range check. float64 ->
#: float32, int -> float and int -> any int type (signed or unsigned) are accepted; float -> int,
#: int -> bool and str -> anything are refused; a value that the narrowing cast would change (300
#: into int8, -1 into uint8, 1e39 into float32) is refused too, so nothing is stored wrapped or overflowed.
CASTING: Final = "same_kind"

# How a source dtype is checked on its way into a field (see _cast_rule).
_SAFE, _INT_RANGE, _FLOAT_RANGE = 0, 1, 2


def _cast_rule(src: np.dtype, dst: np.dtype) -> int | None:
    """None if ``src`` may not be cast into ``dst``; else which value check the cast needs."""
    if np.can_cast(src, dst, "safe"):
        return _SAFE
    if src.kind in "iu" and dst.kind in "iu":
        return _INT_RANGE  # any integer into any integer type, signed or not, if the values fit
    if not np.can_cast(src, dst, CASTING):
        return None
    if dst.kind in "fc":
        return _FLOAT_RANGE  # a finite value must stay finite (float64 -> float32, int64 -> float16)
    return _SAFE


def _out_of_range(arr: np.ndarray, rule: int, dst: np.dtype) -> tuple[np.ndarray | None, object]:
    """(the array cast into ``dst`` or None, the first value that does not fit or None)."""
    if rule == _INT_RANGE:
        if arr.size == 0:
            return None, None
        info = np.iinfo(dst)
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            return None, (lo if lo < info.min else hi)
        return None, None
    with np.errstate(over="ignore", invalid="ignore"):
        cast = arr.astype(dst)
    if np.isfinite(cast).all():
        return cast, None
    bad = np.isfinite(arr) & ~np.isfinite(cast)
    return (cast, arr[bad].flat[0]) if bad.any() else (cast, None)


def _wrapped(value: object, dtype: np.dtype) -> str:
    with np.errstate(over="ignore", invalid="ignore"):
        return repr(np.array(value).astype(dtype).item())


def _nbytes(capacity: int, spec: Mapping) -> int:
    return sum(capacity * int(np.prod(f.shape, dtype=np.int64)) * f.dtype.itemsize for f in spec.values())


@dataclass(frozen=True)
class FieldSpec:
    """Shape (without the leading capacity axis) and dtype of one stored field."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def to_json(self) -> list:
        return [list(self.shape), self.dtype.str]

    @classmethod
    def from_json(cls, obj: list) -> FieldSpec:
        return cls(tuple(int(s) for s in obj[0]), np.dtype(obj[1]))


def _parse_spec(spec: Mapping) -> dict[str, FieldSpec]:
    if not isinstance(spec, Mapping) or not spec:
        raise TypeError(f"spec: expected a non-empty dict of name -> (shape, dtype), got {_short(spec)}")
    out = {}
    for name, item in spec.items():
        if isinstance(item, FieldSpec):
            out[name] = item
            continue
        try:
            shape, dtype = item
            shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
            dtype = np.dtype(dtype)
        except (TypeError, ValueError) as err:
            raise TypeError(f"spec[{name!r}]: expected (shape, dtype), got {_short(item)}") from err
        if any(s < 0 for s in shape) or dtype.kind not in "biufc":
            raise ValueError(f"spec[{name!r}]: invalid shape or dtype {_short(item)}")
        out[name] = FieldSpec(shape, dtype)
    return out


_SCALARS = (np.generic, int, float, bool)
_DTYPE = operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")
_FIRST = operator.itemgetter(0)


def _as_array(value: object, name: str) -> np.ndarray:
    try:
        arr = to_numpy(value)
    except (ValueError, TypeError, RuntimeError) as err:
        raise ValueError(f"{name}: cannot make an array of {_short(value)}: {err}") from None
    if arr.dtype.kind == "O":
        if isinstance(value, Mapping):
            raise TypeError(f"{name}: got a dict (keys {_short(list(value))}) but {name} is a plain field of this "
                            f"buffer; a dict field is fixed as one by the first add or by spec=")
        raise ValueError(f"{name}: cannot store {_short(value)}: numpy made an object array of it (ragged "
                         f"rows, Python objects, or an integer beyond 64 bits); give equal-length rows of numbers")
    return arr


class Storage:
    """Preallocated circular store of named fields (any shapes and numeric/bool dtypes).

    Args:
        capacity: number of transitions kept; the oldest is overwritten first.
        spec: optional ``{name: (shape, dtype)}``. Without it, the first ``add``/``extend`` fixes the
            fields, shapes and dtypes (Python floats become float64, ints int64, bools bool).
    """

    def __init__(self, capacity: int, spec: Mapping | None = None, *, mapped: MappedFolder | None = None) -> None:
        self.capacity = check_capacity(capacity)
        #: The folder whose files hold the arrays (``ReplayBuffer(memmap=...)``), or None: in RAM.
        self.mapped = mapped
        self.next_id = 0
        self.spec: dict[str, FieldSpec] | None = None
        self.data: dict[str, np.ndarray] = {}
        self._castable: dict[str, dict[np.dtype, int]] = {}
        #: True when the first add/extend chose the dtypes (used to explain a later cast error).
        self.inferred = False
        self._one: _OneRow | None = None
        if spec is not None:
            self._allocate(_parse_spec(spec))

    def __len__(self) -> int:
        return min(self.next_id, self.capacity)

    # The field views share the rows' memory; a copy or a pickle of the views would not. So a copied or
    # unpickled storage keeps the rows (and the fields kept apart) and rebuilds the views from them.
    # The layout is rebuilt from the spec too (it is a function of it), so a copy has its own: batches sampled
    # from the original cannot be refilled by the copy (``sample(out=...)``).
    def __getstate__(self) -> dict:
        mapped = self.__dict__.get("mapped")
        if mapped is not None:
            raise TypeError(f"a memmap buffer's storage ({str(mapped.path)!r}) cannot be pickled or copied: its "
                            f"rows live in files; write a portable copy with save(), or close() it and "
                            f"ReplayBuffer.open() the folder")
        state = dict(self.__dict__)
        for derived in ("_rows64", "_flat", "_layout", "_one"):
            state.pop(derived, None)
        if self.spec is not None:
            state["data"] = {n: a for n, a in self.data.items() if n not in self._layout.offset}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._one = None
        if self.spec is not None:
            self._layout = _RowLayout(self.spec)
            self._rows64 = self.rows.view(np.uint64)
            self._flat = _flat_views(self.spec, self._layout, self.rows)
            self.data = self._views(self.spec, self._layout, self.rows, self.data)
            self._one = _OneRow.build(self.spec, self._layout, self.rows)

    def _views(self, spec: dict, layout: _RowLayout, rows: np.ndarray, apart: dict) -> dict[str, np.ndarray]:
        """The field arrays in spec order: views into ``rows``, or the arrays kept apart."""
        data = {}
        for name, f in spec.items():
            if name in layout.offset:
                start = layout.offset[name]
                data[name] = rows[:, start : start + layout.size[name]].view(f.dtype).reshape(self.capacity, *f.shape)
            else:
                data[name] = apart[name]
        return data

    @property
    def nbytes(self) -> int:
        """Bytes held by the field arrays, the padding of each row to 8 bytes included (0 before the layout
        is fixed)."""
        if self.spec is None:
            return 0
        return self.rows.nbytes + sum(arr.nbytes for name, arr in self.data.items()
                                      if name not in self._layout.offset)

    def _allocate(self, spec: dict[str, FieldSpec]) -> None:
        # Allocate everything before publishing the spec, so a failure leaves the storage as it was.
        try:
            layout = _RowLayout(spec)
            rows = zeros(self.mapped, "rows", (self.capacity, layout.row_bytes), np.dtype(np.uint8))
            apart = {name: zeros(self.mapped, f"apart-{k}", (self.capacity, *f.shape), f.dtype)
                     for k, (name, f) in enumerate(spec.items()) if name not in layout.offset}
        except (MappedFileError, MappedCreateError):
            raise
        except (MemoryError, ValueError) as err:
            raise MemoryError(
                f"capacity: cannot allocate {self.capacity} transitions of "
                f"{_nbytes(1, spec)} bytes each ({_nbytes(self.capacity, spec) / 2**30:.3g} GiB) for the fields "
                f"{sorted(spec)}: {type(err).__name__}; choose a smaller capacity"
            ) from None
        data = self._views(spec, layout, rows, apart)
        self.spec = spec
        self.data = data
        #: uint8 [capacity, row_bytes]: every packed field of a transition in one row.
        self.rows = rows
        self._rows64 = rows.view(np.uint64)
        self._flat = _flat_views(spec, layout, rows)
        layout.unfused = self.mapped is not None and self.mapped.prefetch
        self._layout = layout
        self._one = _OneRow.build(spec, layout, rows)
        # Source dtypes already known to cast into each field, with the value check each needs
        # (np.can_cast is a slow call next to a dict lookup, so the rule is worked out once per source dtype).
        self._castable = {name: {f.dtype: _SAFE} for name, f in spec.items()}

    def _infer_spec(self, fields: Mapping, batched: bool) -> dict[str, FieldSpec]:
        spec = {}
        for name, value in fields.items():
            arr = _as_array(value, name)
            if batched:
                if arr.ndim == 0:
                    raise ValueError(
                        f"{name}: extend needs a leading batch axis, got a scalar {_short(value)}"
                    )
                shape = arr.shape[1:]
            else:
                shape = arr.shape
            if arr.dtype.kind not in "biufc":
                raise TypeError(f"{name}: cannot store dtype {arr.dtype} ({_short(value)})")
            spec[name] = FieldSpec(tuple(shape), arr.dtype)
        if not spec:
            raise ValueError("fields: a transition needs at least one field, got none")
        return spec

    def write_one(self, fields: Mapping) -> int | None:
        """Store one transition whose values need no conversion; return its id, or None (nothing written)
        when any value needs the general path (``prepare`` + ``write``), which then gives the same result
        or the same error.

        The fast path of ``ReplayBuffer.add``: the values' types are looked up as one tuple among the type
        combinations already worked out (``_OneRow.learn``), the arrays' dtypes and shapes and the narrowing
        scalars' ranges are checked, then the row is written with one structured assignment: about a third of
        the time of ``prepare`` + ``write`` (docs/history/speed.md, change 11).
        """
        one = self._one
        if one is None or len(fields) != one.count:
            return None
        try:
            values = one.pick(fields)
        except KeyError:  # a missing field (with the count equal, also an unexpected one)
            return None
        kinds = tuple(map(type, values))
        checks = one.known.get(kinds)
        if checks is None:
            checks = one.learn(kinds)
        if checks is False:
            return None
        arrays, bounded = checks
        for k, dtype, shape in arrays:
            v = values[k]
            if v.dtype is not dtype or v.shape != shape:
                return None
        for k, lo, hi in bounded:
            if not lo <= values[k] <= hi:
                return None  # may not fit (NaN too: the general path accepts it)
        i = self.next_id
        one.rows[i % self.capacity] = values
        self.next_id = i + 1
        return i

    def write_batch(self, fields: Mapping) -> int | None:
        """Store a batch of arrays that need no conversion and fit before the end of the ring; return the id
        of its first row, or None (nothing written) for anything else: the general path (``prepare`` +
        ``write``) then stores it or refuses it, the same way.

        The fast path of ``ReplayBuffer.extend``: the values are taken in one call, checked for type, dtype
        and shape, then each field is copied once (a field of several elements as one opaque element per
        row, as in ``write``). For 256 rows of the benchmark's six fields, about two thirds of the time of
        ``prepare`` + ``write``, more than half of it the copies themselves (docs/history/speed.md, change 33).
        """
        one = self._one
        if one is None:
            return None
        exact = one.exact_batch(fields)
        if exact is None:
            return None
        values, rows = exact
        start = self.next_id
        first = start % self.capacity
        if not 0 < rows <= self.capacity - first:  # empty, wrapping round or oversized: the general path
            return None
        if rows == 1:  # one row (an SB3 or single-env step): one structured assignment, as ``write_one``
            one.rows[first] = tuple(map(_FIRST, values))
            self.next_id = start + 1
            return start
        sources = list(values)  # everything is checked and viewed before anything is written
        try:
            for k, void, flatten in one.opaque:
                sources[k] = (sources[k].reshape(rows, -1) if flatten else sources[k]).view(void)
        except ValueError:  # a last axis with gaps cannot be viewed as one element: the general path
            return None
        where = slice(first, first + rows)
        for src, dst in zip(sources, one.targets, strict=True):
            dst[where] = src
        self.next_id = start + rows
        return start

    def prepare(self, fields: Mapping, *, batched: bool) -> tuple[Mapping[str, np.ndarray], int, dict | None]:
        """Validate and convert one transition (``batched=False``) or a batch; changes nothing.

        Returns:
            (arrays ready to write, number of rows, a new spec if this call fixes the layout or None). The
            arrays are ``fields`` itself where nothing needs converting (a batch of the fields' own dtypes).

        Raises:
            ValueError: missing or extra fields, wrong shapes, batch lengths that differ.
            TypeError: a value whose dtype cannot be cast to the field's dtype under ``same_kind``.
        """
        one = self._one
        if batched and one is not None:
            exact = one.exact_batch(fields)
            if exact is not None:  # the common case: arrays of the fields' own dtypes, nothing to convert
                return fields, exact[1], None
        spec = self.spec
        new_spec = None
        if spec is None:
            spec = new_spec = self._infer_spec(fields, batched)
        castable = self._castable if new_spec is None else {n: {f.dtype: _SAFE} for n, f in spec.items()}
        if fields.keys() != spec.keys():
            missing = sorted(spec.keys() - fields.keys())
            extra = sorted(fields.keys() - spec.keys())
            raise ValueError(f"fields: missing {missing}, unexpected {extra}; expected {sorted(spec)}")
        out = {}
        rows = -1
        for name, f in spec.items():
            value = fields[name]
            if type(value) is np.ndarray:
                arr = value
            elif isinstance(value, _SCALARS):  # the common non-array case, without the checks below
                arr = np.asarray(value)
            else:
                arr = _as_array(value, name)
            rules = castable[name]
            rule = rules.get(arr.dtype)
            if rule is None:
                rule = _cast_rule(arr.dtype, f.dtype)
                if rule is None:
                    raise TypeError(
                        f"{name}: cannot cast dtype {arr.dtype} to the field's {f.dtype} safely "
                        f"(rule {CASTING!r}); got {_short(value)}{self._origin(name, f)}"
                    )
                rules[arr.dtype] = rule
            if batched:
                if arr.ndim == 0 or arr.shape[1:] != f.shape:
                    raise ValueError(
                        f"{name}: expected shape (batch, {', '.join(map(str, f.shape))}) for extend, "
                        f"got {arr.shape}"
                    )
                if rows < 0:
                    rows = arr.shape[0]
                elif arr.shape[0] != rows:
                    raise ValueError(f"{name}: has {arr.shape[0]} rows but other fields have {rows}")
            elif arr.shape != f.shape:
                raise ValueError(f"{name}: expected shape {f.shape}, got {arr.shape}")
            if rule != _SAFE:
                cast, bad = _out_of_range(arr, rule, f.dtype)
                if bad is not None:
                    raise ValueError(
                        f"{name}: the value {bad!r} does not fit the field's dtype {f.dtype} "
                        f"(it would be stored as {_wrapped(bad, f.dtype)}){self._origin(name, f)}"
                    )
                if cast is not None:
                    arr = cast
            out[name] = arr
        return out, (rows if batched else 1), new_spec

    #: stored name -> (dict field, key) for the keys of dict fields (set by the buffer; for messages only)
    owners: Mapping = {}

    def _origin(self, name: str, f: FieldSpec) -> str:
        if not self.inferred:
            return ""
        where = self.owners.get(name)
        entry = f"{name!r}: ({f.shape}, <dtype>)" if where is None else \
            f"{where[0]!r}: {{{where[1]!r}: ({f.shape}, <dtype>), ...}}"
        return (f". The field's dtype {f.dtype} was inferred from the first add/extend; to choose it, "
                f"pass spec={{{entry}, ...}} to ReplayBuffer")

    def write(self, arrays: Mapping[str, np.ndarray], rows: int, new_spec: dict | None, *, batched: bool
              ) -> tuple[np.ndarray, np.ndarray]:
        """Write what ``prepare`` returned. Returns (ids [rows], slots actually written [<= capacity])."""
        if new_spec is not None:
            self._allocate(new_spec)
            self.inferred = True
        cap = self.capacity
        start = self.next_id
        if not batched:
            slot = start % cap
            for name, arr in arrays.items():
                self.data[name][slot] = arr
            self.next_id = start + 1
            return np.array([start], np.int64), np.array([slot], np.int64)
        # Only the last `capacity` rows of an oversized batch survive; the others are stale at once.
        skip = max(0, rows - cap)
        kept = rows - skip
        first = (start + skip) % cap
        head = min(kept, cap - first)
        data = self.data
        if skip == 0 and head == kept:  # the common case: no wrap, nothing dropped; no slicing of the sources
            flat = self._flat
            for name, arr in arrays.items():
                dst = flat.get(name)
                if dst is not None and arr.dtype == dst[2] and arr.flags.c_contiguous:
                    # a field of several elements per row, copied as one opaque element per row: numpy copies
                    # such rows in a little over half the time of its strided copy of the elements
                    # (docs/history/speed.md, change 8). A [rows, k] array views as [rows, 1] of the opaque
                    # element directly, so only fields of two or more axes pay for a reshape (change 28)
                    dst[0][first : first + kept] = (arr if arr.ndim == 2 else arr.reshape(kept, -1)).view(dst[1])
                else:
                    data[name][first : first + kept] = arr
        else:
            for name, arr in arrays.items():
                field = data[name]
                src = arr[skip:]
                field[first : first + head] = src[:head]
                if head < kept:
                    field[: kept - head] = src[head:]
        self.next_id = start + rows
        ids = np.arange(start, start + rows, dtype=np.int64)
        if head == kept:  # no wrap: the slots are consecutive (an arange is ~6x cheaper than a modulo)
            return ids, np.arange(first, first + kept, dtype=np.int64)
        return ids, ids[skip:] % cap

    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of every field at ``slots`` (int64 [B], each in [0, capacity)); each array is
        [B, *field_shape], C-contiguous, in spec order. One compiled call: the B rows are copied out whole
        (one or two cache lines each), then split into the fields, all of them in one allocation (a kept field
        keeps the whole batch's memory alive). Slots are not bounds-checked here: samplers hand out slots in
        [0, capacity). B < 16, rows over 512 bytes and layouts with fields kept apart use numpy per field.
        O(B * row_bytes)."""
        layout = self._layout
        b = slots.shape[0]
        rec = layout.record(b) if b >= _KERNEL_GATHER_MIN else None
        if rec is None:
            return {name: arr[slots] for name, arr in self.data.items()}
        raw = np.empty(rec[0], np.uint8)
        _gather_rows(self._rows64, slots, raw[24 * b:], layout.plan)  # the first 24 * b bytes stay unused here
        return self.fields(layout.pick(np.ndarray((), rec[1], raw)))

    def batch_bytes(self, b: int) -> np.ndarray | None:
        """New uint8 bytes for a sampler's compiled call to fill with a batch of b (``Sampler.sample_gather``:
        ids, probabilities and weights, then the fields; see ``_RowLayout.batch_dtype``, whose views
        ``_RowLayout.pick`` takes), or None where numpy's per-field gather is used instead (fields kept apart,
        rows over 512 bytes)."""
        rec = self._layout.record(b)
        return None if rec is None else np.empty(rec[0], np.uint8)

    def fields(self, arrays: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        """The field name -> array dict of ``_RowLayout.pick``'s arrays (ids, probabilities, weights, fields)."""
        return self._layout.as_dict(arrays)


#: Below this batch size numpy's per-field gather is cheaper than one kernel call and the batch's views
#: (at N = 1e6 with six fields, numpy's is the faster at B = 1, the kernel about a tenth faster at B = 32 and a
#: third at 256; the choice: docs/history/speed.md, change 1).
_KERNEL_GATHER_MIN = 16
#: Above this row size numpy's per-field gather (a memcpy per row and field) wins: the kernel's whole-row
#: scratch copy doubles the traffic of large rows (Atari stacks stored twice per row: 2.2x slower at B = 256).
_KERNEL_GATHER_MAX_ROW = 512
#: Largest batch record (bytes) of the compiled gather.
_KERNEL_GATHER_MAX_BYTES = 2**30


# Scalar types a single add may take without the general path, and the dtype ``np.asarray`` gives each.
_FAST_SCALARS = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64)}
for _t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
           np.float16, np.float32, np.float64):
    _FAST_SCALARS[_t] = np.dtype(_t)


def _accepted_scalars(dtype: np.dtype) -> dict[type, tuple | None]:
    """For a field of shape () and ``dtype``: scalar type -> None (stored as is under ``prepare``'s rules) or
    (lo, hi), the closed range of values whose narrowing cast ``prepare`` accepts unchanged. A type missing
    here takes the general path (refused, or a check this table does not express)."""
    accept: dict[type, tuple | None] = {}
    for kind, src in _FAST_SCALARS.items():
        rule = _cast_rule(src, dtype)
        if rule is None or dtype.kind not in "biuf":
            continue
        if kind is int:  # np.asarray(int) is int64 only inside int64's range
            info = np.iinfo(np.int64)
            lo, hi = info.min, info.max
            if dtype.kind in "iu":
                lo, hi = max(lo, int(np.iinfo(dtype).min)), min(hi, int(np.iinfo(dtype).max))
            elif dtype.kind == "f" and rule == _FLOAT_RANGE:
                top = float(np.finfo(dtype).max)
                lo, hi = max(lo, -int(top)), min(hi, int(top))
            accept[kind] = (lo, hi)
        elif rule == _SAFE:
            accept[kind] = None
        elif rule == _INT_RANGE:
            info = np.iinfo(dtype)
            accept[kind] = (int(info.min), int(info.max))
        elif rule == _FLOAT_RANGE and src.kind in "iuf":
            # a value within +-max stays finite; NaN and infinities fail the comparison and take the general
            # path, which accepts them
            top = float(np.finfo(dtype).max)
            accept[kind] = (-top, top)
    return accept


#: The checks ``_OneRow.learn`` works out for one combination of value types: (array checks [(position, dtype,
#: shape)], range checks [(position, lo, hi)]), or False where that combination takes the general path.
_Checks = tuple[list[tuple[int, np.dtype, tuple[int, ...]]], list[tuple[int, Any, Any]]] | Literal[False]


class _OneRow:
    """The fast paths of a single add (``Storage.write_one``) and of an extend of exact arrays (``exact_batch``):
    the rows as one structured record per transition, the fields' dtypes and shapes, and per combination of
    value types seen, the checks left (or False: that combination takes the general path)."""

    def __init__(self, spec: dict[str, FieldSpec], layout: _RowLayout, rows: np.ndarray) -> None:
        record = np.dtype({"names": layout.names, "offsets": [layout.offset[n] for n in layout.names],
                           "formats": [(spec[n].dtype, spec[n].shape) for n in layout.names],
                           "itemsize": layout.row_bytes})
        self.rows = rows.view(record).reshape(len(rows))
        self.count = len(spec)
        names = self.names = list(spec)
        self.all_arrays = (np.ndarray,) * len(names)
        self.dtypes = tuple(f.dtype for f in spec.values())
        #: rows -> the shape of each field's batch of that many rows
        self.batch_shapes: dict[int, tuple] = {}
        # the values in spec order, as a tuple, in one C-level call
        self.pick = operator.itemgetter(*names) if len(names) > 1 else (lambda f, n=names[0]: (f[n],))
        self.fields = [(f.dtype, f.shape, _accepted_scalars(f.dtype) if f.shape == () else {})
                       for f in spec.values()]
        #: tuple of value types -> (array checks [(position, dtype, shape)], range checks [(position, lo, hi)])
        self.known: dict[tuple, _Checks] = {}
        #: per field, in spec order, where ``Storage.write_batch`` copies a batch to: the field's bytes in the
        #: rows as [capacity, 1] of one opaque element per row (a field of several elements: numpy copies such
        #: rows in a little over half the time of its strided copy of the elements; docs/history/speed.md,
        #: change 8), or the field's own view
        self.targets = []
        #: (position, that opaque dtype, whether its batch is flattened to [rows, elements] first: a field of
        #: more than one axis) for each field of several elements
        self.opaque = []
        for k, n in enumerate(names):
            f, cells = spec[n], rows[:, layout.offset[n] : layout.offset[n] + layout.size[n]]
            if f.shape == () or f.shape == (1,):
                self.targets.append(cells.view(f.dtype).reshape(len(rows), *f.shape))
            else:
                void = np.dtype(f"V{layout.size[n]}")
                self.targets.append(cells.view(void))
                self.opaque.append((k, void, len(f.shape) > 1))

    def shapes_of(self, rows: int) -> tuple:
        """The shape of each field's batch of ``rows`` rows, kept in ``batch_shapes`` (at most 64 sizes)."""
        if len(self.batch_shapes) >= 64:
            self.batch_shapes.clear()
        shapes = self.batch_shapes[rows] = tuple((rows, *f[1]) for f in self.fields)
        return shapes

    def exact_batch(self, fields: Mapping) -> tuple[tuple, int] | None:
        """(the values in spec order, rows) if ``fields`` holds every field and nothing else, each an array of
        its field's dtype with shape [rows, *field shape] (accepted as they are), else None. For
        ``Storage.write_batch`` and ``Storage.prepare`` of a batch."""
        if len(fields) != self.count:
            return None
        try:
            values = self.pick(fields)
        except KeyError:  # a missing field (with the count equal, also an unexpected one)
            return None
        if tuple(map(type, values)) != self.all_arrays or values[0].ndim == 0:
            return None
        rows = values[0].shape[0]
        shapes = self.batch_shapes.get(rows) or self.shapes_of(rows)
        # equal dtypes, identical ones at once: the same bytes per element (two passes of C calls, cheaper than
        # one Python loop over the fields; docs/history/speed.md, change 33)
        if tuple(map(_DTYPE, values)) != self.dtypes or tuple(map(_SHAPE, values)) != shapes:
            return None
        return values, rows

    @staticmethod
    def build(spec: dict[str, FieldSpec], layout: _RowLayout, rows: np.ndarray) -> _OneRow | None:
        return None if layout.loose else _OneRow(spec, layout, rows)  # a field kept apart: the general path

    def learn(self, kinds: tuple) -> _Checks:
        """Work out (and remember) the checks for one combination of value types."""
        arrays: list[tuple[int, np.dtype, tuple[int, ...]]] = []
        bounded: list[tuple[int, Any, Any]] = []
        checks: _Checks = (arrays, bounded)
        for k, (kind, (dtype, shape, accept)) in enumerate(zip(kinds, self.fields, strict=True)):
            if kind is np.ndarray:
                arrays.append((k, dtype, shape))
            elif kind not in accept:
                checks = False
                break
            elif (bound := accept[kind]) is not None:
                bounded.append((k, *bound))
        if len(self.known) >= 64:  # callers that vary their types endlessly: keep the table small
            self.known.clear()
        self.known[kinds] = checks
        return checks


def _flat_views(spec: dict[str, FieldSpec], layout: _RowLayout, rows: np.ndarray) -> dict[str, tuple]:
    """For each packed field of more than one element: (its bytes in the rows as one opaque element per row,
    void [capacity, 1]; that void dtype; the field's dtype), used by ``Storage.write``."""
    flat = {}
    for name, start in layout.offset.items():
        if spec[name].shape != () and spec[name].shape != (1,):
            void = np.dtype(f"V{layout.size[name]}")
            flat[name] = (rows[:, start : start + layout.size[name]].view(void), void, spec[name].dtype)
    return flat


class _RowLayout:
    """Where each field sits in a row: fields whose byte size is a multiple of 8 first (8-byte aligned), the
    others after them by decreasing item size (so each stays aligned to its item size); a row is padded to a
    multiple of 8 bytes. Zero-byte fields are kept apart (``loose``)."""

    def __init__(self, spec: dict[str, FieldSpec]) -> None:
        sizes = {n: int(np.prod(f.shape, dtype=np.int64)) * f.dtype.itemsize for n, f in spec.items()}
        # zero-byte fields, fields aligned beyond 8 bytes (long double) and non-string names (a structured
        # dtype needs strings) stay apart as ordinary arrays
        packed = [n for n in spec if sizes[n] > 0 and spec[n].dtype.alignment <= 8 and isinstance(n, str)]
        order = sorted(packed, key=lambda n: (sizes[n] % 8 != 0, -spec[n].dtype.itemsize))
        self.offset: dict[str, int] = {}
        self.size = sizes
        pos = 0
        for n in order:
            align = spec[n].dtype.alignment
            pos = -(-pos // align) * align
            self.offset[n] = pos
            pos += sizes[n]
        self.row_bytes = -(-pos // 8) * 8
        #: a field kept apart, or none at all in the rows: gathered by numpy (Storage.gather)
        self.loose = len(packed) < len(spec) or not packed
        self.spec = spec
        self.names = list(spec)
        # per field, in spec order: byte offset in a row, bytes, and the widest unit (8, 4, 2 or 1 bytes) that
        # divides both, in which the gather copies it
        # (rows: byte offset, bytes, unit; one column per field), the gather kernels' one argument for the layout
        self.plan = np.array([[self.offset.get(n, 0) for n in self.names], [sizes[n] for n in self.names],
                              [_unit(self.offset.get(n, 0), sizes[n]) for n in self.names]], np.int64)
        #: B -> (bytes, :meth:`batch_dtype`) of a batch record, or None where B rows are gathered by numpy;
        #: the cached answer of :meth:`record`, read first by ``ReplayBuffer.sample`` (one dict lookup)
        self.records: dict[int, tuple[int, np.dtype] | None] = {}
        #: True while a memmap buffer prefetches (``ReplayBuffer.prefetch``): no batch records, so every
        #: sample draws first and copies after the prefetch
        self.unfused = False
        # names of a batch record's ids, probabilities and weights: any string can name a field, so pick ones
        # the spec does not use
        tag = "__perx_"
        while any(isinstance(n, str) and n.startswith(tag) for n in spec):
            tag = "_" + tag
        self.extras = (tag + "ids", tag + "probabilities", tag + "weights")
        #: a batch record's ids, probabilities, weights and fields, in one C-level call
        self.pick = operator.itemgetter(*self.extras, *self.names)
        #: ``pick``'s tuple -> the field name -> array dict. Written out as a dict display for the names of
        #: this layout (about a third of the time of ``dict(zip(...))`` of six fields: docs/history/speed.md,
        #: change 22); str.__repr__ quotes each
        #: name (a str subclass's own __repr__ is not trusted), and only string names reach it (others make
        #: the layout ``loose``, with no batch records).
        names = self.names
        if self.loose:
            self.as_dict = lambda a: dict(zip(names, a[3:], strict=True))
        else:
            code = "".join(f"{str.__repr__(n)}: a[{k + 3}], " for k, n in enumerate(names))
            self.as_dict = eval(f"lambda a: {{{code}}}")

    def fits(self, b: int) -> bool:
        """Whether a batch of b is gathered by the compiled row copy: rows of at most 512 bytes, and a batch
        record under 1 GiB (a structured dtype's size must fit a C int; numpy's per-field gather has no
        such limit)."""
        return self.row_bytes <= _KERNEL_GATHER_MAX_ROW and b * (self.row_bytes + 8 * len(self.names) + 24) \
            <= _KERNEL_GATHER_MAX_BYTES

    def record(self, b: int) -> tuple[int, np.dtype] | None:
        """(bytes, dtype) of the batch record of b rows for a sampler's compiled draw and copy
        (``Sampler.sample_gather``), or None where numpy's per-field gather is used instead (fields kept
        apart, rows over 512 bytes, records over 1 GiB). Cached in ``records`` (at most 64 batch sizes)."""
        rec: tuple[int, np.dtype] | Literal[False] | None = self.records.get(b, False)
        if rec is False:
            rec = None
            if not self.loose and not self.unfused and self.fits(b):
                dt = self.batch_dtype(b)
                rec = (dt.itemsize, dt)
            if len(self.records) >= 64:
                self.records.clear()
            self.records[b] = rec
        return rec

    def batch_dtype(self, b: int) -> np.dtype:
        """A structured dtype holding a sampled batch of b: first ids (int64 [b]), probabilities and weights
        (float64 [b]) under the names ``self.extras``, then field f as a C-ordered [b, *shape] block starting at
        a multiple of 8 bytes, in spec order (built anew: :meth:`record` caches it)."""
        names = [*self.extras, *self.names]
        offsets = [0, 8 * b, 16 * b]
        formats: list[tuple[Any, tuple[int, ...]]] = [(np.int64, (b,)), (np.float64, (b,)), (np.float64, (b,))]
        pos = 24 * b
        for n in self.names:
            offsets.append(pos)
            formats.append((self.spec[n].dtype, (b, *self.spec[n].shape)))
            pos += -(-b * self.size[n] // 8) * 8
        return np.dtype({"names": names, "offsets": offsets, "itemsize": pos, "formats": formats})


def _unit(offset: int, size: int) -> int:
    for u in (8, 4, 2):
        if offset % u == 0 and size % u == 0:
            return u
    return 1


@njit(cache=True, nogil=True)
def _copy_field(src, row_units, a, w, b, dst, o):
    """dst[o + k * w + j] = src[k * row_units + a + j] for k < b, j < w: one field of b gathered rows, in
    units of the arrays' dtype. The common widths are spelled out: a loop of unknown length per row costs
    3-4x more than the copy itself."""
    if w == 1:
        for k in range(b):
            dst[o + k] = src[k * row_units + a]
    elif w == 2:
        for k in range(b):
            i = k * row_units + a
            dst[o + 2 * k] = src[i]
            dst[o + 2 * k + 1] = src[i + 1]
    elif w == 4:
        for k in range(b):
            i = k * row_units + a
            p = o + 4 * k
            dst[p] = src[i]
            dst[p + 1] = src[i + 1]
            dst[p + 2] = src[i + 2]
            dst[p + 3] = src[i + 3]
    else:
        for k in range(b):
            i = k * row_units + a
            p = o + w * k
            for j in range(w):
                dst[p + j] = src[i + j]


@njit(cache=True, nogil=True)
def _gather_rows(rows64, slots, out, plan):
    """Copy rows ``slots`` whole into a row-major scratch (one pass of independent line reads), then each
    field f into ``out`` bytes [dst_f, dst_f + b * nbytes[f]), dst_f = the earlier fields' b * nbytes rounded
    up to 8 (``_RowLayout.batch_dtype``). ``plan`` is ``_RowLayout.plan``: rows src, nbytes, unit."""
    src = plan[0]
    nbytes = plan[1]
    unit = plan[2]
    b = slots.shape[0]
    words = rows64.shape[1]
    tmp = np.empty(b * words, np.uint64)
    for k in range(b):
        if k + AHEAD < b:  # a later row's first and last line: more misses in flight (perx._prefetch)
            ahead = slots[k + AHEAD] * words
            prefetch(rows64, ahead)
            prefetch(rows64, ahead + words - 1)
        s = slots[k]
        for j in range(words):
            tmp[k * words + j] = rows64[s, j]
    row_bytes = words * 8
    dst = 0
    for f in range(src.shape[0]):
        u = unit[f]
        w = nbytes[f] // u
        if u == 8:
            _copy_field(tmp, words, src[f] // 8, w, b, out.view(np.uint64), dst // 8)
        elif u == 4:
            _copy_field(tmp.view(np.uint32), row_bytes // 4, src[f] // 4, w, b, out.view(np.uint32), dst // 4)
        elif u == 2:
            _copy_field(tmp.view(np.uint16), row_bytes // 2, src[f] // 2, w, b, out.view(np.uint16), dst // 2)
        else:
            _copy_field(tmp.view(np.uint8), row_bytes, src[f], w, b, out, dst)
        dst += (b * nbytes[f] + 7) // 8 * 8
