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
def _finish_gather(slots, size, next_id, capacity, rows64, plan, out):
    # _finish into the batch bytes (ids, probabilities, weights), then the rows: one call, nothing handed back
    n = slots.shape[0]
    out[: 8 * n].view(np.int64)[:] = ids_of_slots(slots, next_id, capacity)
    out[8 * n : 16 * n].view(np.float64)[:] = 1.0 / size
    out[16 * n : 24 * n].view(np.float64)[:] = 1.0
    _gather_rows(rows64, slots, out[24 * n :], plan)


#: :func:`_finish_gather` without type dispatch (perx._jit): slots from the sampler's generator, the storage's
#: rows and plan, the batch bytes made right before the call
_FINISH_GATHER = Entry(_finish_gather, (array(int64, 1), int64, int64, int64, array(uint64, 2), array(int64, 2),
                                        array(uint8, 1)))


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

    def sample(self, batch_size, beta, size, next_id):
        slots = self._rng.integers(0, size, batch_size)
        return _finish(slots, size, next_id, self.capacity)

    fuses_gather = True

    def sample_gather(self, batch_size, beta, size, next_id, rows64, plan, out):
        _FINISH_GATHER.fn(self._rng.integers(0, size, batch_size), size, next_id, self.capacity, rows64, plan, out)

    def sample_distinct(self, batch_size, beta, size, next_id):
        """A uniformly random subset; each draw's probability is still 1/N and every weight 1."""
        slots = self._rng.choice(size, batch_size, replace=False).astype(np.int64)
        return _finish(slots, size, next_id, self.capacity)

    def probabilities(self, slots, size, batch_size=None):
        return np.full(len(slots), 1.0 / size)

    def mass_totals(self, size):
        return float(size), 1.0  # every transition has mass 1
