"""perx.Greedy's max-heap: no slot -> position map; an update pushes a new entry and the old one goes stale.

Greedy (000 Sec. 3.2) returns the k transitions with the largest keys, ties to the older, so what it returns
depends only on the set of live (key, id) pairs, never on where they sit in a heap. That frees it from the
position map a binary heap needs to find an entry again (``_heap``): there, every level an entry passes
costs a write of ``pos[slot]`` to a random cache line, about half of a sift's time. Here:

* a new key is *pushed* as a fresh entry (key, id, stamp) at the end of the heap array and rises; the stamp
  is a number issued once, and ``cur[slot]`` holds the stamp of the slot's live entry, so any older entry of
  that slot (a previous key, or an overwritten transition) is stale from then on;
* ``sample(k)`` *pops* entries from the root until k live ones came out; stale ones are dropped for good.
  The k live ones are *pending*: the next sample pushes back those that no update replaced meanwhile (with
  their stamp, so they stay live);
* when the heap array is full, the live entries are compacted and re-heapified (O(capacity), 16 ms at 1e6,
  at most once per capacity / 8 pushes). The slack is kept small on purpose: stale entries make the heap
  deeper and each pop slower (measured at 1e6 with half of the entries stale: pops ~1.7x slower).

Order: entry a before entry b iff ``key_a > key_b``, or equal keys and ``id_a < id_b``; keys are |delta|
(or a raw priority) >= 0, +inf for a transition not replayed yet.

Arrays: ``hkey`` float64, ``hid`` int64, ``hstamp`` int64, all [capacity + capacity // 8 + 2] (the heap entries);
``cur`` int64 [capacity] (stamp of the slot's live entry, 0 for an empty slot); ``key`` float64 [capacity]
(the slot's current key); ``pid``, ``pstamp`` int64 [>= k] (pending entries); ``meta`` int64 [5]:
entries in the heap array, last stamp issued, live transitions, pending entries, priority updates applied.
Costs: push O(1) expected for a random key (O(log N) for +inf), pop O(log N), amortized compaction O(1).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perx.samplers._heap import rise_entry, sink_entry
from perx.samplers.base import check_update

HEAP, STAMP, LIVE, PENDING, UPDATES = range(5)


@njit(cache=True, nogil=True)
def _compact(hkey, hid, hstamp, cur, meta, capacity):
    """Drop the stale entries and re-heapify the rest (Floyd's bottom-up construction); O(entries)."""
    n = 0
    for h in range(meta[HEAP]):
        if cur[hid[h] % capacity] == hstamp[h]:
            hkey[n] = hkey[h]
            hid[n] = hid[h]
            hstamp[n] = hstamp[h]
            n += 1
    for h in range(n // 2 - 1, -1, -1):
        sink_entry(hkey, hid, hstamp, h, n)
    meta[HEAP] = n


@njit(cache=True, nogil=True)
def _push(hkey, hid, hstamp, cur, meta, capacity, key, iid, stamp):
    """Append (key, id, stamp) and let it rise; compacts first when the heap array is full."""
    if meta[HEAP] == hkey.shape[0]:
        _compact(hkey, hid, hstamp, cur, meta, capacity)
    h = meta[HEAP]
    meta[HEAP] = h + 1
    hkey[h] = key
    hid[h] = iid
    hstamp[h] = stamp
    rise_entry(hkey, hid, hstamp, h)


@njit(cache=True, nogil=True)
def add(hkey, hid, hstamp, cur, key, meta, slots, new_ids, capacity):
    """New transitions enter at key +inf; the one overwritten in their slot goes stale."""
    for b in range(slots.shape[0]):
        s = slots[b]
        if cur[s] == 0:
            meta[LIVE] += 1
        stamp = meta[STAMP] + 1
        meta[STAMP] = stamp
        cur[s] = stamp
        key[s] = np.inf
        _push(hkey, hid, hstamp, cur, meta, capacity, np.inf, new_ids[b], stamp)


@njit(cache=True, nogil=True)
def add_one(hkey, hid, hstamp, cur, key, meta, slot, new_id, capacity):
    """:func:`add` of one transition, from scalars (``ReplayBuffer.add``); the same steps."""
    if cur[slot] == 0:
        meta[LIVE] += 1
    stamp = meta[STAMP] + 1
    meta[STAMP] = stamp
    cur[slot] = stamp
    key[slot] = np.inf
    _push(hkey, hid, hstamp, cur, meta, capacity, np.inf, new_id, stamp)


@njit(cache=True, nogil=True)
def update(hkey, hid, hstamp, cur, key, meta, update_ids, values, next_id, capacity, raw):
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
        stamp = meta[STAMP] + 1
        meta[STAMP] = stamp
        cur[s] = stamp
        key[s] = k
        _push(hkey, hid, hstamp, cur, meta, capacity, k, i, stamp)
        count += 1
    meta[UPDATES] += count
    return count


@njit(cache=True, nogil=True)
def top(hkey, hid, hstamp, cur, key, meta, pid, pstamp, capacity, k, out):
    """Write the ids of the k first live transitions, best first, into ``out``; k <= live transitions and
    ``pid``/``pstamp`` hold >= k. Pushes back the previous call's pending entries first (those still live),
    then pops; the k popped are pending until the next call."""
    for j in range(meta[PENDING]):
        i = pid[j]
        s = i % capacity
        if cur[s] == pstamp[j]:  # neither updated nor overwritten since it was popped
            _push(hkey, hid, hstamp, cur, meta, capacity, key[s], i, pstamp[j])
    meta[PENDING] = 0
    t = 0
    size = meta[HEAP]
    while t < k:
        i = hid[0]
        stamp = hstamp[0]
        size -= 1
        hkey[0] = hkey[size]
        hid[0] = hid[size]
        hstamp[0] = hstamp[size]
        sink_entry(hkey, hid, hstamp, 0, size)
        if cur[i % capacity] == stamp:
            out[t] = i
            pid[t] = i
            pstamp[t] = stamp
            t += 1
    meta[HEAP] = size
    meta[PENDING] = k


@njit(cache=True, nogil=True)
def live_entries(hkey, hid, hstamp, cur, key, meta, pid, pstamp, capacity):
    """(keys, ids) of the live transitions, one each, in no particular order: the heap's live entries and
    the pending ones still live."""
    n = meta[LIVE]
    keys = np.empty(n)
    ids = np.empty(n, np.int64)
    j = 0
    for h in range(meta[HEAP]):
        if cur[hid[h] % capacity] == hstamp[h]:
            if j < n:
                keys[j] = hkey[h]
                ids[j] = hid[h]
            j += 1
    for p in range(meta[PENDING]):
        s = pid[p] % capacity
        if cur[s] == pstamp[p]:
            if j < n:
                keys[j] = key[s]
                ids[j] = pid[p]
            j += 1
    if j != n:  # a broken invariant: report it rather than return a partial set
        return keys[:0], ids[:0]
    return keys, ids


def check(hkey: np.ndarray, hid: np.ndarray, hstamp: np.ndarray, cur: np.ndarray, key: np.ndarray,
          meta: np.ndarray, pid: np.ndarray, pstamp: np.ndarray, capacity: int) -> None:
    """Raise AssertionError unless the invariants hold (for tests): heap order over the array's entries,
    each live slot's stamp found exactly once (in the heap or pending) with the slot's key, stamps
    issued at most once. O(entries)."""
    size = int(meta[HEAP])
    h = np.arange(1, size)
    parent = (h - 1) // 2
    ordered = (hkey[parent] > hkey[h]) | ((hkey[parent] == hkey[h]) & (hid[parent] <= hid[h]))
    assert ordered.all(), "heap order"
    stamps = np.concatenate((hstamp[:size], pstamp[: meta[PENDING]]))
    idents = np.concatenate((hid[:size], pid[: meta[PENDING]]))
    keys = np.concatenate((hkey[:size], key[pid[: meta[PENDING]] % capacity]))
    is_live = cur[idents % capacity] == stamps
    assert len(np.unique(stamps[is_live])) == is_live.sum() == meta[LIVE] == (cur > 0).sum(), "one live entry each"
    np.testing.assert_array_equal(keys[is_live], key[idents[is_live] % capacity])
    assert stamps.max(initial=0) <= meta[STAMP] and cur.max(initial=0) <= meta[STAMP], "stamps"
