"""Dict fields (Gymnasium ``Dict`` observations): their names, their checks, and how observations are packed.

A field whose value is a dict of arrays (``obs={"observation": ..., "desired_goal": ...}``) is stored as
ordinary fields, one per key, named ``field + SEP + key`` (``"obs.observation"``), so the storage, the samplers
and their compiled kernels never see a dict. The one exception is the observation field of an episodic buffer
(``perx.Episodes``: ``obs`` and ``next_obs``): its keys are packed side by side into one unit of 8-byte words
per observation (per frame with stacks, :class:`DictLayout`), so that the episode store keeps one unit per step
and links, shares and stacks it exactly as a plain observation; it is compared key by key and unpacked into a
dict at sample time.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from perx.storage import FieldSpec
from perx.validation import _short

#: Separator of a dict field's stored names: ``"obs" + SEP + "observation"``.
SEP = "."


def flat_name(field: str, key: str) -> str:
    return f"{field}{SEP}{key}"


#: Types that are never dicts, told apart without ``isinstance(value, Mapping)`` (an ABC check, through
#: ``ABCMeta.__instancecheck__`` and its caches: several times the cost of a frozenset lookup of the type)
_NOT_DICT = frozenset((np.ndarray, bool, int, float, list, tuple, np.bool_, np.int8, np.int16, np.int32, np.int64,
                       np.uint8, np.uint16, np.uint32, np.uint64, np.float16, np.float32, np.float64))


def is_dict(value: object) -> bool:
    """Whether ``value`` is a dict (any Mapping) given for a dict field."""
    kind = type(value)
    if kind is dict:
        return True
    return kind not in _NOT_DICT and isinstance(value, Mapping)


def dict_keys(name: str, value: Mapping) -> tuple[str, ...]:
    """The keys of a dict given for field ``name``, checked: at least one, non-empty strings, one level deep."""
    if not value:
        raise ValueError(f"{name}: an empty dict; a dict field needs at least one key")
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{name}: the keys of a dict field must be non-empty strings, got {key!r}")
        if is_dict(item):
            raise TypeError(f"{flat_name(name, key)}: nested dicts are not supported (one level of keys); got "
                            f"{_short(item)}")
    return tuple(value)


def check_keys(name: str, value: Mapping, keys: tuple[str, ...]) -> None:
    """Raise (ValueError naming the field and the keys) unless ``value`` has exactly ``keys``, or (TypeError) if one
    of its values is a dict."""
    if len(value) != len(keys) or any(k not in value for k in keys):
        missing = [k for k in keys if k not in value]
        extra = [k for k in value if k not in keys]
        raise ValueError(f"{name}: the dict has missing keys {missing} and unexpected keys {_short(extra)}; this "
                         f"buffer's {name} has the keys {list(keys)}")
    for key in keys:
        if is_dict(value[key]):
            raise TypeError(f"{flat_name(name, key)}: nested dicts are not supported (one level of keys); got "
                            f"{_short(value[key])}")


def same_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise equality of two arrays of equal shape, NaN equal to NaN."""
    eq = a == b
    if a.dtype.kind in "fc":
        eq |= (a != a) & (b != b)
    return np.all(eq.reshape(len(a), -1), axis=1)


class DictLayout:
    """The keys of a dict observation packed side by side into one unit of ``words`` uint64 words (each key at
    an offset aligned to its item size, widest first; the unit padded to whole words with zeros).

    Args:
        field: the observation field's name (for messages).
        keys: key -> :class:`FieldSpec` of one whole observation of that key (with the frame axis first when
            ``frames``), in the order the batch's dicts list them.
        frames: k with frame stacks (every key is a stack of k frames: Gymnasium's ``FrameStackObservation``
            stacks each key of a ``Dict`` space alike), else None.
    """

    def __init__(self, field: str, keys: Mapping[str, FieldSpec], frames: int | None = None) -> None:
        units = {}
        for key, f in keys.items():
            name = flat_name(field, key)
            if frames and (len(f.shape) == 0 or f.shape[0] != frames):
                raise ValueError(f"{name}: frame_stack={frames} needs every key's observations of shape ({frames}, "
                                 f"...), got {f.shape}")
            if f.dtype.kind not in "biufc" or f.dtype.alignment > 8:
                raise TypeError(f"{name}: observations of dtype {f.dtype} cannot be stored once")
            units[key] = f.shape[1:] if frames else f.shape
        order = sorted(keys, key=lambda k: -keys[k].dtype.alignment)  # widest first: every offset aligned
        offsets, pos = {}, 0
        for key in order:
            align = keys[key].dtype.alignment
            pos = -(-pos // align) * align
            offsets[key] = pos
            pos += int(np.prod(units[key], dtype=np.int64)) * keys[key].dtype.itemsize
        self.words = max(1, -(-pos // 8))
        self.field = field
        self.keys = {k: FieldSpec(tuple(f.shape), np.dtype(f.dtype)) for k, f in keys.items()}
        self.frames = frames
        #: one unit as a record: key -> [*unit shape] of its dtype
        formats = [keys[k].dtype if units[k] == () else (keys[k].dtype, units[k]) for k in keys]
        self.record = np.dtype({"names": list(keys), "formats": formats, "offsets": [offsets[k] for k in keys],
                                "itemsize": 8 * self.words})
        #: the packed observation as the episode store and the storage hold it
        self.spec = FieldSpec(((frames,) if frames else ()) + (self.words,), np.dtype(np.uint64))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DictLayout) and (self.keys, self.frames) == (other.keys, other.frames)

    __hash__ = None  # type: ignore[assignment]  # deliberately unhashable (equality is by value)

    def pack(self, values: Mapping[str, np.ndarray], lead: tuple[int, ...]) -> np.ndarray:
        """uint64 [*lead, words] from key -> array [*lead, *unit] (checked and cast beforehand)."""
        out = np.zeros((*lead, self.words), np.uint64)
        rec = out.view(self.record)[..., 0]
        for key in self.keys:
            rec[key] = values[key]
        return out

    def _records(self, words: np.ndarray) -> np.ndarray:
        return words.view(self.record)[..., 0]

    def unpack(self, words: np.ndarray) -> dict[str, np.ndarray]:
        """key -> a C-contiguous copy [*lead, *unit] of packed ``words`` [*lead, words]."""
        rec = self._records(words)
        return {key: np.ascontiguousarray(rec[key]) for key in self.keys}

    def same_rows(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Row-wise equality of two packed arrays [rows, ..., words], key by key and by value (NaN equal to NaN,
        -0.0 to 0.0; the padding is not compared)."""
        # the words first: equal words are equal values (the padding is zero wherever perx packs), so only rows that
        # differ in a word are compared key by key (by value: NaN payloads, -0.0)
        eq = np.all((a == b).reshape(len(a), -1), axis=1)
        if eq.all():
            return eq
        rows = np.flatnonzero(~eq)
        ra, rb = self._records(a[rows]), self._records(b[rows])
        same = np.ones(len(rows), np.bool_)
        for key in self.keys:
            same &= same_rows(ra[key], rb[key])
        eq[rows] = same
        return eq

    def which_key(self, a: np.ndarray, b: np.ndarray) -> str:
        """" (key 'k')" for the first key in which the packed rows ``a`` and ``b`` differ, for messages."""
        ra, rb = self._records(a[None]), self._records(b[None])
        for key in self.keys:
            if not same_rows(ra[key], rb[key])[0]:
                return f" (key {key!r})"
        return ""

    def to_json(self) -> list:
        return [[key, list(f.shape), f.dtype.str] for key, f in self.keys.items()]
