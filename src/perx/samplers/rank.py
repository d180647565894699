"""Rank-based prioritized replay (Schaul et al. 2016, Sec. 3.3 and App. B.2.1).

p_i = 1 / rank(i), rank by |delta| (largest first), so the target distribution is the power law
``P(rank r) = r^-alpha / sum_{j=1..N} j^-alpha``.

As in the paper, the cumulative distribution is approximated piecewise linearly by k = batch_size
segments of equal probability, and one transition is drawn uniformly inside each segment
(stratified). Segment j holds the rank positions whose mass meets the quantile slice [j/k, (j+1)/k),
so neighbours share a straddling position and a rank heavier than 1/k lies in several segments (the
head of the power law is kept). The exact per-draw probability of position h is therefore
``(1/k) * sum_{j: h in segment j} 1 / L_j``; ``batch.probabilities`` report it and the IS weights use
it, so the weights correct for what is actually drawn. Boundaries are cached per k and reused while N
grows by at most ``SEGMENT_REUSE`` (the last segment stretches over the new positions), as the paper
reuses its partition for nearby N. With fewer stored transitions than k the sampler inverts the exact
power-law CDF at stratified targets instead.

Two orders:
  * heap mode (default): the rank positions are the positions of an array-based binary max-heap,
    used directly as an approximately sorted array and fully re-sorted every ``sort_every`` priority
    updates (000 App. B.2.1). Updates cost O(log N).
  * ``exact=True``: a truly sorted order kept in a ``sortedcontainers.SortedList``; O(log N) per update
    too, with a larger constant (Python-level).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perx._validation import check_bool, check_choice, check_optional_positive_int, check_real
from perx.samplers import _heap
from perx.samplers.base import Sampler, check_update, raise_bad_update, restore

#: Reuse cached segment boundaries while N <= N_ref * (1 + SEGMENT_REUSE).
SEGMENT_REUSE = 0.01
#: Below this many transitions boundaries are recomputed whenever N changes (it costs O(N)).
SEGMENT_EXACT_BELOW = 2048


def power_law(n: int, alpha: float) -> np.ndarray:
    """P(rank r) = r^-alpha / sum_j j^-alpha for r = 1..n (000 Sec. 3.3), float64 [n]."""
    mass = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    return mass / mass.sum()


def rank_segments(n: int, k: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """The k equal-probability segments of the power law over n rank positions (000 Sec. 3.3).

    Segment j holds every rank position whose probability mass intersects the quantile slice
    [j/k, (j+1)/k): positions ``lo[j] .. hi[j] - 1``. Consecutive segments share the position that
    straddles their common quantile, and a rank heavier than 1/k belongs to several segments, so the
    piecewise-linear CDF keeps the head of the power law. Every segment holds at least one position;
    each holds mass between 1/k and 1/k plus its two straddling positions. Cost O(n).

    Returns:
        (lo, hi): int64 [k] each, nondecreasing, ``lo[0] == 0``, ``hi[-1] == n``.
    """
    if n < 1 or k < 1:
        raise ValueError(f"n and k: need n >= 1 and k >= 1, got n={n}, k={k}")
    cum = np.concatenate(([0.0], np.cumsum(power_law(n, alpha))))  # cum[m] = mass of positions < m
    cum[-1] = 1.0
    q = np.arange(k + 1) / k
    lo = np.searchsorted(cum, q[:-1], side="right") - 1  # the position containing quantile j/k
    hi = np.searchsorted(cum, q[1:], side="left")  # one past the position containing (j+1)/k
    return lo.astype(np.int64), hi.astype(np.int64)


def segment_prefix(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """cum_inv[j] = sum_{i < j} 1 / L_i, float64 [k + 1]; shared by every probability computation so
    that the sampler's kernel and :func:`segment_probabilities` agree to the last bit."""
    return np.concatenate(([0.0], np.cumsum(1.0 / (hi - lo))))


@njit(cache=True, nogil=True)
def _segment_draw(lo, hi, cum_inv, seg, u, beta, use_weights, batch_norm, p_min):
    """Draw b picks a position uniformly inside segment seg[b]; returns positions, their exact per-draw
    probabilities and IS weights. Each draw's segment is uniform over the k segments (stratified when
    seg = 0..k-1), so the per-draw probability of a position is the same in both modes."""
    k = lo.shape[0]
    n = u.shape[0]
    positions = np.empty(n, np.int64)
    probs = np.empty(n)
    weights = np.ones(n)
    smallest = np.inf
    for b in range(n):
        j = seg[b]
        h = lo[j] + np.int64(u[b] * (hi[j] - lo[j]))
        if h >= hi[j]:  # u * length rounded up to length
            h = hi[j] - 1
        positions[b] = h
        # the segments holding h form a run first..last-1 around j (lo and hi are nondecreasing)
        first = j
        while first > 0 and hi[first - 1] > h:
            first -= 1
        last = j + 1
        while last < k and lo[last] <= h:
            last += 1
        probs[b] = (cum_inv[last] - cum_inv[first]) / k
        if probs[b] < smallest:
            smallest = probs[b]
    if use_weights and beta > 0.0:
        # w = (N P)^-beta / max_i (N P_i)^-beta = (P / P_min)^-beta, P_min over the buffer or batch
        ref = smallest if batch_norm else p_min
        for b in range(n):
            weights[b] = (probs[b] / ref) ** -beta
    return positions, probs, weights


def segment_probabilities(lo: np.ndarray, hi: np.ndarray, positions: np.ndarray,
                          cum_inv: np.ndarray | None = None) -> np.ndarray:
    """Exact per-draw probability of each rank position under stratified segment sampling:
    ``(1/k) * sum_{j: lo[j] <= h < hi[j]} 1 / (hi[j] - lo[j])``."""
    k = len(lo)
    if cum_inv is None:
        cum_inv = segment_prefix(lo, hi)
    first = np.searchsorted(hi, positions, side="right")  # first segment with hi > h
    last = np.searchsorted(lo, positions, side="right")  # one past the last segment with lo <= h
    return (cum_inv[last] - cum_inv[first]) / k


def _smallest_probability(lo: np.ndarray, hi: np.ndarray, cum_inv: np.ndarray) -> float:
    # The per-draw probability is constant between consecutive segment ends, so checking the start
    # of each such piece finds the minimum over all positions in O(k log k).
    starts = np.unique(np.concatenate((lo, hi[:-1])))
    return float(segment_probabilities(lo, hi, starts, cum_inv).min())


class _HeapSampler(Sampler):
    """Shared state of the heap-based samplers: the heap arrays of :mod:`perx.samplers._heap`."""

    def _allocate(self, capacity):
        self._keys = np.zeros(capacity)
        self._ids = np.zeros(capacity, np.int64)
        self._pos = np.full(capacity, -1, np.int64)
        self._state = np.zeros(2, np.int64)  # [size, priority updates since the last full sort]

    def state_dict(self):
        meta, arrays = super().state_dict()
        arrays.update(keys=self._keys, ids=self._ids, pos=self._pos, state=self._state)
        return meta, arrays

    def load_state_dict(self, meta, arrays):
        super().load_state_dict(meta, arrays)
        for name in ("keys", "ids", "pos", "state"):
            restore(getattr(self, f"_{name}"), arrays, name)


class RankBased(_HeapSampler):
    """Rank-based prioritization: P(i) proportional to rank(i)^-alpha, rank by |delta| (000 Sec. 3.3).

    Args:
        alpha: power-law exponent, >= 0 (the paper's tuned value for Double DQN is 0.7).
        segments: number of equal-probability segments k. None (default): k = batch size and each
            batch draws once per segment (stratified). An int: each draw picks one of the k segments
            uniformly at random (stratified again when the batch size equals k) -- for small batches,
            such as the single-transition updates of the Blind Cliffwalk.
        sort_every: fully re-sort the heap after this many priority updates (heap mode). None means
            ``capacity`` (see docs/rank_based.md for the measured approximation error against it).
        exact: keep a truly sorted order (``sortedcontainers``) instead of the heap approximation.
        normalize: IS weights divided by the largest weight any stored transition could get
            (``"buffer"``, default: it belongs to the lowest-probability ranks, inside the last
            segment) or by the largest in the batch (``"batch"``).
        seed: seed of the sampler's own ``np.random.Generator``.

    New transitions enter at maximal priority: key +inf, above every replayed transition (oldest
    first among them), so each new transition sits at the top ranks until it is replayed.
    """

    name = "RankBased"

    def __init__(self, alpha: float = 0.7, *, segments: int | None = None, sort_every: int | None = None,
                 exact: bool = False, normalize: str = "buffer", seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self.alpha = check_real(alpha, "alpha", low=0.0)
        self.n_segments = check_optional_positive_int(segments, "segments")
        self.sort_every = check_optional_positive_int(sort_every, "sort_every")
        self.exact = check_bool(exact, "exact")
        self.normalize = check_choice(normalize, "normalize", ("buffer", "batch"))
        self._segments: dict[int, tuple[int, np.ndarray]] = {}
        if exact:
            try:
                import sortedcontainers  # noqa: F401
            except ImportError as err:  # pragma: no cover - depends on the environment
                raise ImportError("exact=True needs sortedcontainers: pip install 'perx[exact]'") from err

    def config(self):
        return {"alpha": self.alpha, "segments": self.n_segments, "sort_every": self.sort_every,
                "exact": self.exact, "normalize": self.normalize}

    def _allocate(self, capacity):
        super()._allocate(capacity)
        if self.exact:
            from sortedcontainers import SortedList

            # Entries (-key, id): ascending order = key descending, then id ascending (older first).
            self._sorted = SortedList()

    @property
    def _sort_every(self) -> int:
        return self.capacity if self.sort_every is None else self.sort_every

    # -- writes ----------------------------------------------------------------------------------
    def on_add(self, slots, ids):
        if not self.exact:
            _heap.heap_add(self._keys, self._ids, self._pos, self._state, slots, ids, self.capacity)
            return
        # Exact mode keeps keys and ids per slot (pos[slot] >= 0 marks an occupied slot).
        for s, i in zip(slots.tolist(), ids.tolist(), strict=True):
            if self._pos[s] >= 0:
                self._sorted.remove((-float(self._keys[s]), int(self._ids[s])))
            else:
                self._state[0] += 1
            self._pos[s] = 0
            self._keys[s] = np.inf
            self._ids[s] = i
            self._sorted.add((-np.inf, i))

    def update(self, ids, values, next_id, *, raw):
        if not self.exact:
            count = _heap.heap_update(self._keys, self._ids, self._pos, self._state, ids, values, next_id,
                                      self.capacity, raw)
            if count < 0:
                raise_bad_update(count, ids, values, next_id, raw)
            if self._state[1] >= self._sort_every:
                self.sort()
            return count
        code = check_update(ids, values, next_id, self.capacity, raw)
        if code < 0:
            raise_bad_update(code, ids, values, next_id, raw)
        oldest = next_id - self.capacity
        cap = self.capacity
        for i, v in zip(ids.tolist(), values.tolist(), strict=True):
            if i < oldest:
                continue
            s = i % cap
            self._sorted.remove((-float(self._keys[s]), i))
            key = v if raw else abs(v)
            self._keys[s] = key
            self._sorted.add((-key, i))
        return code

    def sort(self) -> None:
        """Fully sort the heap array now (heap mode); O(N log N). Called every ``sort_every`` updates."""
        if not self.exact:
            _heap.full_sort(self._keys, self._ids, self._pos, int(self._state[0]), self.capacity)
        self._state[1] = 0

    # -- sampling --------------------------------------------------------------------------------
    def boundaries(self, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """Cached (lo, hi, cum_inv, smallest per-draw probability) for n transitions, k segments."""
        cached = self._segments.get(k)
        if cached is not None:
            n_ref, lo, hi, cum_inv, p_min = cached
            if n == n_ref:
                return lo, hi, cum_inv, p_min
            if n_ref >= SEGMENT_EXACT_BELOW and n_ref < n <= n_ref * (1 + SEGMENT_REUSE):
                hi = hi.copy()
                hi[-1] = n  # the last (longest) segment stretches over the new positions
                cum_inv = segment_prefix(lo, hi)
                return lo, hi, cum_inv, _smallest_probability(lo, hi, cum_inv)
        lo, hi = rank_segments(n, k, self.alpha)
        cum_inv = segment_prefix(lo, hi)
        p_min = _smallest_probability(lo, hi, cum_inv)
        self._segments[k] = (n, lo, hi, cum_inv, p_min)
        return lo, hi, cum_inv, p_min

    def _positions_to_ids(self, positions: np.ndarray) -> np.ndarray:
        if not self.exact:
            return self._ids[positions]
        sl = self._sorted
        return np.array([sl[h][1] for h in positions.tolist()], np.int64)

    def _positions_of(self, slots: np.ndarray) -> np.ndarray:
        if not self.exact:
            return self._pos[slots]
        sl = self._sorted
        keys, ids = self._keys, self._ids
        return np.array([sl.index((-float(keys[s]), int(ids[s]))) for s in slots.tolist()], np.int64)

    def sample(self, batch_size, beta, size, next_id):
        k = batch_size if self.n_segments is None else self.n_segments
        if size >= k and k != batch_size:  # "sample a segment, then uniformly within it" (000 Sec. 3.3)
            seg = self._rng.integers(0, k, batch_size)
        else:  # one draw per segment: stratified (000 App. B.2.1)
            seg = np.arange(batch_size)
        u = self._rng.random(batch_size)
        use_weights = beta > 0.0
        if size >= k:
            lo, hi, cum_inv, p_min = self.boundaries(size, k)
            positions, probs, weights = _segment_draw(lo, hi, cum_inv, seg, u, beta, use_weights,
                                                      self.normalize == "batch", p_min)
        else:
            positions, probs, weights = self._small_draw(u, size, beta)
        ids = self._positions_to_ids(positions)
        return ids % self.capacity, ids, probs, weights

    def _small_draw(self, u, size, beta):
        # Fewer transitions than segments: invert the exact power-law CDF at stratified targets, so
        # each position's expected share of the batch is exactly its power-law probability.
        k = u.shape[0]
        pmf = power_law(size, self.alpha)
        cdf = np.cumsum(pmf)
        positions = np.minimum(np.searchsorted(cdf, (np.arange(k) + u) / k, side="right"), size - 1)
        probs = pmf[positions]
        ref = probs.min() if self.normalize == "batch" else pmf[-1]
        return positions, probs, (probs / ref) ** -beta

    def probabilities(self, slots, size, batch_size=None):
        """Per-draw probability of each transition in ``sample(batch_size)``, or, with
        ``batch_size=None``, the target power law at its current rank position."""
        positions = self._positions_of(slots)
        k = batch_size if self.n_segments is None else self.n_segments
        if k is None or size < k:
            return power_law(size, self.alpha)[positions]
        lo, hi, cum_inv, _ = self.boundaries(size, k)
        return segment_probabilities(lo, hi, positions, cum_inv)

    def ranks(self, slots: np.ndarray) -> np.ndarray:
        """Current rank position (0 = highest priority) of the transitions in ``slots``."""
        return self._positions_of(slots)

    def keys(self, slots: np.ndarray) -> np.ndarray:
        """Stored |delta| (+inf for not yet replayed) of the transitions in ``slots``."""
        if not self.exact:
            return self._keys[self._pos[slots]]
        return self._keys[slots]

    # -- state -----------------------------------------------------------------------------------
    def load_state_dict(self, meta, arrays):
        super().load_state_dict(meta, arrays)
        if self.exact:
            self._sorted.clear()
            occupied = np.flatnonzero(self._pos >= 0)
            self._sorted.update(zip((-self._keys[occupied]).tolist(), self._ids[occupied].tolist(),
                                    strict=True))


class Greedy(_HeapSampler):
    """Greedy TD-error prioritization (000 Sec. 3.2): ``sample(k)`` returns the k transitions with the
    largest stored |delta|, ties broken by insertion order (older first); weights 1.

    A binary max-heap gives the maximum in O(1), the top k in O(k log k) and an update in O(log N).
    New transitions enter at +inf, so every transition is replayed at least once before any
    transition is replayed twice. ``batch.probabilities`` are 1: the choice is deterministic.
    """

    name = "Greedy"

    def on_add(self, slots, ids):
        _heap.heap_add(self._keys, self._ids, self._pos, self._state, slots, ids, self.capacity)

    def update(self, ids, values, next_id, *, raw):
        count = _heap.heap_update(self._keys, self._ids, self._pos, self._state, ids, values, next_id,
                                  self.capacity, raw)
        if count < 0:
            raise_bad_update(count, ids, values, next_id, raw)
        return count

    def sample(self, batch_size, beta, size, next_id):
        if batch_size > size:
            raise ValueError(f"batch_size: Greedy returns distinct transitions, so batch_size must be "
                             f"<= {size} (the number stored), got {batch_size}")
        ids = self._ids[_heap.top_k(self._keys, self._ids, size, batch_size)]
        return ids % self.capacity, ids, np.ones(batch_size), np.ones(batch_size)

    def probabilities(self, slots, size, batch_size=None):
        """1 for transitions that ``sample(batch_size)`` returns (default 1: the maximum), else 0."""
        k = min(1 if batch_size is None else batch_size, size)
        top = self._ids[_heap.top_k(self._keys, self._ids, size, k)] % self.capacity
        return np.isin(slots, top).astype(np.float64)

    def keys(self, slots: np.ndarray) -> np.ndarray:
        return self._keys[self._pos[slots]]
