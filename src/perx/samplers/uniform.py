"""Uniform experience replay: every stored transition has probability 1/N (000 eq. 1 with alpha = 0)."""

from __future__ import annotations

import numpy as np
from numba import njit

from perx._jit import Entry, array, int64, uint8, uint64
from perx.samplers.base import Sampler, ids_of_slots
from perx.storage import _gather_rows


@njit(cache=True, nogil=True)
def _finish(slots, size, next_id, capacity):
    # One kernel call instead of three small numpy ones: ids, P(i) = 1/N, weights = 1.
    n = slots.shape[0]
    return slots, ids_of_slots(slots, next_id, capacity), np.full(n, 1.0 / size), np.ones(n)


@njit(cache=True, nogil=True)
def _finish_gather(pool, at, n, size, next_id, capacity, rows64, plan, out):
    # _finish of the slots pool[at : at + n] (Sampler._numbers's block, sliced here) into the batch bytes (ids,
    # probabilities, weights), then the rows: one call, nothing handed back
    slots = pool[at : at + n]
    out[: 8 * n].view(np.int64)[:] = ids_of_slots(slots, next_id, capacity)
    out[8 * n : 16 * n].view(np.float64)[:] = 1.0 / size
    out[16 * n : 24 * n].view(np.float64)[:] = 1.0
    _gather_rows(rows64, slots, out[24 * n :], plan)


#: :func:`_finish_gather` without type dispatch (perx._jit): slots from the sampler's generator (a block or
#: a fresh array), the storage's rows and plan, the batch bytes made right before the call
_FINISH_GATHER = Entry(_finish_gather, (array(int64, 1), int64, int64, int64, int64, int64, array(uint64, 2),
                                        array(int64, 2), array(uint8, 1)))


class Uniform(Sampler):
    """Uniform sampling with replacement; probabilities 1/N, importance-sampling weights 1.

    Priority updates are validated exactly like a prioritized sampler's (so swapping samplers never
    hides a bug) and then ignored; the count of live ids is returned.

    Args:
        seed: seed of the sampler's own ``np.random.Generator`` (the buffer's ``seed`` overrides it).
    """

    name = "Uniform"

    def on_add_one(self, slot, id):
        pass  # nothing to record, as in on_add

    def on_add_range(self, first, ids):
        pass

    def _slots(self, batch_size: int, size: int) -> np.ndarray:
        """``self._rng.integers(0, size, batch_size)``: from a block drawn ahead once the buffer is full (the
        range then stays the same; while it fills, every add changes it and a block would be drawn for
        nothing)."""
        if size == self.capacity:
            return self._numbers(batch_size, size)
        return self._rng.integers(0, size, batch_size)  # (self._rng: brought level with any block first)

    def sample(self, batch_size, beta, size, next_id):
        return _finish(self._slots(batch_size, size).copy(), size, next_id, self.capacity)

    fuses_gather = True

    def sample_gather(self, batch_size, beta, size, next_id, rows64, plan, out):
        # _slots and Sampler._numbers inlined, the kernel slicing the block itself: no Python calls and no
        # slice object per sample
        pool = self._pool
        cur = self._cursor
        at = cur[0]
        if pool is not None and self._pool_kind == size and at < at + batch_size <= pool.shape[0]:
            cur[0] = at + batch_size
        else:
            pool, at = self._slots(batch_size, size), 0
        _FINISH_GATHER.fn(pool, at, batch_size, size, next_id, self.capacity, rows64, plan, out)

    def sample_distinct(self, batch_size, beta, size, next_id):
        """A uniformly random subset; each draw's probability is still 1/N and every weight 1."""
        slots = self._rng.choice(size, batch_size, replace=False).astype(np.int64)
        return _finish(slots, size, next_id, self.capacity)

    def probabilities(self, slots, size, batch_size=None):
        return np.full(len(slots), 1.0 / size)

    def mass_totals(self, size):
        return float(size), 1.0  # every transition has mass 1
