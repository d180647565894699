"""Sum and min trees whose bottom three levels live in one cache line (the kernels of perx.Proportional).

The full binary tree of :mod:`perx.trees` keeps every level. At N = 1e6 its 2^21 nodes (16 MB of sums, as
much again for the minima) do not fit in a 4 MB L2 cache, so each of the lowest levels costs a cache miss
per sample and per update. Here the masses (the leaves) are grouped in blocks of ``g = 8`` float64, one
aligned 64-byte line, and the stored heap starts at the block level: ``heap`` is float64 ``[2 * M, 2]`` for
``M = L / g`` blocks, row k = [sum, min] of node k (row 1 the root, block ``j`` at row ``M + j``), 4 MB at
N = 1e6 instead of 32. A descent walks the heap's sums, then finishes inside the line of masses it must read
anyway; an update's min path shares the cache lines of its sum path.

Bit-identical to the full tree: a block's sum is formed pairwise, ``((m0 + m1) + (m2 + m3)) + ((m4 + m5) +
(m6 + m7))``, exactly the value the full tree's node at that level holds, and the descent inside a block
recomputes the three missing levels' node values the same way before comparing, so every comparison and
subtraction of :func:`perx.trees.find_prefix` happens on the same float64 values in the same order. The
minimum ignores zero masses (+inf), like the min tree's empty leaves.

Only every other level above the blocks is kept (:func:`maintained_rows`): the blocks, the levels two, four,
... above them, and the root. A search reads a node's four grandchildren (one line) and forms the children's
sums from them, so it never needs the levels in between; where the blocks lie an odd number of levels below
the root, it takes its one-level step at the top, from the root's two children. An update then writes one
line per two levels instead of two (the children's rows were a second line), and a search's last step lands
on the blocks' line without reading the level above it: at 1e6 and 1e7, one line less per draw.

Costs: a descent O(log M + g), an update O(g + log M) per slot; all kernels are numba, batched across the
B slots at each step (two levels per step: a node's four grandchildren are one line) so that the B reads of a
step are in flight together.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perx._prefetch import AHEAD, prefetch

#: Leaves per block: 8 float64 fill one 64-byte cache line.
GROUP = 8


def layout(leaves: int) -> tuple[int, int]:
    """(g, M): leaves per block and number of blocks for a power-of-two leaf count."""
    g = min(GROUP, leaves)
    return g, leaves // g


def aligned_heap(nblocks: int) -> np.ndarray:
    """The [sum, min] heap, float64 [2 * nblocks, 2], on a 64-byte boundary (so rows 4k..4k+3 share a line),
    sums 0 and minima +inf."""
    heap = aligned_zeros(4 * nblocks).reshape(2 * nblocks, 2)
    heap[:, 1] = np.inf
    return heap


def aligned_zeros(n: int, align: int = 64) -> np.ndarray:
    """float64 zeros [n] whose first element starts on an ``align``-byte boundary (so a block of 8 masses
    is one cache line, not two)."""
    raw = np.zeros(n + align // 8, np.float64)
    skip = (-raw.ctypes.data % align) // 8
    return raw[skip : skip + n]


@njit(cache=True, nogil=True, inline="always")
def pair_sum(mass, start, width):
    """Sum of ``mass[start:start + width]`` (width 1, 2, 4 or 8) added pairwise as a binary tree would."""
    if width == 8:
        return (((mass[start] + mass[start + 1]) + (mass[start + 2] + mass[start + 3]))
                + ((mass[start + 4] + mass[start + 5]) + (mass[start + 6] + mass[start + 7])))
    if width == 4:
        return (mass[start] + mass[start + 1]) + (mass[start + 2] + mass[start + 3])
    if width == 2:
        return mass[start] + mass[start + 1]
    return mass[start]


@njit(cache=True, nogil=True, inline="always")
def block_min(mass, start, width):
    """Smallest positive mass of the block, +inf if none (zero masses are empty leaves of the min tree)."""
    m = np.inf
    for j in range(start, start + width):
        v = mass[j]
        v = v if v > 0.0 else np.inf  # selects, not branches: whether a mass is the smallest is a coin flip
        m = v if v < m else m
    return m


@njit(cache=True, nogil=True)
def find(heap, mass, nblocks, g, targets, out):
    """Batch prefix search: for each target t the slot i with prefix(i) <= t < prefix(i + 1).

    Same contract and the same float64 operations as :func:`perx.trees.find_prefix` on the full tree: ties
    go right, a zero-mass leaf is never returned, a target at or past the total (rounding) returns the last
    leaf of positive mass. Requires ``sums[1] > 0`` and ``t >= 0``.
    """
    find_into(heap, mass, nblocks, g, targets.copy(), out)


@njit(cache=True, nogil=True)
def find_into(heap, mass, nblocks, g, t, out):
    """:func:`find` that uses its arguments as its scratch: the targets ``t`` are overwritten, and ``out``
    (int64, as long as ``t``) holds each draw's node until it holds its slot. No arrays are made (each small
    one would cost about a tenth of the search at B = 1: docs/history/speed.md, change 34)."""
    n = t.shape[0]
    node = out
    node[:] = 1
    width = nblocks
    if _odd_levels(nblocks):
        # An odd number of levels below the root: the one-level step first, from the root's children (rows 2
        # and 3, always cached), so that the two-level steps below read the levels the updates maintain
        # (every other one, down to the blocks) and the last one lands on the blocks' line itself.
        left = heap[2, 0]
        right_positive = heap[3, 0] > 0.0
        for b in range(n):
            tb = t[b]
            right = (tb >= left) & right_positive
            t[b] = tb - left if right else tb
            node[b] = 2 + right
        width >>= 1
    while width >= 4:
        # Two levels per step from the four grandchildren, rows 4k..4k+3: one aligned 64-byte line. The
        # children's sums (a level not kept) are formed from them exactly as the full tree adds them, so
        # every comparison sees the full tree's values. Branch-free: which way a draw goes
        # is a coin flip the CPU cannot predict, and a mispredicted branch per level cost more than the
        # memory reads. An empty right subtree keeps the draw left (t passes the left one only through
        # rounding then).
        for b in range(n):
            if b + AHEAD < n:  # the line of a later draw: more misses in flight (perx._prefetch)
                prefetch(heap, 8 * node[b + AHEAD])
            q = 4 * node[b]
            g0 = heap[q, 0]
            g1 = heap[q + 1, 0]
            g2 = heap[q + 2, 0]
            g3 = heap[q + 3, 0]
            left = g0 + g1
            tb = t[b]
            r = (tb >= left) & (g2 + g3 > 0.0)
            tb = tb - left if r else tb
            a = g2 if r else g0
            c = g3 if r else g1
            r2 = (tb >= a) & (c > 0.0)
            t[b] = tb - a if r2 else tb
            node[b] = q + 2 * r + r2
        width >>= 2
    for b in range(n):
        if b + AHEAD < n:
            prefetch(mass, (node[b + AHEAD] - nblocks) * g)
        lo = (node[b] - nblocks) * g
        tb = t[b]
        w = g
        while w > 1:  # the three levels inside the line, their node values recomputed exactly
            half = w >> 1
            left = pair_sum(mass, lo, half)
            right = (tb >= left) & (pair_sum(mass, lo + half, half) > 0.0)
            tb = tb - left if right else tb
            lo += half * right
            w = half
        out[b] = lo


@njit(cache=True, nogil=True, inline="always")
def _up_two(heap, q):
    """Recompute node ``q >> 2`` from its four grandchildren, rows q..q+3 (q a multiple of 4: one aligned
    64-byte line), in the order the level-by-level recomputation adds and compares them (the two children
    first), so every value is the same float64. The children themselves are not written: no search reads
    their level (see :func:`maintained_rows`)."""
    s0 = heap[q, 0]
    s1 = heap[q + 1, 0]
    s2 = heap[q + 2, 0]
    s3 = heap[q + 3, 0]
    m0 = heap[q, 1]
    m1 = heap[q + 1, 1]
    m2 = heap[q + 2, 1]
    m3 = heap[q + 3, 1]
    left = s0 + s1
    right = s2 + s3
    lmin = m0 if m0 <= m1 else m1
    rmin = m2 if m2 <= m3 else m3
    p = q >> 2
    heap[p, 0] = left + right
    heap[p, 1] = lmin if lmin <= rmin else rmin


@njit(cache=True, nogil=True, inline="always")
def _root(heap):
    """The root from its two children, rows 2 and 3 (the last step of an odd number of levels)."""
    heap[1, 0] = heap[2, 0] + heap[3, 0]
    a = heap[2, 1]
    c = heap[3, 1]
    heap[1, 1] = a if a <= c else c


@njit(cache=True, nogil=True)
def propagate(heap, mass, nblocks, g, slots, count):
    """Recompute the blocks of ``slots[:count]`` from their masses, then their ancestors up to the root.

    Parents are always recomputed from children, never adjusted by deltas, so nothing drifts. Two levels per
    step, as the search descends: a node is recomputed from its four grandchildren, which share one line (the
    children's level in between is not kept, :func:`maintained_rows`). At each step the paths that meet
    (consecutive entries with the same ancestor, as sorted slots give) merge into one, so the upper levels cost
    what their few distinct nodes cost. Two levels per step instead of one took about a third off 256 sorted
    slots at N = 2^20 and 2^24 (docs/history/speed.md, change 20); no longer writing the children's rows took
    a further eighth to a fifth off the update kernel of 256 at 1e6 and over a quarter at 1e7 (change 25).
    """
    pos = np.empty(count, np.int64)
    cnt = 0
    last = -1
    for b in range(count):
        j = slots[b] // g
        if j != last:
            last = j
            k = nblocks + j
            heap[k, 0] = pair_sum(mass, j * g, g)
            heap[k, 1] = block_min(mass, j * g, g)
            pos[cnt] = k
            cnt += 1
    width = nblocks
    while width >= 4:
        merged = 0
        last = -1
        for b in range(cnt):
            q = pos[b] & ~3  # the line of four siblings and cousins: grandchildren of pos[b] >> 2
            if q != last:
                last = q
                pos[merged] = q
                merged += 1
        cnt = merged
        for b in range(cnt):
            q = pos[b]
            _up_two(heap, q)
            pos[b] = q >> 2
        width >>= 2
    if width == 2 and cnt > 0:  # an odd number of levels below the root: the last one alone
        _root(heap)


@njit(cache=True, nogil=True)
def propagate_range(heap, mass, nblocks, g, first, count):
    """:func:`propagate` of the consecutive slots ``first, ..., first + count - 1`` (``first + count`` <= the
    capacity), with no arrays made: the nodes it recomputes at each level are a contiguous run, taken in the
    same order with the same operations, so the trees end bit for bit the same."""
    if count <= 0:
        return
    lo = nblocks + first // g
    hi = nblocks + (first + count - 1) // g
    for k in range(lo, hi + 1):
        heap[k, 0] = pair_sum(mass, (k - nblocks) * g, g)
        heap[k, 1] = block_min(mass, (k - nblocks) * g, g)
    width = nblocks
    while width >= 4:
        for q in range(lo & ~3, (hi & ~3) + 1, 4):
            _up_two(heap, q)
        lo >>= 2
        hi >>= 2
        width >>= 2
    if width == 2:
        _root(heap)


@njit(cache=True, nogil=True)
def propagate_one(heap, mass, nblocks, g, slot):
    """:func:`propagate` of the single slot ``slot``: its block, then the path to the root, with the same
    operations (so bit-identical) and no arrays allocated."""
    j = slot // g
    k = nblocks + j
    heap[k, 0] = pair_sum(mass, j * g, g)
    heap[k, 1] = block_min(mass, j * g, g)
    width = nblocks
    while width >= 4:
        _up_two(heap, k & ~3)
        k >>= 2
        width >>= 2
    if width == 2:
        _root(heap)


@njit(cache=True, nogil=True)
def rebuild(heap, mass, nblocks, g):
    """Every block and every node of the maintained levels (:func:`maintained_rows`) from the masses, as the
    incremental updates compute them; O(L). The other rows are left as they are."""
    for j in range(nblocks):
        heap[nblocks + j, 0] = pair_sum(mass, j * g, g)
        heap[nblocks + j, 1] = block_min(mass, j * g, g)
    width = nblocks
    while width >= 4:
        for q in range(width, 2 * width, 4):
            _up_two(heap, q)
        width >>= 2
    if width == 2:
        _root(heap)


@njit(cache=True, nogil=True, inline="always")
def _odd_levels(nblocks):
    """Whether the blocks lie an odd number of levels below the root (nblocks a power of two)."""
    odd = False
    w = nblocks
    while w > 1:
        w >>= 1
        odd = not odd
    return odd


def maintained_rows(nblocks: int) -> np.ndarray:
    """The rows of the heap that hold their node's [sum, min]: the blocks, every second level above them,
    and the root. The levels in between are never read: a search takes its one-level step (odd depths) at
    the root and then two levels per step from each node's four grandchildren, which are the levels the
    updates write. int64, ascending."""
    rows = [np.arange(1, 2)]
    width = nblocks
    while width > 1:
        rows.append(np.arange(width, 2 * width))
        width >>= 2
    return np.unique(np.concatenate(rows))
