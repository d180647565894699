"""Greedy TD-error prioritization (Schaul et al. 2016, Sec. 3.2): a batch of k is the k stored transitions with
the largest |delta|, ties broken by insertion order; deterministic, so every weight is 1.

The heap and its kernels are :mod:`perx.samplers._greedy`; the saved state has the layout of RankBased's heap
(:mod:`perx.samplers._heap`), whose checks a load reuses.
"""

from __future__ import annotations

import numpy as np

from perx.samplers import _greedy, _heap
from perx.samplers.base import Sampler, add_fits, check_int, raise_bad_update, update_fits


class Greedy(Sampler):
    """Greedy TD-error prioritization (000 Sec. 3.2): ``sample(k)`` returns the k transitions with the
    largest stored |delta|, ties broken by insertion order (older first); weights 1.

    A binary max-heap without a position map (:mod:`perx.samplers._greedy`): an update pushes a new entry
    (O(1) expected for a random key) and leaves the old one stale, ``sample(k)`` pops until k live entries
    came out (O(k log N)), stale entries drop out as they surface. What it returns depends only on the
    stored keys and ids, so this gives the same batches as a heap with a position map (``RankBased``'s),
    without the position writes that are half of such a heap's update. Memory: 30 bytes per transition
    (a heap array of capacity * 9/8 entries of 16 bytes, the slots' stamps and keys).
    New transitions enter at +inf, so every transition is replayed at least once before any
    transition is replayed twice. ``batch.probabilities`` are 1: the choice is deterministic.
    """

    name = "Greedy"

    def _allocate(self, capacity):
        self._heap, self._cur, self._key, self._meta = _greedy.allocate(capacity)
        self._pid = np.zeros(0, np.int64)
        self._pstamp = np.zeros(0, np.int64)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if self.capacity is None:  # unbound: no heap was allocated yet
            return
        self._heap = _greedy.allocate_heap(self.capacity)  # a copy on a 64-byte boundary again (speed only)
        self._heap[:] = state["_heap"]

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self._heap, self._cur, self._key, self._meta, self._pid, self._pstamp

    def on_add(self, slots, ids):
        add = _greedy.ADD.fn if add_fits(slots, ids) else _greedy.add
        add(*self._arrays(), slots, ids, self.capacity)

    def on_add_one(self, slot, id):
        _greedy.ADD_ONE.fn(*self._arrays(), slot, id, self.capacity)

    def update(self, ids, values, next_id, *, raw):
        update = _greedy.UPDATE.fn if update_fits(ids, values) else _greedy.update
        count = update(*self._arrays(), ids, values, next_id, self.capacity, raw)
        if count < 0:
            raise_bad_update(count, ids, values, next_id, raw)
        return count

    def _pending_room(self, k: int) -> None:
        if len(self._pid) < k:  # room for k pending entries; the current ones are kept
            grown = max(k, 2 * len(self._pid), 64)
            pending = int(self._meta[_greedy.PENDING])
            self._pid = np.concatenate((self._pid[:pending], np.zeros(grown - pending, np.int64)))
            self._pstamp = np.concatenate((self._pstamp[:pending], np.zeros(grown - pending, np.int64)))

    def _top(self, k: int) -> np.ndarray:
        self._pending_room(k)
        out = np.empty(k, np.int64)
        _greedy.top(*self._arrays(), self.capacity, k, out)
        return out

    @staticmethod
    def _check_k(batch_size: int, size: int) -> None:
        if batch_size > size:
            raise ValueError(f"batch_size: Greedy returns distinct transitions, so batch_size must be "
                             f"<= {size} (the number stored), got {batch_size}")

    def sample(self, batch_size, beta, size, next_id):
        self._check_k(batch_size, size)
        ids = self._top(batch_size)
        return ids % self.capacity, ids, np.ones(batch_size), np.ones(batch_size)

    fuses_gather = True

    def sample_gather(self, batch_size, beta, size, next_id, rows64, plan, out):
        self._check_k(batch_size, size)
        self._pending_room(batch_size)
        _greedy.TOP_GATHER.fn(*self._arrays(), self.capacity, batch_size, rows64, plan, out)

    def sample_distinct(self, batch_size, beta, size, next_id):
        return self.sample(batch_size, beta, size, next_id)  # the top k are distinct already

    def probabilities(self, slots, size, batch_size=None):
        """1 for transitions that ``sample(batch_size)`` returns (default 1: the maximum), else 0."""
        k = min(1 if batch_size is None else batch_size, size)
        return np.isin(slots, self._top(k) % self.capacity).astype(np.float64)

    def keys(self, slots: np.ndarray) -> np.ndarray:
        """Stored |delta| (+inf for not yet replayed) of the transitions in ``slots``."""
        return self._key[slots]

    # -- state -----------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self._heap, self._cur, self._key, self._meta, self._pid, self._pstamp))

    def state_dict(self):
        """The live (key, id) pairs as RankBased's heap arrays hold them, sorted (a sorted array is a valid
        heap): ``keys``/``ids`` by position, ``pos`` by slot, ``state`` = [size, updates applied]."""
        meta, arrays = super().state_dict()
        cap = self.capacity
        keys, ids = _greedy.live_entries(*self._arrays(), cap)
        if len(keys) != self._meta[_greedy.LIVE]:
            raise AssertionError("Greedy: the heap lost a live transition")  # cannot happen; never save it
        n = len(keys)
        saved_keys, saved_ids = np.zeros(cap), np.zeros(cap, np.int64)
        saved_keys[:n], saved_ids[:n] = keys, ids
        pos = np.full(cap, -1, np.int64)
        _heap.full_sort(saved_keys, saved_ids, pos, n, cap)  # RankBased's heap order, positions by slot
        arrays.update(keys=saved_keys, ids=saved_ids, pos=pos,
                      state=np.array([n, self._meta[_greedy.UPDATES]], np.int64))
        return meta, arrays

    def _load_state(self, meta, arrays, *, size, next_id):
        super()._load_state(meta, arrays, size=size, next_id=next_id)
        keys, ids, pos, state = (arrays[name] for name in ("keys", "ids", "pos", "state"))
        if state[0] != size:
            raise ValueError(f"state: the heap holds {state[0]} entries but the buffer {size} transitions")
        check_int(state[1], "state[1] (priority updates applied)", 0, np.iinfo(np.int64).max)
        _heap.check_heap(keys, ids, pos, size, next_id, self.capacity)
        # valid: a binary heap in the same order, so its first `size` entries are this heap's entries
        self._allocate(self.capacity)
        base = max(next_id - self.capacity, 0)  # the oldest live id
        self._heap[1:size + 1, 0] = np.abs(keys[:size]).view(np.int64)  # as _greedy._push stores them
        self._heap[1:size + 1, 1] = (ids[:size] - base) << self._meta[_greedy.VBITS]  # stamp 0
        slots = ids[:size] % self.capacity
        self._cur[slots], self._key[slots] = 0, keys[:size]
        self._meta[[_greedy.HEAP, _greedy.LIVE, _greedy.UPDATES, _greedy.BASE]] = size, size, state[1], base
