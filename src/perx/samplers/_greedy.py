"""perx.Greedy's max-heap: no slot -> position map; an update pushes a new entry and the old one goes stale.

Greedy (000 Sec. 3.2) returns the k transitions with the largest keys, ties to the older, so what it returns
depends only on the set of live (key, id) pairs, never on where they sit in a heap. That frees it from the
position map a binary heap needs to find an entry again (``_heap``): there, every level an entry passes
costs a write of ``pos[slot]`` to a random cache line, about half of a sift's time. Here:

* a new key is *pushed* as a fresh entry at the end of the heap and rises, with a stamp: a number issued
  once (until the next compaction). ``cur[slot]`` holds the stamp of the slot's live entry, so any older
  entry of that slot (a previous key, or an overwritten transition) is stale from then on;
* ``sample(k)`` *pops* entries from the root until k live ones came out; stale ones are dropped for good.
  The k live ones are *pending*: the next sample pushes back those that no update replaced meanwhile;
* when the heap array is full, the live entries are compacted and re-heapified (O(capacity), at most once
  per capacity / 8 pushes: O(1) amortised per push). The slack is kept small on purpose: stale entries make
  the heap deeper and each pop slower.

An entry is 16 bytes, one row of ``heap`` (int64 [rows, 2]): the key's float64 bits and a tag
``(id - base) << vbits | stamp``. Keys are |delta| or a raw priority >= 0 (+inf for a transition not
replayed yet, never NaN), and the bits of such floats, read as int64, order as the floats do (a -0.0 is
stored as +0.0, equal to it as before); comparing tags compares ids. So heap order is: a before b iff
``key_a > key_b``, or equal keys and ``id_a < id_b``, compared as two integers. Row 0 is unused and the
array starts on a 64-byte line, so the two children 2r and 2r + 1 of row r share 32 aligned bytes: one cache
line per level of a sift (three when key, id and stamp were three arrays).

Stamps have 24 bits (``vbits``). A compaction drops the stale entries (in the heap; pending ones are marked
dropped) and gives every live entry and its slot stamp 0; stamps 1, 2, ... are issued after it, and the
2**vbits - 1'th forces the next compaction, so no stamp is issued twice while an entry holding it exists.
(Stamps are issued from one counter rather than per slot: an update then writes ``cur[slot]`` without
reading it first, a cache miss saved per update.) Ids enter a tag as ``id - base`` < 2**(63 - vbits); when
an id would pass that, a compaction moves ``base`` up to the oldest live id (tags shift by the same amount,
so the order stays). ``meta[VBITS]`` and ``meta[SPAN]`` hold these limits (set from ``STAMP_BITS`` and
``ID_SPAN``), so tests can make both happen within a few steps.

Arrays: ``heap`` int64 [capacity + capacity // 8 + 3, 2]; ``cur`` int32 [capacity] (the stamp of the slot's
live entry, -1 for an empty slot); ``key`` float64 [capacity] (the slot's current key); ``pid`` int64,
``pstamp`` int64 [>= k] (pending ids and stamps; -1: dropped); ``meta`` int64 [8]: entries in the heap, live
transitions, pending entries, priority updates applied, the last stamp issued, the id base, stamp bits,
id span. 30 bytes per transition. Costs: push O(1) expected for a random key (O(log N) for +inf), pop
O(log N), amortized compaction O(1).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perx._jit import Entry, array, boolean, contiguous, float64, int32, int64, loose, uint8, uint64
from perx._prefetch import prefetch
from perx.samplers.base import check_update
from perx.storage import _gather_rows

HEAP, LIVE, PENDING, UPDATES, STAMP, BASE, VBITS, SPAN = range(8)
STAMP_BITS = 24  # read by allocate(); tests lower both to make wraps and rebases frequent
ID_SPAN = 1 << (63 - STAMP_BITS)


def allocate_heap(capacity: int) -> np.ndarray:
    """A zeroed heap array for ``capacity`` slots, starting on a 64-byte boundary."""
    rows = capacity + capacity // 8 + 3  # a ninth of the entries stale at most between compactions, row 0 unused
    raw = np.zeros(2 * rows + 8, np.int64)
    skip = (-raw.ctypes.data % 64) // 8
    return raw[skip: skip + 2 * rows].reshape(rows, 2)


def allocate(capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fresh (heap, cur, key, meta) for ``capacity`` slots."""
    heap = allocate_heap(capacity)
    meta = np.zeros(8, np.int64)
    meta[VBITS] = STAMP_BITS
    meta[SPAN] = ID_SPAN
    return heap, np.full(capacity, -1, np.int32), np.zeros(capacity), meta


@njit(cache=True, nogil=True)
def _sink(heap, r, end, ahead):
    """Move the entry at row r down to its place; rows [1, end) hold the heap.

    With ``ahead`` (a pop, whose entry, the heap's last, sinks from the root to near the bottom), each level
    asks for the lines two and three levels below the children (rows 4c..4c+7 and 8c..8c+15: two and four
    aligned lines), whichever way the entry then goes, since the path is known one level at a time and its
    lowest levels miss: about a quarter off a sample+update of 256 at 1e7 with caches evicted between blocks;
    one level ahead gave no clear gain, two to four levels a little less. Not for the compaction's bottom-up
    heapify, whose short sinks only pay for the hints (a compaction took half as long again). Measured:
    docs/history/speed.md, change 29. A prefetch is a hint (perx._prefetch): the moves are the same either
    way."""
    key = heap[r, 0]
    tag = heap[r, 1]
    while True:
        c = 2 * r
        if c >= end:
            break
        if ahead:
            prefetch(heap, 8 * c)
            prefetch(heap, 8 * c + 8)
            for j in range(0, 32, 8):
                prefetch(heap, 16 * c + j)
        ck = heap[c, 0]
        ct = heap[c, 1]
        if c + 1 < end:
            dk = heap[c + 1, 0]
            dt = heap[c + 1, 1]
            if dk > ck or (dk == ck and dt < ct):
                c += 1
                ck = dk
                ct = dt
        if not (ck > key or (ck == key and ct < tag)):
            break
        heap[r, 0] = ck
        heap[r, 1] = ct
        r = c
    heap[r, 0] = key
    heap[r, 1] = tag


@njit(cache=True, nogil=True)
def _rise(heap, r):
    """Move the entry at row r up to its place."""
    key = heap[r, 0]
    tag = heap[r, 1]
    while r > 1:
        p = r >> 1
        pk = heap[p, 0]
        pt = heap[p, 1]
        if not (key > pk or (key == pk and tag < pt)):
            break
        heap[r, 0] = pk
        heap[r, 1] = pt
        r = p
    heap[r, 0] = key
    heap[r, 1] = tag


@njit(cache=True, nogil=True)
def _compact(heap, cur, meta, pid, pstamp, capacity, base):
    """Drop the stale entries (and mark stale pending ones dropped), give the live ones stamp 0, move the id
    base to ``base`` (<= every live id) and re-heapify (Floyd's bottom-up construction); O(capacity)."""
    bits = meta[VBITS]
    mask = (1 << bits) - 1
    n = 0
    for r in range(1, meta[HEAP] + 1):
        tag = heap[r, 1]
        i = (tag >> bits) + meta[BASE]
        if cur[i % capacity] == tag & mask:
            n += 1
            heap[n, 0] = heap[r, 0]
            heap[n, 1] = (i - base) << bits
    for j in range(meta[PENDING]):
        if pstamp[j] >= 0:
            pstamp[j] = 0 if cur[pid[j] % capacity] == pstamp[j] else -1
    for s in range(capacity):
        if cur[s] > 0:
            cur[s] = 0
    for r in range(n // 2, 0, -1):
        _sink(heap, r, n + 1, False)
    meta[HEAP] = n
    meta[STAMP] = 0
    meta[BASE] = base


@njit(cache=True, nogil=True)
def _full(heap, meta):
    """Whether to compact before the next entry's stamp is read or issued: the heap array is full or the
    stamps are used up (a compaction changes the live entries' stamps, to 0). Kept apart from the call to
    :func:`_compact`, which is a real call (its five arrays passed) that should run only when needed."""
    return meta[HEAP] == heap.shape[0] - 1 or meta[STAMP] == (1 << meta[VBITS]) - 1


@njit(cache=True, nogil=True)
def _stamp(meta, cur, s):
    """Issue the next stamp to slot s (every older entry of the slot goes stale); after :func:`_full`."""
    v = meta[STAMP] + 1
    meta[STAMP] = v
    cur[s] = v
    return v


@njit(cache=True, nogil=True)
def _push(heap, meta, key, iid, v):
    """Append the entry (key, id, stamp) and let it rise; after :func:`_full`."""
    r = meta[HEAP] + 1
    meta[HEAP] = r
    heap[r, 0] = np.float64(abs(key)).view(np.int64)  # abs: -0.0 as +0.0
    heap[r, 1] = ((iid - meta[BASE]) << meta[VBITS]) | v
    _rise(heap, r)


@njit(cache=True, nogil=True)
def add_one(heap, cur, key, meta, pid, pstamp, slot, new_id, capacity):
    """A new transition enters at key +inf; the one overwritten in its slot goes stale."""
    if new_id - meta[BASE] >= meta[SPAN]:  # ids would leave the tags' range: rebase on the oldest live id
        _compact(heap, cur, meta, pid, pstamp, capacity, max(new_id - capacity, 0))
    if _full(heap, meta):
        _compact(heap, cur, meta, pid, pstamp, capacity, meta[BASE])
    if cur[slot] < 0:
        meta[LIVE] += 1
    v = _stamp(meta, cur, slot)
    key[slot] = np.inf
    _push(heap, meta, np.inf, new_id, v)


@njit(cache=True, nogil=True)
def add(heap, cur, key, meta, pid, pstamp, slots, new_ids, capacity):
    """:func:`add_one` for each (slot, id) in turn, its steps written out: calling it per row (numba does
    not inline it, so each call passes every array as a struct) made an extend of 256 at least twice as slow
    (docs/history/speed.md, change 16; tests compare the two paths' arrays)."""
    for b in range(slots.shape[0]):
        slot = slots[b]
        new_id = new_ids[b]
        if new_id - meta[BASE] >= meta[SPAN]:
            _compact(heap, cur, meta, pid, pstamp, capacity, max(new_id - capacity, 0))
        if _full(heap, meta):
            _compact(heap, cur, meta, pid, pstamp, capacity, meta[BASE])
        if cur[slot] < 0:
            meta[LIVE] += 1
        v = _stamp(meta, cur, slot)
        key[slot] = np.inf
        _push(heap, meta, np.inf, new_id, v)


@njit(cache=True, nogil=True)
def update(heap, cur, key, meta, pid, pstamp, update_ids, values, next_id, capacity, raw):
    """Validate all, then give each live id key |delta| (or the raw priority); returns the count applied,
    or -1 (bad value) / -2 (id never issued) with nothing changed."""
    code = check_update(update_ids, values, next_id, capacity, raw)
    if code < 0:
        return code
    oldest = next_id - capacity
    count = 0
    for b in range(update_ids.shape[0]):
        i = update_ids[b]
        if i < oldest:
            continue
        s = i % capacity
        k = values[b] if raw else abs(values[b])
        if _full(heap, meta):
            _compact(heap, cur, meta, pid, pstamp, capacity, meta[BASE])
        v = _stamp(meta, cur, s)
        key[s] = k
        _push(heap, meta, k, i, v)
        count += 1
    meta[UPDATES] += count
    return count


@njit(cache=True, nogil=True)
def top(heap, cur, key, meta, pid, pstamp, capacity, k, out):
    """Write the ids of the k first live transitions, best first, into ``out``; k <= live transitions and
    ``pid``/``pstamp`` hold >= k. Pushes back the previous call's pending entries first (those still live),
    then pops; the k popped are pending until the next call."""
    for j in range(meta[PENDING]):
        if _full(heap, meta):
            _compact(heap, cur, meta, pid, pstamp, capacity, meta[BASE])
        i = pid[j]
        s = i % capacity
        if pstamp[j] >= 0 and cur[s] == pstamp[j]:  # neither updated nor overwritten since it was popped
            _push(heap, meta, key[s], i, pstamp[j])
    meta[PENDING] = 0
    bits = meta[VBITS]
    mask = (1 << bits) - 1
    base = meta[BASE]
    t = 0
    size = meta[HEAP]
    while t < k:
        tag = heap[1, 1]
        heap[1, 0] = heap[size, 0]
        heap[1, 1] = heap[size, 1]
        size -= 1
        i = (tag >> bits) + base
        slot = i % capacity
        prefetch(cur, slot)  # the popped entry's liveness, read after the sink: its line on the way
        _sink(heap, 1, size + 1, True)
        v = tag & mask
        if cur[slot] == v:
            out[t] = i
            pid[t] = i
            pstamp[t] = v
            t += 1
    meta[HEAP] = size
    meta[PENDING] = k


@njit(cache=True, nogil=True)
def top_gather(heap, cur, key, meta, pid, pstamp, capacity, k, rows64, plan, out):
    """:func:`top` writing the ids, probabilities and weights (1) into ``out``'s first 24 * k bytes, then the
    rows of the k transitions after them (:func:`perx.storage._gather_rows`): one call, nothing handed back."""
    ids = out[: 8 * k].view(np.int64)
    top(heap, cur, key, meta, pid, pstamp, capacity, k, ids)
    out[8 * k: 24 * k].view(np.float64)[:] = 1.0
    slots = np.empty(k, np.int64)
    for b in range(k):
        slots[b] = ids[b] % capacity
    _gather_rows(rows64, slots, out[24 * k:], plan)


# The per-step kernels without type dispatch (perx._jit): heap int64 [., 2], cur int32, key float64, meta, pid
# and pstamp int64 (Greedy._allocate and _pending_room); slots and new ids from the storage, contiguous; ids
# and values of an update from callers, any strides (dtype, rank and contiguity checked before the call)
_STATE = (array(int64, 2), array(int32, 1), array(float64, 1), array(int64, 1), array(int64, 1), array(int64, 1))
ADD = Entry(add, (*_STATE, contiguous(int64, 1), contiguous(int64, 1), int64))
ADD_ONE = Entry(add_one, (*_STATE, int64, int64, int64))
UPDATE = Entry(update, (*_STATE, loose(int64, 1), loose(float64, 1), int64, int64, boolean))
TOP_GATHER = Entry(top_gather, (*_STATE, int64, int64, array(uint64, 2), array(int64, 2), array(uint8, 1)))


@njit(cache=True, nogil=True)
def live_entries(heap, cur, key, meta, pid, pstamp, capacity):
    """(keys, ids) of the live transitions, one each, in no particular order: the heap's live entries and
    the pending ones still live."""
    n = meta[LIVE]
    keys = np.empty(n)
    ids = np.empty(n, np.int64)
    bits = meta[VBITS]
    mask = (1 << bits) - 1
    j = 0
    for r in range(1, meta[HEAP] + 1):
        i = (heap[r, 1] >> bits) + meta[BASE]
        if cur[i % capacity] == heap[r, 1] & mask:
            if j < n:
                keys[j] = key[i % capacity]  # the key as given (the heap holds a -0.0 as +0.0)
                ids[j] = i
            j += 1
    for p in range(meta[PENDING]):
        s = pid[p] % capacity
        if pstamp[p] >= 0 and cur[s] == pstamp[p]:
            if j < n:
                keys[j] = key[s]
                ids[j] = pid[p]
            j += 1
    if j != n:  # a broken invariant: report it rather than return a partial set
        return keys[:0], ids[:0]
    return keys, ids


def check(heap: np.ndarray, cur: np.ndarray, key: np.ndarray, meta: np.ndarray,
          pid: np.ndarray, pstamp: np.ndarray, capacity: int) -> None:
    """Raise AssertionError unless the invariants hold (for tests): heap order over the array's entries,
    each live slot's stamp found exactly once (in the heap or pending) with the slot's key, tags in range,
    stamps issued at most once since the last compaction. O(entries)."""
    size, bits = int(meta[HEAP]), int(meta[VBITS])
    heapf = heap.view(np.float64)
    assert (heap[1:size + 1, 0] >= 0).all(), "keys stored as the bits of floats >= +0.0"
    r = np.arange(2, size + 1)
    p = r // 2
    keys, tags = heapf[1:size + 1, 0], heap[1:size + 1, 1]
    ordered = (heapf[p, 0] > heapf[r, 0]) | ((heapf[p, 0] == heapf[r, 0]) & (heap[p, 1] < heap[r, 1]))
    assert ordered.all(), "heap order"
    assert (tags >= 0).all() and ((tags >> bits) < meta[SPAN]).all(), "tags in range"
    assert 0 <= meta[STAMP] < (1 << bits) and cur.max(initial=0) <= meta[STAMP], "stamps issued"
    pending = int(meta[PENDING])
    kept = pstamp[:pending] >= 0
    ids = np.concatenate(((tags >> bits) + meta[BASE], pid[:pending][kept]))
    stamps = np.concatenate((tags & ((1 << bits) - 1), pstamp[:pending][kept]))
    keys = np.concatenate((keys, key[pid[:pending][kept] % capacity]))
    is_live = cur[ids % capacity] == stamps
    assert len(np.unique(ids[is_live] % capacity)) == is_live.sum() == meta[LIVE] == (cur >= 0).sum(), \
        "one live entry each"
    np.testing.assert_array_equal(keys[is_live], key[ids[is_live] % capacity])
    assert (ids[is_live] >= meta[BASE]).all(), "live ids at or above the base"
