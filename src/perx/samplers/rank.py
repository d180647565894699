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
  * ``exact=True``: a truly sorted order, kept in a compiled list of sorted blocks with a Fenwick tree
    over the block sizes (:mod:`perx.samplers._ordered`); O(log N + block) per update.
"""

from __future__ import annotations

from typing import cast

import numpy as np
from numba import njit

from perx._jit import Entry, array, boolean, float64, int64, loose, uint8, uint64
from perx._prefetch import AHEAD, prefetch
from perx.samplers import _heap, _ordered
from perx.samplers.base import Sampler, add_fits, check_int, check_update, raise_bad_update, update_fits
from perx.samplers.greedy import Greedy  # noqa: F401  (lived here: old imports and pickles find it by this name)
from perx.storage import _gather_rows
from perx.validation import check_bool, check_choice, check_optional_positive_int, check_real

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
    piecewise-linear CDF keeps the head of the power law. A quantile that falls on a boundary between
    two positions (within the rounding of the cumulative sum, e.g. every quantile when alpha = 0 and
    k divides n) is shared by none. Every segment holds at least one position, every position lies in
    at least one segment, and each segment holds mass between 1/k and 1/k plus its two straddling
    positions. Cost O(n).

    Returns:
        (lo, hi): int64 [k] each, nondecreasing, ``lo[0] == 0``, ``hi[-1] == n``.
    """
    if n < 1 or k < 1:
        raise ValueError(f"n and k: need n >= 1 and k >= 1, got n={n}, k={k}")
    cum = np.concatenate(([0.0], np.cumsum(power_law(n, alpha))))  # cum[m] = mass of positions < m
    cum[-1] = 1.0
    # The rounding error of a cumulative sum of n terms is below n * 2^-53 (relative to the total 1).
    tol = 4.0 * n * np.finfo(np.float64).eps
    q = np.arange(1, k) / k  # the interior quantiles
    m = np.searchsorted(cum, q, side="left")  # first boundary at or above q, in 1..n
    snap_up = cum[m] - q <= tol
    snap_down = ~snap_up & (q - cum[m - 1] <= tol)
    on_boundary = snap_up | snap_down
    boundary = np.where(snap_up, m, m - 1)
    # A straddled quantile: position m - 1 ends the previous segment and starts the next one.
    end = np.where(on_boundary, boundary, m)
    start = np.where(on_boundary, boundary, m - 1)
    lo = np.concatenate(([0], start)).astype(np.int64)
    hi = np.concatenate((end, [n])).astype(np.int64)
    # Only reachable when 1/k is within the rounding tolerance (k ~ 1e14 / n): keep segments non-empty.
    hi = np.minimum(np.maximum(hi, lo + 1), n)
    lo = np.minimum(lo, hi - 1)
    return lo, hi


def segment_prefix(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """cum_inv[j] = sum_{i < j} 1 / L_i, float64 [k + 1]; shared by every probability computation so
    that the sampler's kernel and :func:`segment_probabilities` agree to the last bit."""
    return np.concatenate(([0.0], np.cumsum(1.0 / (hi - lo))))


@njit(cache=True, nogil=True)
def _segment_draw_into(lo, hi, cum_inv, seg, u, beta, use_weights, batch_norm, p_min, positions, probs, weights):
    """Draw b picks a position uniformly inside segment seg[b]; writes positions, their exact per-draw
    probabilities and IS weights (``weights`` holds ones on entry). Each draw's segment is uniform over the k
    segments (stratified when seg = 0..k-1), so the per-draw probability of a position is the same in both
    modes."""
    k = lo.shape[0]
    n = u.shape[0]
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
        if last == first + 1:  # in one segment only: exact, not a difference of prefix sums
            probs[b] = (1.0 / (hi[first] - lo[first])) / k
        else:
            probs[b] = (cum_inv[last] - cum_inv[first]) / k
        if probs[b] < smallest:
            smallest = probs[b]
    if use_weights and beta > 0.0:
        # w = (N P)^-beta / max_i (N P_i)^-beta = (P / P_min)^-beta, P_min over the buffer or batch
        ref = smallest if batch_norm else p_min
        for b in range(n):
            weights[b] = (probs[b] / ref) ** -beta


@njit(cache=True, nogil=True)
def _segment_draw(lo, hi, cum_inv, seg, u, beta, use_weights, batch_norm, p_min):
    """:func:`_segment_draw_into` into new arrays: (positions, probabilities, weights)."""
    n = u.shape[0]
    positions = np.empty(n, np.int64)
    probs = np.empty(n)
    weights = np.ones(n)
    _segment_draw_into(lo, hi, cum_inv, seg, u, beta, use_weights, batch_norm, p_min, positions, probs, weights)
    return positions, probs, weights


@njit(cache=True, nogil=True)
def _segment_draw_gather(lo, hi, cum_inv, seg, u, beta, use_weights, batch_norm, p_min, heap_ids, capacity,
                         rows64, plan, out):
    """:func:`_segment_draw_into` for the heap mode, writing the drawn ids, probabilities and weights into
    ``out``'s first 24 * B bytes and the drawn rows after them (:func:`perx.storage._gather_rows`)."""
    n = u.shape[0]
    ids = out[: 8 * n].view(np.int64)
    weights = out[16 * n: 24 * n].view(np.float64)
    weights[:] = 1.0
    positions = np.empty(n, np.int64)
    _segment_draw_into(lo, hi, cum_inv, seg, u, beta, use_weights, batch_norm, p_min, positions,
                       out[8 * n: 16 * n].view(np.float64), weights)
    slots = np.empty(n, np.int64)
    for b in range(n):
        if b + AHEAD < n:  # perx._prefetch: more of these random reads in flight
            prefetch(heap_ids, positions[b + AHEAD])
        i = heap_ids[positions[b]]
        ids[b] = i
        slots[b] = i % capacity
    _gather_rows(rows64, slots, out[24 * n:], plan)


#: :func:`_segment_draw_gather` without type dispatch (perx._jit): the segment tables as they come (cached or
#: loaded: any strides), seg and u from the sampler's generator, the heap's ids, the storage's rows and plan,
#: the batch bytes made right before the call
_SEGMENT_DRAW_GATHER = Entry(_segment_draw_gather, (
    loose(int64, 1), loose(int64, 1), loose(float64, 1), array(int64, 1), array(float64, 1), float64, boolean,
    boolean, float64, array(int64, 1), int64, array(uint64, 2), array(int64, 2), array(uint8, 1)))


@njit(cache=True, nogil=True)
def _write_gather(ids, probs, weights, capacity, rows64, plan, out):
    """Write ids, probabilities and weights into ``out``'s first 24 * B bytes and the rows of the ids after."""
    n = ids.shape[0]
    out[: 8 * n].view(np.int64)[:] = ids
    out[8 * n: 16 * n].view(np.float64)[:] = probs
    out[16 * n: 24 * n].view(np.float64)[:] = weights
    slots = np.empty(n, np.int64)
    for b in range(n):
        slots[b] = ids[b] % capacity
    _gather_rows(rows64, slots, out[24 * n:], plan)


def segment_probabilities(lo: np.ndarray, hi: np.ndarray, positions: np.ndarray,
                          cum_inv: np.ndarray | None = None) -> np.ndarray:
    """Exact per-draw probability of each rank position under stratified segment sampling:
    ``(1/k) * sum_{j: lo[j] <= h < hi[j]} 1 / (hi[j] - lo[j])``."""
    k = len(lo)
    if cum_inv is None:
        cum_inv = segment_prefix(lo, hi)
    first = np.searchsorted(hi, positions, side="right")  # first segment with hi > h
    last = np.searchsorted(lo, positions, side="right")  # one past the last segment with lo <= h
    # In one segment only: 1 / (k L_j) directly, not as a difference of prefix sums (same operations
    # as the sampling kernel, so the two agree to the last bit).
    single = (1.0 / (hi - lo))[np.minimum(first, k - 1)] / k
    return np.where(last == first + 1, single, (cum_inv[last] - cum_inv[first]) / k)


def _smallest_probability(lo: np.ndarray, hi: np.ndarray, cum_inv: np.ndarray) -> float:
    # The per-draw probability is constant between consecutive segment ends, so checking the start
    # of each such piece finds the minimum over all positions in O(k log k). (A segment end equal to
    # n starts no piece: position n does not exist.)
    starts = np.unique(np.concatenate((lo, hi[:-1])))
    starts = starts[starts < hi[-1]]
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

    #: Largest value the saved count of updates since the last sort may hold.
    def _max_unsorted(self) -> int:
        return np.iinfo(np.int64).max

    def _load_state(self, meta, arrays, *, size, next_id):
        super()._load_state(meta, arrays, size=size, next_id=next_id)
        keys, ids, pos, state = (arrays[name] for name in ("keys", "ids", "pos", "state"))
        if state[0] != size:
            raise ValueError(f"state: the heap holds {state[0]} entries but the buffer {size} transitions")
        check_int(state[1], "state[1] (updates since the last sort)", 0, self._max_unsorted())
        if getattr(self, "exact", False):
            _heap.check_slots(keys, ids, pos, size, next_id, self.capacity)
        else:
            _heap.check_heap(keys, ids, pos, size, next_id, self.capacity)
        for name in ("keys", "ids", "pos", "state"):
            getattr(self, f"_{name}")[:] = arrays[name]


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
        exact: keep a truly sorted order instead of the heap approximation (about 1.5x the heap's
            update cost; see docs/rank_based.md).
        normalize: IS weights divided by the largest weight any stored transition could get
            (``"buffer"``, default: it belongs to the lowest-probability ranks, inside the last
            segment) or by the largest in the batch (``"batch"``).
        seed: seed of the sampler's own ``np.random.Generator``.

    New transitions enter at maximal priority: key +inf, above every replayed transition (oldest
    first among them), so each new transition sits at the top ranks until it is replayed.
    """

    name = "RankBased"

    def __init__(self, alpha: float = 0.7, *, segments: int | None = None, sort_every: int | None = None,
                 exact: bool = False, normalize: str = "batch", seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self.alpha = check_real(alpha, "alpha", low=0.0)
        self.n_segments = check_optional_positive_int(segments, "segments")
        self.sort_every = check_optional_positive_int(sort_every, "sort_every")
        self.exact = check_bool(exact, "exact")
        self.fuses_gather = not self.exact  # heap mode draws and gathers in one compiled call
        self.normalize = check_choice(normalize, "normalize", ("buffer", "batch"))
        #: k -> (N, lo, hi, cum_inv, smallest probability) of the boundaries last computed for k.
        self._segments: dict[int, tuple] = {}

    def config(self):
        return {"alpha": self.alpha, "segments": self.n_segments, "sort_every": self.sort_every,
                "exact": self.exact, "normalize": self.normalize}

    def _allocate(self, capacity):
        super()._allocate(capacity)
        if self.exact:
            # Per slot: _keys[s], _ids[s], and _pos[s] = 0 (stored) or -1 (empty); the order itself
            # lives in the sorted list.
            self._order = _ordered.Ordered(capacity)

    @property
    def _sort_every(self) -> int:
        return self.capacity if self.sort_every is None else self.sort_every  # type: ignore[return-value]  # bound

    # -- writes ----------------------------------------------------------------------------------
    def on_add(self, slots, ids):
        if not self.exact:
            add = _heap.HEAP_ADD.fn if add_fits(slots, ids) else _heap.heap_add
            add(self._keys, self._ids, self._pos, self._state, slots, ids, self.capacity)
            return
        _exact_add(self._keys, self._ids, self._pos, self._state, slots, ids, *self._order.arrays)

    def on_add_range(self, first, ids):
        if self.exact:
            super().on_add_range(first, ids)
            return
        _heap.HEAP_ADD_RANGE.fn(self._keys, self._ids, self._pos, self._state, first, ids, self.capacity)

    def on_add_one(self, slot, id):
        if self.exact:
            super().on_add_one(slot, id)
            return
        _heap.HEAP_ADD_ONE.fn(self._keys, self._ids, self._pos, self._state, slot, id, self.capacity)

    def update(self, ids, values, next_id, *, raw):
        if not self.exact:
            update = _heap.HEAP_UPDATE.fn if update_fits(ids, values) else _heap.heap_update
            count = update(self._keys, self._ids, self._pos, self._state, ids, values, next_id, self.capacity, raw)
            if count < 0:
                raise_bad_update(count, ids, values, next_id, raw)
            if self._state[1] >= self._sort_every:
                self.sort()
            return count
        count = _exact_update(self._keys, ids, values, next_id, self.capacity, raw, *self._order.arrays)
        if count < 0:
            raise_bad_update(count, ids, values, next_id, raw)
        return count

    def sort(self) -> None:
        """Fully sort the heap array now (heap mode); O(N log N). Called every ``sort_every`` updates."""
        if not self.exact:
            _heap.full_sort(self._keys, self._ids, self._pos, int(self._state[0]), cast(int, self.capacity))  # bound
        self._state[1] = 0

    # -- sampling --------------------------------------------------------------------------------
    def boundaries(self, n: int, k: int, *, keep: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """Cached (lo, hi, cum_inv, smallest per-draw probability) for n transitions, k segments: the ones
        the next sample of k draws at size n uses. ``keep=False`` (for queries) does not cache boundaries it
        had to compute, so asking never changes what later samples draw."""
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
        if keep:
            self._segments[k] = (n, lo, hi, cum_inv, p_min)
        return lo, hi, cum_inv, p_min

    def _positions_to_ids(self, positions: np.ndarray) -> np.ndarray:
        if not self.exact:
            return self._ids[positions]
        return self._order.ids_at(positions)

    def _positions_of(self, slots: np.ndarray) -> np.ndarray:
        if not self.exact:
            return self._pos[slots]
        return self._order.ranks_of(self._keys[slots], self._ids[slots])

    def _draw(self, batch_size: int, size: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(k segments, each draw's segment, each draw's uniform): the random numbers of one batch."""
        k = batch_size if self.n_segments is None else self.n_segments
        if size >= k and k != batch_size:  # "sample a segment, then uniformly within it" (000 Sec. 3.3)
            # integers and uniforms interleave: both from the generator itself (self._rng: brought level first)
            seg = self._rng.integers(0, k, batch_size)
            return k, seg, self._rng.random(batch_size)
        # one draw per segment: stratified (000 App. B.2.1)
        return k, np.arange(batch_size), self._numbers(batch_size, 0)

    def sample(self, batch_size, beta, size, next_id):
        k, seg, u = self._draw(batch_size, size)
        if size >= k:
            lo, hi, cum_inv, p_min = self.boundaries(size, k)
            positions, probs, weights = _segment_draw(lo, hi, cum_inv, seg, u, beta, beta > 0.0,
                                                      self.normalize == "batch", p_min)
        else:
            positions, probs, weights = self._small_draw(u, size, beta)
        ids = self._positions_to_ids(positions)
        return ids % self.capacity, ids, probs, weights

    def sample_gather(self, batch_size, beta, size, next_id, rows64, plan, out):
        """Heap mode only (``fuses_gather`` is False in exact mode): the same draws as :meth:`sample`."""
        k, seg, u = self._draw(batch_size, size)
        if size >= k:
            lo, hi, cum_inv, p_min = self.boundaries(size, k)
            _SEGMENT_DRAW_GATHER.fn(lo, hi, cum_inv, seg, u, beta, beta > 0.0, self.normalize == "batch", p_min,
                                    self._ids, self.capacity, rows64, plan, out)
        else:
            positions, probs, weights = self._small_draw(u, size, beta)
            _write_gather(self._ids[positions], probs, weights, self.capacity, rows64, plan, out)

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
        lo, hi, cum_inv, _ = self.boundaries(size, k, keep=False)  # a query: the cache stays as sampling left it
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
    @property
    def nbytes(self) -> int:
        return super().nbytes + (self._order.nbytes if self.exact else 0)

    def _max_unsorted(self) -> int:
        return self._sort_every - 1

    def state_dict(self):
        meta, arrays = super().state_dict()
        # The cached boundaries are part of the state (a stretched cache samples differently from a
        # fresh one); they are saved as (k, N they were computed for) and recomputed on load.
        meta["segments"] = [[k, cached[0]] for k, cached in self._segments.items()]
        return meta, arrays

    def _load_state(self, meta, arrays, *, size, next_id):
        super()._load_state(meta, arrays, size=size, next_id=next_id)
        entries = meta["segments"]
        if not isinstance(entries, list) or len(entries) > max(size, 1):
            raise ValueError(f"segments: expected a list of at most {max(size, 1)} [k, n] pairs, got "
                             f"{str(entries)[:80]}")
        self._segments = {}
        for entry in entries:
            if not isinstance(entry, list) or len(entry) != 2:
                raise ValueError(f"segments: expected [k, n] pairs, got {str(entry)[:80]}")
            k = check_int(entry[0], "segments: k", 1, max(size, 1))
            n = check_int(entry[1], "segments: n", k, max(size, 1))
            if k in self._segments:
                raise ValueError(f"segments: k={k} appears twice")
            self.boundaries(n, k)  # not cached yet: computed for exactly this n, and cached
        if self.exact:
            self._order.build(self._keys[:size], self._ids[:size])


@njit(cache=True, nogil=True)
def _exact_add(keys, ids, pos, state, slots, new_ids, bkeys, bids, blen, order, lkey, lid, fen, free, meta):
    """Exact mode: a new transition enters at key +inf, replacing the one overwritten in its slot."""
    for b in range(slots.shape[0]):
        s = slots[b]
        if pos[s] >= 0:
            _ordered.remove(bkeys, bids, blen, order, lkey, lid, fen, free, meta, keys[s], ids[s])
        else:
            state[0] += 1
        pos[s] = 0
        keys[s] = np.inf
        ids[s] = new_ids[b]
        _ordered.insert(bkeys, bids, blen, order, lkey, lid, fen, free, meta, np.inf, new_ids[b])


@njit(cache=True, nogil=True)
def _exact_update(keys, update_ids, values, next_id, capacity, raw, bkeys, bids, blen, order, lkey, lid, fen,
                  free, meta):
    """Exact mode: validate all, then move each live id to its new key |delta| (or raw priority)."""
    code = check_update(update_ids, values, next_id, capacity, raw)
    if code < 0:
        return code
    oldest = next_id - capacity
    for b in range(update_ids.shape[0]):
        i = update_ids[b]
        if i < oldest:
            continue
        s = i % capacity
        _ordered.remove(bkeys, bids, blen, order, lkey, lid, fen, free, meta, keys[s], i)
        key = values[b] if raw else abs(values[b])
        keys[s] = key
        _ordered.insert(bkeys, bids, blen, order, lkey, lid, fen, free, meta, key, i)
    return code
