"""Proportional prioritized replay (Schaul et al. 2016, Sec. 3.3-3.4, Alg. 1, App. B.2.1), and LAP
(Fujimoto et al. 2020, eq. 9 and 30) as the same sampler with another priority function and no IS.

Priority domains, kept apart by name:
  * priority ``p_i = max(|delta_i| + eps, min_priority)`` (raw; ``min_priority`` is 0 for PER);
  * mass ``p_i ** alpha``, the value stored in the sum and min trees (alpha applied exactly once, here);
  * probability ``P(i) = mass_i / sum_k mass_k`` (000 eq. 1);
  * weight ``w_i = (N * P(i)) ** -beta / max_j w_j`` (000 Sec. 3.4).

Invariant: for every stored slot s, ``masses[s] == priority[s] ** alpha``, every other leaf is 0, and the
block heaps of :mod:`perx._blocktree` (sums, and minima that skip zero masses so zero-probability slots
never set the buffer-wide maximum weight) equal what ``_rebuilt`` computes from the masses, bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perx import _blocktree
from perx._jit import Entry, array, boolean, contiguous, float64, int64, loose, uint8, uint64
from perx._prefetch import prefetch_write
from perx.samplers.base import Sampler, add_fits, check_update, raise_bad_update, update_fits
from perx.storage import _gather_rows
from perx.trees import MaxTree, _propagate, _rebuild, leaf_count
from perx.validation import check_bool, check_choice, check_real

#: New transitions get this priority before any priority has been seen (000 Alg. 1 line 2: p_1 = 1),
#: or the priority floor max(eps, min_priority) if that is larger (LAP with kappa > 1).
INITIAL_PRIORITY = 1.0
#: Masses are capped so that the sum of all leaves stays finite: each mass <= MAX_TOTAL / L (L leaves).
MAX_TOTAL = 2.0**1023
#: Kernel return code: a priority whose mass p**alpha exceeds the cap.
BAD_MASS = -3


@njit(cache=True, nogil=True)
def _mass(p, alpha):
    # alpha == 0 is uniform replay: every mass is 1, a zero priority included (0 ** 0 == 1).
    return 1.0 if alpha == 0.0 else p**alpha


@njit(cache=True, nogil=True)
def _weight(mass, ref, beta):
    """(mass / ref)^-beta, the normalised IS weight (000 Sec. 3.4); ref <= mass. The ratio can overflow
    when masses span more than ~308 orders of magnitude although the weight itself is representable:
    then it is computed in log space."""
    r = mass / ref
    if r < np.inf:
        return r**-beta
    return np.exp(-beta * (np.log(mass) - np.log(ref)))


@njit(cache=True, nogil=True)
def _sample(heap, mass, nblocks, g, u, stratified, beta, batch_norm, use_weights, next_id, capacity):
    n = u.shape[0]
    slots = np.empty(n, np.int64)
    ids = np.empty(n, np.int64)
    probs = np.empty(n)
    weights = np.empty(n)
    _sample_into(heap, mass, nblocks, g, u, stratified, beta, batch_norm, use_weights, next_id, capacity,
                 slots, ids, probs, weights)
    return slots, ids, probs, weights


@njit(cache=True, nogil=True)
def _sample_gather(heap, mass, nblocks, g, pool, at, n, stratified, beta, batch_norm, use_weights, next_id,
                   capacity, rows64, plan, out):
    """:func:`_sample` of the uniforms ``pool[at : at + n]`` (perx.samplers.base.Sampler._numbers's block: a
    slice made here costs nothing, one made in Python is a new array object per call), writing ids,
    probabilities and weights into ``out``'s first 24 * n bytes, then the drawn rows after them
    (:func:`perx.storage._gather_rows`): one call, nothing handed back. Returns False, having written nothing,
    when the masses sum to no positive total (checked here rather than in Python: one indexing fewer per
    call; docs/history/speed.md, change 32)."""
    if not heap[1, 0] > 0.0:
        return False
    slots = np.empty(n, np.int64)
    _sample_into(heap, mass, nblocks, g, pool[at : at + n], stratified, beta, batch_norm, use_weights, next_id,
                 capacity, slots, out[: 8 * n].view(np.int64), out[8 * n : 16 * n].view(np.float64),
                 out[16 * n : 24 * n].view(np.float64))
    _gather_rows(rows64, slots, out[24 * n :], plan)
    return True


@njit(cache=True, nogil=True)
def _sample_into(heap, mass, nblocks, g, u, stratified, beta, batch_norm, use_weights, next_id, capacity,
                 slots, ids, probs, weights):
    n = u.shape[0]
    total = heap[1, 0]
    targets = probs  # the search's scratch until the probabilities are written below
    if stratified:
        # 000 App. B.2.1: split [0, total) into n equal ranges and draw once in each.
        seg = total / n
        for b in range(n):
            targets[b] = (b + u[b]) * seg
    else:
        for b in range(n):
            targets[b] = u[b] * total
    _blocktree.find_into(heap, mass, nblocks, g, targets, slots)
    head = next_id % capacity
    base = next_id - head
    # w_i = (N P_i)^-beta / max_j (N P_j)^-beta = (mass_i / mass_min)^-beta: N and the total cancel, and
    # the largest weight belongs to the smallest mass (buffer-wide from the min tree, or within the batch).
    weigh = use_weights and beta > 0.0
    ref = heap[1, 1]
    if weigh and batch_norm:
        ref = np.inf
        for b in range(n):
            m = mass[slots[b]]
            if m < ref:
                ref = m
    for b in range(n):
        s = slots[b]
        m = mass[s]
        probs[b] = m / total
        weights[b] = _weight(m, ref, beta) if weigh else 1.0
        ids[b] = base + s if s < head else base - capacity + s


@njit(cache=True, nogil=True)
def _priority(v, raw, eps, floor):
    if raw:
        return v
    p = abs(v) + eps
    return floor if p < floor else p


#: An update asks for the lines of its first EARLY slots before its checks, then each later one EARLY writes
#: ahead, so the raw priorities' lines arrive while the checks run: a few percent off 256 updates at 1e7
#: against asking 16 writes ahead inside the loop (change 31 in docs/history/speed.md).
EARLY = 256


@njit(cache=True, nogil=True)
def _update(heap, mass, nblocks, g, max_nodes, prio, leaf_base, ids, values, next_id, capacity,
            raw, eps, floor, alpha, state, track_max, max_mass):
    n = ids.shape[0]
    # each id's slot, -1 if stale (the slot now holds a newer transition); the lines the writes below need for
    # the first EARLY of them asked for at once (perx._prefetch; a hint, harmless for an update refused below),
    # so they arrive while the checks and the masses' powers run, and the others EARLY writes ahead
    oldest = next_id - capacity
    where = np.empty(n, np.int64)
    for b in range(n):
        i = ids[b]
        s = i % capacity if i >= oldest else -1
        where[b] = s
        if b < EARLY and s >= 0:
            prefetch_write(prio, s)
            prefetch_write(mass, s)
    # Pass 1 validates everything, pass 2 writes: a refused update leaves every array untouched.
    code = check_update(ids, values, next_id, capacity, raw)
    if code < 0:
        return code
    # The mass is increasing in the priority, so checking the largest priority checks them all.
    top = 0.0
    for b in range(n):
        p = _priority(values[b], raw, eps, floor)
        if p > top:
            top = p
    # (and finite: with alpha = 0 an overflowed |delta| + eps would have mass 1)
    if not (_mass(top, alpha) <= max_mass and top < np.inf):
        return BAD_MASS
    # the written slots, over `where`: the b-th write goes to index <= b, after where[b] and what lies
    # ahead were read
    slots = where
    count = 0
    for b in range(n):
        if b + EARLY < n and where[b + EARLY] >= 0:
            prefetch_write(prio, where[b + EARLY])
            prefetch_write(mass, where[b + EARLY])
        s = where[b]
        if s < 0:
            continue
        p = _priority(values[b], raw, eps, floor)
        m = _mass(p, alpha)
        prio[s] = p
        mass[s] = m
        if track_max:
            max_nodes[leaf_base + s] = p
        if p > state[0]:
            state[0] = p
        slots[count] = s
        count += 1
    # Duplicates: leaves were written in order, so the last occurrence wins; ancestors are then
    # recomputed from their children, which is idempotent.
    if count == 1:  # the same operations without propagate's array (B = 1)
        _blocktree.propagate_one(heap, mass, nblocks, g, slots[0])
    else:
        _blocktree.propagate(heap, mass, nblocks, g, slots, count)
    if track_max:
        _propagate(max_nodes, leaf_base, slots, count, 2)
    return count


@njit(cache=True, nogil=True)
def _add(heap, mass, nblocks, g, max_nodes, prio, leaf_base, slots, alpha, state, track_max, initial,
         floor):
    n = slots.shape[0]
    if track_max:
        # In-buffer maximum over the transitions that stay: clear the overwritten slots first.
        for b in range(n):
            max_nodes[leaf_base + slots[b]] = -np.inf
        _propagate(max_nodes, leaf_base, slots, n, 2)
        p = max_nodes[1]
        if p == -np.inf:  # nothing else stored
            p = initial
        elif p < floor:  # only raw priorities set below the floor remain
            p = floor
    else:
        p = state[0]
    m = _mass(p, alpha)
    for b in range(n):
        s = slots[b]
        prio[s] = p
        mass[s] = m
        if track_max:
            max_nodes[leaf_base + s] = p
    _blocktree.propagate(heap, mass, nblocks, g, slots, n)
    if track_max:
        _propagate(max_nodes, leaf_base, slots, n, 2)


@njit(cache=True, nogil=True)
def _add_range(heap, mass, nblocks, g, max_nodes, prio, leaf_base, first, count, alpha, state, track_max, initial,
               floor):
    """:func:`_add` of the slots ``first, ..., first + count - 1``."""
    _add(heap, mass, nblocks, g, max_nodes, prio, leaf_base, np.arange(first, first + count), alpha, state,
         track_max, initial, floor)


@njit(cache=True, nogil=True)
def _add_range_historical(heap, mass, nblocks, g, prio, first, count, state, alpha):
    """:func:`_add_range` without the max tree (``max_priority="historical"``), as :func:`_add_one` is for one
    slot: the same float64 operations as ``_add``, so the trees end bit for bit the same."""
    p = state[0]
    m = _mass(p, alpha)
    for s in range(first, first + count):
        prio[s] = p
        mass[s] = m
    _blocktree.propagate_range(heap, mass, nblocks, g, first, count)


@njit(cache=True, nogil=True)
def _add_one(heap, mass, nblocks, g, prio, slot, state, alpha):
    """:func:`_add` of one slot without the max tree (``max_priority="historical"``): ``state[0]`` is the
    priority every new transition gets (read here, saving an indexing in Python per add:
    docs/history/speed.md, change 24). The same float64 operations as ``_add`` of ``[slot]``, so the trees end
    bit for bit the same."""
    p = state[0]
    prio[slot] = p
    mass[slot] = _mass(p, alpha)
    _blocktree.propagate_one(heap, mass, nblocks, g, slot)


class Proportional(Sampler):
    """Proportional prioritization: P(i) = p_i^alpha / sum_k p_k^alpha with p_i = |delta_i| + eps.

    Sum tree for sampling and a min tree for the buffer-wide IS normalisation, both float64.
    Sampling costs O(B log N), an update of B priorities O(B log N), an add O(log N).

    Args:
        alpha: priority exponent (alpha = 0 is uniform replay). Must be >= 0.
        eps: added to |delta| so no transition's probability collapses to 0 (000 Sec. 3.3). >= 0.
        stratified: one draw in each of B equal ranges of the total mass (000 App. B.2.1; default),
            or B independent draws (``False``).
        normalize: IS weights divided by the maximum within the batch (``"batch"``, default, as the 004
            and Dopamine code), or by the buffer-wide maximum weight from the min tree (``"buffer"``, 000
            Sec. 3.4). With ``"buffer"`` one transition at the priority floor sets the maximum and every
            weight shrinks with it (docs/dqn.md, "Why PER collapsed").
        max_priority: priority given to new transitions. ``"historical"`` (default): the largest
            priority ever assigned, starting at 1 (000 Alg. 1 line 2; see below), as in Dopamine and the
            LAP/PAL reference code; it never decreases. ``"buffer"``: the largest priority among the
            transitions currently stored (a literal reading of Alg. 1 line 6), kept in a max tree
            at the cost of a third tree update per write; the initial priority when the buffer is empty.
            The initial priority is max(1, eps, min_priority): never below the priority floor.
        min_priority: floor of the priority, p = max(|delta| + eps, min_priority): LAP's kappa
            (004 eq. 9 and 30); 0 for PER.
        importance_sampling: return IS weights (PER); ``False`` returns weights of 1 whatever beta
            is passed (LAP).
        seed: seed of the sampler's own ``np.random.Generator`` (the buffer's ``seed`` overrides it).

    With ``stratified=True`` the returned ``probabilities`` are still eq. (1)'s P(i): the expected
    number of copies of transition i in a batch is B * P(i), as for independent draws, but the
    draws within a batch are negatively correlated (lower variance).
    """

    name = "Proportional"

    def __init__(self, alpha: float = 0.6, eps: float = 1e-6, *, stratified: bool = True,
                 normalize: str = "batch", max_priority: str = "historical", min_priority: float = 0.0,
                 importance_sampling: bool = True, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self.alpha = check_real(alpha, "alpha", low=0.0)
        self.eps = check_real(eps, "eps", low=0.0)
        self.min_priority = check_real(min_priority, "min_priority", low=0.0)
        self.importance_sampling = check_bool(importance_sampling, "importance_sampling")
        self.stratified = check_bool(stratified, "stratified")
        self.normalize = check_choice(normalize, "normalize", ("buffer", "batch"))
        self.max_priority_mode = check_choice(max_priority, "max_priority", ("historical", "buffer"))
        #: The smallest priority an update can produce, and the priority of the first transitions.
        self.floor = max(self.eps, self.min_priority)
        self.initial_priority = max(INITIAL_PRIORITY, self.floor)
        self._state = np.array([self.initial_priority])

    def config(self):
        return {"alpha": self.alpha, "eps": self.eps, "stratified": self.stratified,
                "normalize": self.normalize, "max_priority": self.max_priority_mode,
                "min_priority": self.min_priority, "importance_sampling": self.importance_sampling}

    def _allocate(self, capacity):
        leaves = leaf_count(capacity)
        #: The largest mass p**alpha a transition may have: L of them still sum to a finite float64.
        self.max_mass = MAX_TOTAL / leaves
        if not _mass(self.initial_priority, self.alpha) <= self.max_mass:
            raise ValueError(f"min_priority/eps: the initial priority {self.initial_priority!r} ** alpha "
                             f"exceeds the largest mass {self.max_mass:.3g} for capacity {capacity}")
        # Masses in aligned lines of 8; the [sum, min] heap starts at the block level (perx._blocktree): 4 MB
        # at N = 1e6, about the L2 size, so a descent misses little before its last, unavoidable, line.
        self._g, self._nblocks = _blocktree.layout(leaves)
        self._mass = _blocktree.aligned_zeros(leaves)
        # row k of the heap is [sum_k, min_k]: an update's min path shares the cache lines of its sum path
        self._heap = _blocktree.aligned_heap(self._nblocks)
        track = self.max_priority_mode == "buffer"
        # An unused max tree is a 2-element placeholder so the kernels keep one signature.
        self.max_tree = MaxTree(capacity if track else 1)
        self._track_max = track
        self._priority = np.zeros(capacity)
        self._leaf_base = leaves

    @property
    def max_accepted_priority(self) -> float:
        """The largest priority an update may produce: finite, and its mass p**alpha at most ``max_mass``
        (float64 max / 2 / number of leaves), so the sum of all masses cannot overflow; exactly the
        priorities the update kernel accepts. The largest finite float64 for alpha = 0. Larger priorities
        are refused with a ValueError."""
        largest = float(np.finfo(np.float64).max)
        if self.alpha == 0.0:
            return largest
        with np.errstate(over="ignore"):
            p = min(float(np.float64(self.max_mass) ** (1.0 / self.alpha)), largest)
        # pow rounds: step to the last priority the kernel's test (_mass(p) <= max_mass) accepts, down from an
        # estimate above it or up from one below, so that a priority an update stored also passes a load
        while not _mass(p, self.alpha) <= self.max_mass:
            p = float(np.nextafter(p, 0.0))
        while p < largest and _mass(float(np.nextafter(p, np.inf)), self.alpha) <= self.max_mass:
            p = float(np.nextafter(p, np.inf))
        return p

    @property
    def max_priority(self) -> float:
        """Priority the next new transition will get (raw domain, before alpha)."""
        if self._track_max:
            m = self.max_tree.max
            return self.initial_priority if m == -np.inf else max(m, self.floor)
        return float(self._state[0])

    def priority(self, td_errors) -> np.ndarray:
        """The priority function, p = max(|delta| + eps, min_priority); float64, shape of the input."""
        p = np.abs(np.asarray(td_errors, dtype=np.float64)) + self.eps
        return np.maximum(p, self.min_priority)

    def priorities(self, slots: np.ndarray) -> np.ndarray:
        """Stored raw priorities at ``slots`` (float64 [B])."""
        return self._priority[slots]

    def on_add(self, slots, ids):
        add = _ADD.fn if add_fits(slots, ids) else _add
        add(self._heap, self._mass, self._nblocks, self._g, self.max_tree.nodes, self._priority, self._leaf_base,
            slots, self.alpha, self._state, self._track_max, self.initial_priority, self.floor)

    def on_add_range(self, first, ids):
        # the slots made inside the compiled call: no np.arange made here and passed in
        # (docs/history/speed.md, change 33)
        if self._track_max:
            _ADD_RANGE.fn(self._heap, self._mass, self._nblocks, self._g, self.max_tree.nodes, self._priority,
                          self._leaf_base, first, ids.shape[0], self.alpha, self._state, True,
                          self.initial_priority, self.floor)
        else:  # fewer arguments to unbox, as in on_add_one
            _ADD_RANGE_HISTORICAL.fn(self._heap, self._mass, self._nblocks, self._g, self._priority, first,
                                     ids.shape[0], self._state, self.alpha)

    def on_add_one(self, slot, id):
        if self._track_max:
            super().on_add_one(slot, id)
            return
        # one compiled call of 8 arguments, no arrays made: about a third of what on_add costs
        # (docs/history/speed.md, change 11)
        _ADD_ONE.fn(self._heap, self._mass, self._nblocks, self._g, self._priority, slot, self._state, self.alpha)

    def _no_mass(self, size: int, what: str) -> ValueError:
        largest = float(self._priority[:size].max())
        if largest > 0.0:
            return ValueError(
                f"{what}: every stored transition's mass p**alpha is 0: the priorities underflow "
                f"(largest stored priority {largest!r} ** alpha={self.alpha} rounds to 0 in float64); "
                f"use a smaller alpha, eps > 0, or larger priorities"
            )
        return ValueError(f"{what}: every stored transition has priority 0, so no probability can be formed "
                          f"(use eps > 0, or set a positive priority)")

    def sample(self, batch_size, beta, size, next_id):
        if not self._heap[1, 0] > 0.0:
            raise self._no_mass(size, "sample")
        u = self._numbers(batch_size, 0)
        return _sample(self._heap, self._mass, self._nblocks, self._g, u, self.stratified,
                       beta, self.normalize == "batch", self.importance_sampling, next_id, self.capacity)

    fuses_gather = True

    def sample_gather(self, batch_size, beta, size, next_id, rows64, plan, out):
        # Sampler._numbers inlined, the kernel slicing the block itself: no Python call and no slice object
        # per sample
        pool = self._pool
        cur = self._cursor
        at = cur[0]
        if pool is not None and self._pool_kind == 0 and at < at + batch_size <= pool.shape[0]:
            cur[0] = at + batch_size
        else:
            if not self._heap[1, 0] > 0.0:  # before the block is drawn: a refused call leaves the state as it was
                raise self._no_mass(size, "sample")
            pool, at = self._refill(batch_size, 0), 0
        if not _SAMPLE_GATHER.fn(self._heap, self._mass, self._nblocks, self._g, pool, at, batch_size,
                                 self.stratified, beta, self.normalize == "batch", self.importance_sampling, next_id,
                                 self.capacity, rows64, plan, out):
            cur[0] = at  # the kernel found no mass and drew nothing: the numbers are not handed out
            raise self._no_mass(size, "sample")

    def update(self, ids, values, next_id, *, raw):
        count = (_UPDATE.fn if update_fits(ids, values) else _update)(
            self._heap, self._mass, self._nblocks, self._g, self.max_tree.nodes, self._priority, self._leaf_base, ids,
            values, next_id, self.capacity, raw, self.eps, self.min_priority, self.alpha, self._state,
            self._track_max, self.max_mass)
        if count >= 0:
            return count
        if count == BAD_MASS:
            with np.errstate(over="ignore"):  # |td_error| + eps may overflow: that is what is reported
                p = self.priority(values) if not raw else values
            pos = int(np.flatnonzero(~(p <= self.max_accepted_priority))[0])
            name = "priorities" if raw else "td_errors"
            if not p[pos] < np.inf:
                raise ValueError(f"{name}: the value {values[pos]!r} at position {pos} gives priority {p[pos]!r} "
                                 f"(|td_error| + eps overflowed); the largest accepted priority is "
                                 f"{self.max_accepted_priority!r}")
            with np.errstate(over="ignore"):
                mass = float(np.float64(p[pos]) ** self.alpha)
            raise ValueError(
                f"{name}: the value {values[pos]!r} at position {pos} gives "
                f"priority {p[pos]!r} and mass p**alpha = {mass!r} (alpha={self.alpha}), above "
                f"the largest mass {self.max_mass:.4g} for which the sum of {self._leaf_base} leaves stays "
                f"finite in float64; the largest accepted priority is {self.max_accepted_priority!r}"
            )
        raise_bad_update(count, ids, values, next_id, raw)

    def probabilities(self, slots, size, batch_size=None):
        total = self._heap[1, 0]
        if not total > 0.0:
            raise self._no_mass(size, "probabilities")
        return self._mass[slots] / total

    def mass_totals(self, size):
        # the roots of the sum and min trees: O(1)
        return float(self._heap[1, 0]), float(self._heap[1, 1])

    def state_dict(self):
        # The trees are derived state: only the raw priorities are saved, and load rebuilds the trees.
        meta, arrays = super().state_dict()
        meta["max_priority"] = float(self._state[0])
        arrays["priority"] = self._priority
        return meta, arrays

    @property
    def nbytes(self) -> int:
        return (self._mass.nbytes + self._heap.nbytes + self.max_tree.nodes.nbytes
                + self._priority.nbytes + self._state.nbytes)

    @property
    def masses(self) -> np.ndarray:
        """Read-only view of the ``capacity`` masses p**alpha (float64; 0 for empty slots)."""
        view = self._mass[: self.capacity]
        view.flags.writeable = False
        return view

    @property
    def total_mass(self) -> float:
        """Sum of all masses (the denominator of P(i), 000 eq. 1); O(1)."""
        return float(self._heap[1, 0])

    def _rebuilt(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """(masses, heap) recomputed from the raw priorities of ``size`` stored slots: what the
        incremental updates must have produced, bit for bit (a check for tests)."""
        mass = _blocktree.aligned_zeros(len(self._mass))
        heap = _blocktree.aligned_heap(self._nblocks)
        _fill_trees(heap, mass, self._nblocks, self._g, np.empty(2), self._priority, self._leaf_base, size,
                    self.alpha, False)
        return mass, heap

    def _load_state(self, meta, arrays, *, size, next_id):
        super()._load_state(meta, arrays, size=size, next_id=next_id)
        prio = arrays["priority"]
        stored = prio[:size]
        bad = ~np.isfinite(stored) | (stored < 0.0)
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            raise ValueError(f"priority: slot {pos} holds {stored[pos]!r}; saved priorities must be finite and >= 0")
        if (prio[size:] != 0.0).any():
            pos = size + int(np.flatnonzero(prio[size:] != 0.0)[0])
            raise ValueError(f"priority: slot {pos} was never written (size {size}) but holds {prio[pos]!r}")
        largest = float(stored.max()) if size else 0.0
        if largest > self.max_accepted_priority:
            raise ValueError(f"priority: {largest!r} is above the largest accepted priority "
                             f"{self.max_accepted_priority!r}")
        top = meta["max_priority"]
        if not isinstance(top, float) or not self.initial_priority <= top <= self.max_accepted_priority \
                or top < largest:
            raise ValueError(f"max_priority: {top!r} must be a float in [{self.initial_priority!r}, "
                             f"{self.max_accepted_priority!r}] and at least the largest stored priority "
                             f"{largest!r}")
        self._priority[:] = prio
        self._state[0] = top
        _fill_trees(self._heap, self._mass, self._nblocks, self._g, self.max_tree.nodes, self._priority,
                    self._leaf_base, size, self.alpha, self._track_max)


# The kernels the buffer calls at every step, each bound to one signature (perx._jit: no type dispatch, which
# was about a tenth of a sample+update at B = 1; docs/history/speed.md, change 26). The heap, masses,
# priorities, max tree and state are made in Proportional.__init__ and _allocate with exactly these types,
# the block of uniforms by Sampler._refill, the rows and plan by perx.storage, out right before the call;
# slots of new transitions are contiguous, ids and values of an update take any strides (dtype, rank and
# contiguity checked before the call).
_F2, _F1 = array(float64, 2), array(float64, 1)
_SAMPLE_GATHER = Entry(_sample_gather, (_F2, _F1, int64, int64, _F1, int64, int64, boolean, float64, boolean,
                                           boolean, int64, int64, array(uint64, 2), array(int64, 2), array(uint8, 1)))
_UPDATE = Entry(_update, (_F2, _F1, int64, int64, _F1, _F1, int64, loose(int64, 1), loose(float64, 1), int64,
                          int64, boolean, float64, float64, float64, _F1, boolean, float64))
_ADD = Entry(_add, (_F2, _F1, int64, int64, _F1, _F1, int64, contiguous(int64, 1), float64, _F1, boolean, float64,
                    float64))
_ADD_RANGE = Entry(_add_range, (_F2, _F1, int64, int64, _F1, _F1, int64, int64, int64, float64, _F1, boolean,
                                float64, float64))
_ADD_RANGE_HISTORICAL = Entry(_add_range_historical, (_F2, _F1, int64, int64, _F1, int64, int64, _F1, float64))
_ADD_ONE = Entry(_add_one, (_F2, _F1, int64, int64, _F1, int64, _F1, float64))


@njit(cache=True, nogil=True)
def _fill_trees(heap, mass, nblocks, g, max_nodes, prio, leaf_base, size, alpha, track_max):
    """Masses from the raw priorities of slots [0, size), then every block and parent: the same arrays that
    the incremental updates produce (parents are always recomputed, never adjusted)."""
    for s in range(leaf_base):
        mass[s] = _mass(prio[s], alpha) if s < size else 0.0
    _blocktree.rebuild(heap, mass, nblocks, g)
    if track_max:
        for s in range(leaf_base):
            max_nodes[leaf_base + s] = prio[s] if s < size else -np.inf
        _rebuild(max_nodes, leaf_base, 2)


def LAP(alpha: float = 0.4, kappa: float = 1.0, *, stratified: bool = True, max_priority: str = "historical",
        seed: int | None = None) -> Proportional:
    """Loss-Adjusted Prioritized replay (004 Sec. 5.2, eq. 9; generalised to kappa in eq. 30).

    LAP is proportional sampling with priority max(|delta|, kappa)^alpha = max(|delta|^alpha,
    kappa^alpha) and no importance sampling, so it is returned as exactly that configuration of
    :class:`Proportional`: ``eps = 0``, ``min_priority = kappa``, ``importance_sampling = False``. Use it
    with the Huber loss of threshold kappa (``perx.losses.huber``, ``perx.torch.huber``). New
    transitions get the largest priority seen so far, as in the paper's Appendix D, starting at
    max(1, kappa) so they are never below the floor.
    """
    kappa = check_real(kappa, "kappa", low=0.0, low_open=True)
    return Proportional(alpha, 0.0, stratified=stratified, max_priority=max_priority, min_priority=kappa,
                        importance_sampling=False, seed=seed)
