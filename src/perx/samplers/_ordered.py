"""An exactly sorted multiset of (key, id) pairs with rank queries, in numba: RankBased(exact=True).

Order: a before b iff ``key_a > key_b``, or the keys are equal and ``id_a < id_b`` (the heap's order,
see :mod:`perx.samplers._heap`). Position 0 is the highest priority.

Layout: a list of sorted blocks (the idea of ``sortedcontainers.SortedList``), compiled. Block ``b``
holds ``blen[b] <= BLOCK`` pairs in ``bkeys[b]`` / ``bids[b]``; ``order[p]`` is the block at list
position ``p`` (``p < nb``), ``lkey[p]`` / ``lid[p]`` its last pair (any pair from it up to, not including,
the next block's first one would do: it only separates the blocks), and a Fenwick tree ``fen`` over
the block lengths by list position answers "which block and offset holds rank h" in O(log nb).

Costs: insert / remove O(log nb + BLOCK) (a binary search, then a shift inside one block); a full
block splits in two (O(nb) to shift the block list and rebuild the Fenwick tree, once per BLOCK/2
inserts into it); rank -> id and id -> rank O(log nb + log BLOCK). When every block is in use the
whole list is re-packed into half-full blocks (O(N), after at least N/2 inserts since the last).

All state lives in numpy arrays (``Ordered.arrays``), so it costs no Python objects and is rebuilt
from the per-slot keys and ids on load rather than saved.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Largest number of pairs in one block (a full block splits into two halves).
BLOCK = 512
# meta: [number of blocks in the list, number of free block indices, number of pairs]
_NB, _NFREE, _COUNT = 0, 1, 2


@njit(cache=True, nogil=True, inline="always")
def _before(ka, ia, kb, ib):
    return ka > kb or (ka == kb and ia < ib)


@njit(cache=True, nogil=True)
def _fen_rebuild(fen, blen, order, nb):
    fen[:] = 0
    for p in range(nb):
        fen[p + 1] = blen[order[p]]
    for i in range(1, nb + 1):
        j = i + (i & -i)
        if j <= nb:
            fen[j] += fen[i]


@njit(cache=True, nogil=True, inline="always")
def _fen_add(fen, nb, p, delta):
    i = p + 1
    while i <= nb:
        fen[i] += delta
        i += i & -i


@njit(cache=True, nogil=True)
def _fen_prefix(fen, p):
    """Number of pairs in list positions < p."""
    total = 0
    i = p
    while i > 0:
        total += fen[i]
        i -= i & -i
    return total


@njit(cache=True, nogil=True)
def _find_block(lkey, lid, nb, k, i):
    """First list position whose last pair is not before (k, i); nb if (k, i) is after them all."""
    lo, hi = 0, nb
    while lo < hi:
        mid = (lo + hi) >> 1
        if _before(lkey[mid], lid[mid], k, i):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def _offset(bkeys, bids, b, n, k, i):
    """First offset in block b (of n pairs) whose pair is not before (k, i)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if _before(bkeys[b, mid], bids[b, mid], k, i):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def _pack(bkeys, bids, blen, order, lkey, lid, fen, free, meta, keys, ids, count, per_block):
    """Lay out ``count`` pairs, already sorted, in blocks of ``per_block``; every other block is free."""
    maxb = blen.shape[0]
    nb = 0
    for start in range(0, count, per_block):
        n = min(per_block, count - start)
        b = nb
        for j in range(n):
            bkeys[b, j] = keys[start + j]
            bids[b, j] = ids[start + j]
        blen[b] = n
        order[nb] = b
        lkey[nb] = keys[start + n - 1]
        lid[nb] = ids[start + n - 1]
        nb += 1
    nfree = 0
    for b in range(maxb - 1, nb - 1, -1):
        blen[b] = 0
        free[nfree] = b
        nfree += 1
    meta[_NB] = nb
    meta[_NFREE] = nfree
    meta[_COUNT] = count
    _fen_rebuild(fen, blen, order, nb)


@njit(cache=True, nogil=True)
def _repack(bkeys, bids, blen, order, lkey, lid, fen, free, meta):
    count = meta[_COUNT]
    keys = np.empty(count)
    ids = np.empty(count, np.int64)
    t = 0
    for p in range(meta[_NB]):
        b = order[p]
        for j in range(blen[b]):
            keys[t] = bkeys[b, j]
            ids[t] = bids[b, j]
            t += 1
    _pack(bkeys, bids, blen, order, lkey, lid, fen, free, meta, keys, ids, count, bkeys.shape[1] // 2)


@njit(cache=True, nogil=True)
def insert(bkeys, bids, blen, order, lkey, lid, fen, free, meta, k, i):
    nb = meta[_NB]
    if nb == 0:
        meta[_NFREE] -= 1
        b = free[meta[_NFREE]]
        bkeys[b, 0] = k
        bids[b, 0] = i
        blen[b] = 1
        order[0] = b
        lkey[0] = k
        lid[0] = i
        meta[_NB] = 1
        meta[_COUNT] += 1
        _fen_rebuild(fen, blen, order, 1)
        return
    p = _find_block(lkey, lid, nb, k, i)
    if p == nb:
        p = nb - 1  # after every pair: append to the last block
    b = order[p]
    n = blen[b]
    j = _offset(bkeys, bids, b, n, k, i)
    for t in range(n, j, -1):
        bkeys[b, t] = bkeys[b, t - 1]
        bids[b, t] = bids[b, t - 1]
    bkeys[b, j] = k
    bids[b, j] = i
    n += 1
    blen[b] = n
    if j == n - 1:
        lkey[p] = k
        lid[p] = i
    meta[_COUNT] += 1
    _fen_add(fen, nb, p, 1)
    if n < bkeys.shape[1]:
        return
    if meta[_NFREE] == 0:  # every block in use: re-pack into half-full blocks
        _repack(bkeys, bids, blen, order, lkey, lid, fen, free, meta)
        return
    # Split the full block: its upper half moves to a new block right after it in the list.
    meta[_NFREE] -= 1
    c = free[meta[_NFREE]]
    half = n // 2
    for t in range(half, n):
        bkeys[c, t - half] = bkeys[b, t]
        bids[c, t - half] = bids[b, t]
    blen[c] = n - half
    blen[b] = half
    for q in range(nb, p + 1, -1):
        order[q] = order[q - 1]
        lkey[q] = lkey[q - 1]
        lid[q] = lid[q - 1]
    order[p + 1] = c
    lkey[p + 1] = lkey[p]
    lid[p + 1] = lid[p]
    lkey[p] = bkeys[b, half - 1]
    lid[p] = bids[b, half - 1]
    meta[_NB] = nb + 1
    _fen_rebuild(fen, blen, order, nb + 1)


@njit(cache=True, nogil=True)
def remove(bkeys, bids, blen, order, lkey, lid, fen, free, meta, k, i):
    """Remove the pair (k, i); returns False (and changes nothing) if it is not present."""
    nb = meta[_NB]
    p = _find_block(lkey, lid, nb, k, i)
    if p == nb:
        return False
    b = order[p]
    n = blen[b]
    j = _offset(bkeys, bids, b, n, k, i)
    if j == n or bkeys[b, j] != k or bids[b, j] != i:
        return False
    for t in range(j, n - 1):
        bkeys[b, t] = bkeys[b, t + 1]
        bids[b, t] = bids[b, t + 1]
    n -= 1
    blen[b] = n
    meta[_COUNT] -= 1
    if n == 0:  # the block empties: drop it from the list
        for q in range(p, nb - 1):
            order[q] = order[q + 1]
            lkey[q] = lkey[q + 1]
            lid[q] = lid[q + 1]
        free[meta[_NFREE]] = b
        meta[_NFREE] += 1
        meta[_NB] = nb - 1
        _fen_rebuild(fen, blen, order, nb - 1)
        return True
    if j == n:
        lkey[p] = bkeys[b, n - 1]
        lid[p] = bids[b, n - 1]
    _fen_add(fen, nb, p, -1)
    return True


@njit(cache=True, nogil=True)
def ids_at(bkeys, bids, blen, order, fen, meta, positions):
    """Ids at rank positions (each in [0, count)); O(B log nb)."""
    nb = meta[_NB]
    top = 1
    while top * 2 <= nb:
        top *= 2
    out = np.empty(positions.shape[0], np.int64)
    for q in range(positions.shape[0]):
        h = positions[q]
        # Fenwick descent: the largest list position p with prefix(p) <= h
        p = 0
        step = top
        while step > 0:
            nxt = p + step
            if nxt <= nb and fen[nxt] <= h:
                p = nxt
                h -= fen[nxt]
            step >>= 1
        out[q] = bids[order[p], h]
    return out


@njit(cache=True, nogil=True)
def ranks_of(bkeys, bids, blen, order, lkey, lid, fen, meta, keys, ids):
    """Rank positions of present pairs (keys[q], ids[q]); -1 for a pair that is not present."""
    nb = meta[_NB]
    out = np.empty(keys.shape[0], np.int64)
    for q in range(keys.shape[0]):
        k = keys[q]
        i = ids[q]
        p = _find_block(lkey, lid, nb, k, i)
        if p == nb:
            out[q] = -1
            continue
        b = order[p]
        j = _offset(bkeys, bids, b, blen[b], k, i)
        if j == blen[b] or bkeys[b, j] != k or bids[b, j] != i:
            out[q] = -1
        else:
            out[q] = _fen_prefix(fen, p) + j
    return out


class Ordered:
    """The sorted list for ``capacity`` pairs at most (see the module docstring)."""

    def __init__(self, capacity: int, block: int = BLOCK) -> None:
        # Re-packing leaves blocks half full, so 2 N / block blocks hold N pairs; one block more per
        # N / block leaves room for N / 2 inserts (splits) before the next re-pack.
        maxb = 3 * (-(-capacity // block)) + 4
        self.bkeys = np.zeros((maxb, block))
        self.bids = np.zeros((maxb, block), np.int64)
        self.blen = np.zeros(maxb, np.int64)
        self.order = np.zeros(maxb, np.int64)
        self.lkey = np.zeros(maxb)
        self.lid = np.zeros(maxb, np.int64)
        self.fen = np.zeros(maxb + 1, np.int64)
        self.free = np.zeros(maxb, np.int64)
        self.meta = np.zeros(3, np.int64)
        self.build(np.empty(0), np.empty(0, np.int64))

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                              np.ndarray, np.ndarray]:
        """The arrays, in the argument order of :func:`insert` and :func:`remove`."""
        return (self.bkeys, self.bids, self.blen, self.order, self.lkey, self.lid, self.fen, self.free, self.meta)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def __len__(self) -> int:
        return int(self.meta[_COUNT])

    def build(self, keys: np.ndarray, ids: np.ndarray) -> None:
        """Replace the contents by the given pairs (any order); O(N log N)."""
        sort = np.lexsort((ids, -keys))
        _pack(*self.arrays, np.ascontiguousarray(keys[sort], np.float64),
              np.ascontiguousarray(ids[sort], np.int64), len(keys), self.bkeys.shape[1] // 2)

    def ids_at(self, positions: np.ndarray) -> np.ndarray:
        return ids_at(self.bkeys, self.bids, self.blen, self.order, self.fen, self.meta, positions)

    def ranks_of(self, keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return ranks_of(self.bkeys, self.bids, self.blen, self.order, self.lkey, self.lid, self.fen, self.meta,
                        keys, ids)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All (keys, ids) in order (for tests); O(N)."""
        nb = int(self.meta[_NB])
        blocks = self.order[:nb]
        keys = np.concatenate([self.bkeys[b, : self.blen[b]] for b in blocks]) if nb else np.empty(0)
        ids = np.concatenate([self.bids[b, : self.blen[b]] for b in blocks]) if nb else np.empty(0, np.int64)
        return keys, ids
