"""Argument checks shared by every layer (core, agents, integrations, distributed). Every error names the
argument and shows the offending value; a public module so that layers above the core need no private import."""

from __future__ import annotations

import numbers

import numpy as np


def short(value: object) -> str:
    """``repr(value)`` cut to 120 characters: how every error message shows the offending value."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


_short = short  # the name the core's modules import it under


def check_positive_int(value: object, name: str) -> int:
    """An int > 0 (bools refused): TypeError for a non-integer, ValueError for <= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected a positive int, got {_short(value)}")
    if value <= 0:
        raise ValueError(f"{name}: must be > 0, got {value!r}")
    return int(value)


def check_optional_positive_int(value: object, name: str) -> int | None:
    """None, or an int > 0 (see :func:`check_positive_int`)."""
    return None if value is None else check_positive_int(value, name)


def check_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {_short(value)}")
    return value


def check_capacity(capacity: object) -> int:
    return check_positive_int(capacity, "capacity")


def check_batch_size(batch_size: object) -> int:
    return check_positive_int(batch_size, "batch_size")


def check_real(value: object, name: str, *, low: float | None = None, high: float | None = None,
               low_open: bool = False) -> float:
    """A finite real number within [low, high] (or (low, high] with ``low_open``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {_short(value)}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        bound = f"> {low}" if low_open else f">= {low}"
        raise ValueError(f"{name}: must be {bound}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{name}: must be <= {high}, got {value!r}")
    return value


def check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name}: must be one of {choices}, got {_short(value)}")
    return str(value)


_PLAIN = (np.generic, int, float, bool, list, tuple)


def to_numpy(value: object) -> np.ndarray:
    """``value`` as a numpy array. Tensors of array libraries (torch: on any device, with or without
    grad) are detached and copied to host memory by duck typing, so the core never imports them."""
    if type(value) is np.ndarray:
        return value
    if isinstance(value, _PLAIN):
        return np.asarray(value)
    detach = getattr(value, "detach", None)
    if detach is not None and hasattr(value, "cpu") and hasattr(value, "numpy"):
        return detach().cpu().numpy()
    return np.asarray(value)


def _as_array(values: object, name: str) -> np.ndarray:
    """:func:`to_numpy`, with numpy's error for a ragged sequence replaced by one naming the argument."""
    try:
        return to_numpy(values)
    except ValueError:  # numpy: "setting an array element with a sequence" / "inhomogeneous shape"
        raise ValueError(f"{name}: expected a 1-D array of numbers, got a ragged sequence "
                         f"{_short(values)}") from None


def as_index_array(values: object, name: str, *, upper: int | None = None) -> np.ndarray:
    """A 1-D int64 array (a scalar becomes shape [1]); rejects floats, bools and out-of-range values."""
    arr = _as_array(values, name)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of integers, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            return np.empty(0, np.int64)
        raise TypeError(f"{name}: expected integers, got dtype {arr.dtype} ({_short(values)})")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        # (the cast below would wrap it to a negative id, and the error would report that one)
        raise ValueError(f"{name}: {int(arr.max())} is larger than any id (int64)")
    arr = arr.astype(np.int64, copy=False)
    if upper is not None and arr.size and (arr.min() < 0 or arr.max() >= upper):
        bad = arr[(arr < 0) | (arr >= upper)][0]
        raise ValueError(f"{name}: must lie in [0, {upper}), got {int(bad)}")
    return np.ascontiguousarray(arr)


def as_value_array(values: object, name: str, *, length: int) -> np.ndarray:
    """A 1-D float64 array of the given length (a scalar becomes shape [1]); bools are refused."""
    arr = _as_array(values, name)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {arr.shape}")
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected real numbers, got dtype {arr.dtype} ({_short(values)})")
    if arr.shape[0] != length:
        raise ValueError(f"{name}: has {arr.shape[0]} values but the indices have {length}")
    return np.ascontiguousarray(arr, dtype=np.float64)
