"""The sampler contract shared by every replay strategy, and id helpers for the numba kernels.

A sampler decides *which* stored transitions a batch holds and with what probability; the buffer owns
the data. Indices crossing this boundary are insertion ids (see :mod:`perx.storage`): id ``i`` lives
in slot ``i % capacity`` and is stale once ``i < next_id - capacity``.

Every sampler:
  * owns one ``np.random.Generator`` and saves its state with the rest of its state;
  * validates a whole update before touching anything, so a refused update changes nothing;
  * skips (and does not count) updates whose ids are stale;
  * returns, for each sampled transition, its exact probability P(i) under the current priorities
    and its importance-sampling weight.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from numba import njit

from perx._validation import _short

#: Kernel return codes (>= 0 means "applied this many").
BAD_VALUE = -1
BAD_ID = -2


@njit(cache=True, nogil=True)
def ids_of_slots(slots, next_id, capacity):
    """Insertion ids of the transitions now stored in ``slots`` (int64 [B])."""
    head = next_id % capacity
    base = next_id - head
    out = np.empty(slots.shape[0], np.int64)
    for b in range(slots.shape[0]):
        s = slots[b]
        out[b] = base + s if s < head else base - capacity + s
    return out


@njit(cache=True, nogil=True)
def check_update(ids, values, next_id, capacity, raw):
    """BAD_VALUE / BAD_ID for the first problem in an update, else the number of live ids. Reads only."""
    for b in range(ids.shape[0]):
        v = values[b]
        if not np.isfinite(v) or (raw and v < 0.0):
            return BAD_VALUE
    live = 0
    for b in range(ids.shape[0]):
        if ids[b] < 0 or ids[b] >= next_id:
            return BAD_ID
        if ids[b] >= next_id - capacity:
            live += 1
    return live


def raise_bad_update(code: int, ids: np.ndarray, values: np.ndarray, next_id: int, raw: bool) -> None:
    """Turn a kernel's error code into a ValueError that names the argument and the value."""
    if code == BAD_VALUE:
        name = "priorities" if raw else "td_errors"
        bad = ~np.isfinite(values) | ((values < 0) if raw else False)
        pos = int(np.flatnonzero(bad)[0])
        rule = "finite and >= 0" if raw else "finite (NaN and inf are refused)"
        raise ValueError(f"{name}: must be {rule}; got {values[pos]!r} at position {pos}")
    if code == BAD_ID:
        bad = (ids < 0) | (ids >= next_id)
        pos = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"indices: {int(ids[pos])} (position {pos}) was never issued by this buffer; "
            f"issued ids are 0..{next_id - 1}"
        )
    raise AssertionError(f"unknown kernel code {code}")


class Sampler:
    """Base class of the replay strategies (``perx.Uniform``, ``perx.Proportional``, ...).

    A sampler is bound to exactly one buffer, which calls ``_bind(capacity)`` once.
    """

    name: ClassVar[str] = "Sampler"
    #: Registry used by ``ReplayBuffer.load`` to rebuild a sampler from its saved name.
    registry: ClassVar[dict[str, type[Sampler]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # concrete samplers name themselves; shared bases do not
            Sampler.registry[cls.name] = cls

    def __init__(self, *, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)
        self.capacity: int | None = None

    # -- configuration -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Constructor keyword arguments that rebuild an equivalent (unbound) sampler."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"

    def reseed(self, seed: int | None) -> None:
        """Replace the generator by ``np.random.default_rng(seed)``."""
        self._rng = np.random.default_rng(seed)

    @property
    def rng(self) -> np.random.Generator:
        return self._rng

    def _bind(self, capacity: int) -> None:
        if self.capacity is not None:
            raise ValueError(f"sampler: {self!r} is already bound to a buffer; create a new sampler")
        self.capacity = capacity
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        pass

    # -- the hot path --------------------------------------------------------------------------
    def on_add(self, slots: np.ndarray, ids: np.ndarray) -> None:
        """New transitions with insertion ``ids`` were written to ``slots`` (int64 [n], distinct)."""

    def sample(self, batch_size: int, beta: float, size: int, next_id: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Draw ``batch_size`` transitions from the ``size`` stored ones.

        Returns:
            (slots int64 [B], ids int64 [B], probabilities float64 [B], weights float64 [B]).
        """
        raise NotImplementedError

    def update(self, ids: np.ndarray, values: np.ndarray, next_id: int, *, raw: bool) -> int:
        """Apply new TD errors (``raw=False``) or priorities (``raw=True``); return how many applied.

        ``ids`` int64 [B] and ``values`` float64 [B] have equal lengths (the buffer checked that).
        Stale ids are skipped; bad values or never-issued ids raise ValueError with nothing changed.
        """
        code = check_update(ids, values, next_id, self.capacity, raw)
        if code < 0:
            raise_bad_update(code, ids, values, next_id, raw)
        return code

    def probabilities(self, slots: np.ndarray, size: int, batch_size: int | None = None) -> np.ndarray:
        """Exact per-draw probability P(i) of the transitions in ``slots`` (float64 [B]).

        ``batch_size`` matters only to samplers whose distribution depends on it (rank-based
        segments, greedy top-k); the others ignore it.
        """
        raise NotImplementedError

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(JSON-able metadata, arrays) that restore this sampler exactly, RNG included."""
        state = self._rng.bit_generator.state
        return {"rng": state}, {}

    def load_state_dict(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        rng_state = meta["rng"]
        bit_generator = getattr(np.random, rng_state["bit_generator"])()
        bit_generator.state = rng_state
        self._rng = np.random.Generator(bit_generator)


def restore(target: np.ndarray, arrays: dict[str, np.ndarray], name: str) -> None:
    """Copy a saved array into ``target`` in place, refusing a shape that does not match."""
    saved = arrays[name]
    if saved.shape != target.shape:
        raise ValueError(f"{name}: saved shape {saved.shape} != expected {target.shape}")
    target[:] = saved


def check_sampler(sampler: object) -> Sampler:
    if not isinstance(sampler, Sampler):
        raise TypeError(f"sampler: expected a perx sampler such as perx.Proportional(), "
                        f"got {_short(sampler)}")
    return sampler
