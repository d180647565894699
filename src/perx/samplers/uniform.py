"""Uniform experience replay: every stored transition has probability 1/N (000 eq. 1 with alpha = 0)."""

from __future__ import annotations

import numpy as np

from perx.samplers.base import Sampler, ids_of_slots


class Uniform(Sampler):
    """Uniform sampling with replacement; probabilities 1/N, importance-sampling weights 1.

    Priority updates are validated exactly like a prioritized sampler's (so swapping samplers never
    hides a bug) and then ignored; the count of live ids is returned.

    Args:
        seed: seed of the sampler's own ``np.random.Generator`` (the buffer's ``seed`` overrides it).
    """

    name = "Uniform"

    def sample(self, batch_size, beta, size, next_id):
        slots = self._rng.integers(0, size, batch_size)
        ids = ids_of_slots(slots, next_id, self.capacity)
        return slots, ids, np.full(batch_size, 1.0 / size), np.ones(batch_size)

    def probabilities(self, slots, size):
        return np.full(len(slots), 1.0 / size)
