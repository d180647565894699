"""Array-based binary max-heap over (key, id) with a slot -> position map (000 Sec. 3.2, App. B.2.1).

Order: entry a comes before entry b iff ``key_a > key_b``, or the keys are equal and ``id_a < id_b``
(the older transition first). Keys are |delta| >= 0, or +inf for a transition not replayed yet, so
every new transition ranks above every replayed one, oldest first.

Arrays (all of length capacity): ``keys[h]`` and ``ids[h]`` for heap positions ``h < size``;
``pos[slot]`` is the heap position of the transition stored in ``slot`` (-1 while the slot is empty).
``size`` lives in ``state[0]`` and the number of updates since the last full sort in ``state[1]``.

Invariant: the entry at parent(h) comes before the one at h, or the two are equal, for every ``0 < h < size``; and
``pos[ids[h] % capacity] == h``. A heap array sorted in this order is a valid heap, which is what the
periodic full sort of the rank-based sampler relies on.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perx._jit import Entry, array, boolean, contiguous, float64, int64, loose
from perx._prefetch import AHEAD, prefetch
from perx.samplers.base import check_update, ids_of_slots

#: How many ancestors of a later new transition's position an add asks for (_place): a new transition enters
#: at +inf and rises (~7 levels at 1e7), along a path known in advance, so its lines can be asked for early:
#: about a quarter off an extend of 256 rows with cold caches at 1e6 and 1e7, 4 to 8 ancestors alike. Updates
#: move up or down, and asking for their ancestors too made sample+update slower. Measured:
#: docs/history/speed.md, change 30.
UP = 8


@njit(cache=True, nogil=True)
def sift(keys, ids, pos, h, size, capacity):
    """Restore the heap order around position h (moves up or down); O(log size).

    The entry is held aside while the entries it passes move into the hole one level at a time, and is
    written once where it stops: one ``pos`` write per level instead of a swap's two (``pos`` is indexed by
    slot, so each write is a cache miss). The arrays end exactly as with swaps.
    """
    key = keys[h]
    iid = ids[h]
    start = h
    while h > 0:
        parent = (h - 1) >> 1
        kp = keys[parent]
        if not (key > kp or (key == kp and iid < ids[parent])):
            break
        keys[h] = kp
        ids[h] = ids[parent]
        pos[ids[h] % capacity] = h
        h = parent
    if h == start:  # it did not move up, so it may have to move down
        while True:
            child = 2 * h + 1
            if child >= size:
                break
            kc = keys[child]
            if child + 1 < size:
                kd = keys[child + 1]
                if kd > kc or (kd == kc and ids[child + 1] < ids[child]):
                    child += 1
                    kc = kd
            if not (kc > key or (kc == key and ids[child] < iid)):
                break
            keys[h] = kc
            ids[h] = ids[child]
            pos[ids[h] % capacity] = h
            h = child
    keys[h] = key
    ids[h] = iid
    pos[iid % capacity] = h
    return h


@njit(cache=True, nogil=True, inline="always")
def _slot(i, base, capacity):
    """``i % capacity`` (i >= 0) without a division for an id of the window [base - capacity, base + capacity),
    base a multiple of capacity (-7% of an update of 256 at 1e6, -13% at 1e7); any other id takes the
    division (the kernels have no bounds checks, so a slot must never come out of range)."""
    j = i - base
    if j < 0:
        j += capacity
        if j < 0:
            j = i % capacity
    elif j >= capacity:
        j = i % capacity
    return j


@njit(cache=True, nogil=True)
def _place(keys, ids, pos, state, slots, new_ids, values, count, capacity, next_id):
    """For b < count: the transition in slot slots[b] gets key values[b] and moves to its place. With
    ``new_ids`` non-empty, slot slots[b] first takes the new transition new_ids[b] (at the end of the heap if
    the slot was empty). The batched core of :func:`heap_add` and :func:`heap_update`. ``next_id`` (for
    updates; adds take it from new_ids[b]) sets the window in which ``_slot`` needs no division: the live
    ids, and for an add larger than the buffer also the older ids its rows replace."""
    adding = new_ids.shape[0] > 0
    size = state[0]
    base = next_id - next_id % capacity
    for b in range(count):
        # perx._prefetch: a later slot's position entry, and (from the entry asked for earlier) its key; a
        # hint only, so an entry that the sifts before it move does no harm
        if b + 2 * AHEAD < count:
            prefetch(pos, slots[b + 2 * AHEAD])
        if b + AHEAD < count:
            ahead = pos[slots[b + AHEAD]]
            if ahead >= 0:
                prefetch(keys, ahead)
                prefetch(ids, ahead)
                a = ahead
                for _ in range(UP if adding else 0):  # the lines its rise will read (UP, above)
                    a = (a - 1) >> 1
                    if a < 0:
                        break
                    prefetch(keys, a)
                    prefetch(ids, a)
        s = slots[b]
        h = pos[s]
        if adding:
            nid = new_ids[b] + 1
            base = nid - nid % capacity
            if h < 0:
                h = size
                size += 1
            ids[h] = new_ids[b]
            pos[s] = h
        keys[h] = values[b]
        # the steps of sift(keys, ids, pos, h, size, capacity), written out: numba does not inline sift, and
        # the call (or its inline="always"), passing every array as a struct, was half of the loop at 1e6
        # (docs/history/speed.md, change 16)
        key = keys[h]
        iid = ids[h]
        start = h
        while h > 0:
            parent = (h - 1) >> 1
            kp = keys[parent]
            if not (key > kp or (key == kp and iid < ids[parent])):
                break
            keys[h] = kp
            i = ids[parent]
            ids[h] = i
            pos[_slot(i, base, capacity)] = h
            h = parent
        if h == start:
            while True:
                child = 2 * h + 1
                if child >= size:
                    break
                kc = keys[child]
                if child + 1 < size:
                    kd = keys[child + 1]
                    if kd > kc or (kd == kc and ids[child + 1] < ids[child]):
                        child += 1
                        kc = kd
                if not (kc > key or (kc == key and ids[child] < iid)):
                    break
                keys[h] = kc
                i = ids[child]
                ids[h] = i
                pos[_slot(i, base, capacity)] = h
                h = child
        keys[h] = key
        ids[h] = iid
        pos[_slot(iid, base, capacity)] = h
    state[0] = size


@njit(cache=True, nogil=True)
def heap_add(keys, ids, pos, state, slots, new_ids, capacity):
    """Insert new transitions at key +inf (or replace the overwritten transition of their slot)."""
    n = slots.shape[0]
    _place(keys, ids, pos, state, slots, new_ids, np.full(n, np.inf), n, capacity, 0)


@njit(cache=True, nogil=True)
def heap_add_range(keys, ids, pos, state, first, new_ids, capacity):
    """:func:`heap_add` of the slots ``first, ..., first + len(new_ids) - 1``, made here rather than by an
    ``np.arange`` in Python: no array to make and pass in (measured: docs/history/speed.md, change 33)."""
    n = new_ids.shape[0]
    _place(keys, ids, pos, state, np.arange(first, first + n), new_ids, np.full(n, np.inf), n, capacity, 0)


@njit(cache=True, nogil=True)
def heap_add_one(keys, ids, pos, state, slot, new_id, capacity):
    """:func:`heap_add` of one transition, from scalars (``ReplayBuffer.add``); the same steps."""
    size = state[0]
    h = pos[slot]
    if h < 0:
        h = size
        size += 1
    keys[h] = np.inf
    ids[h] = new_id
    pos[slot] = h
    sift(keys, ids, pos, h, size, capacity)
    state[0] = size


@njit(cache=True, nogil=True)
def heap_update(keys, ids, pos, state, update_ids, values, next_id, capacity, raw):
    """Validate all, then set key |delta| (or the raw priority) for each live id; returns the count
    applied, or -1 (bad value) / -2 (id never issued) with nothing changed."""
    n = update_ids.shape[0]
    code = check_update(update_ids, values, next_id, capacity, raw)
    if code < 0:
        return code
    oldest = next_id - capacity
    slots = np.empty(n, np.int64)
    keys_new = np.empty(n)
    count = 0
    for b in range(n):
        i = update_ids[b]
        if i >= oldest:  # else stale: the slot now holds a newer transition
            slots[count] = i % capacity
            keys_new[count] = values[b] if raw else abs(values[b])
            count += 1
    _place(keys, ids, pos, state, slots, slots[:0], keys_new, count, capacity, next_id)
    state[1] += count
    return count


# The per-step kernels without type dispatch (perx._jit): keys float64 [capacity], ids, pos and state int64
# (RankBased._allocate); slots and new ids from the storage, contiguous; ids and values of an update from
# callers, any strides (dtype, rank and contiguity checked before the call)
_I1 = array(int64, 1)
HEAP_ADD = Entry(heap_add, (array(float64, 1), _I1, _I1, _I1, contiguous(int64, 1), contiguous(int64, 1), int64))
HEAP_ADD_RANGE = Entry(heap_add_range, (array(float64, 1), _I1, _I1, _I1, int64, array(int64, 1), int64))
HEAP_ADD_ONE = Entry(heap_add_one, (array(float64, 1), _I1, _I1, _I1, int64, int64, int64))
HEAP_UPDATE = Entry(heap_update, (array(float64, 1), _I1, _I1, _I1, loose(int64, 1), loose(float64, 1), int64, int64,
                                  boolean))


#: Radix digit width of the full sort: 12 bits, six digits for a 64-bit key (4096 counters per digit, 32 KiB
#: each). 11 and 13 bits measured the same within 2% at 1e6 and 1e7 (docs/history/speed.md, change 23).
_DIGIT = 12
_DIGITS = 6
_MASK = (1 << _DIGIT) - 1


@njit(cache=True, nogil=True)
def digit_counts(k):
    """How many of the uint64 keys ``k`` have each value of each 12-bit digit: int64 [6, 4096]. One read."""
    cnt = np.zeros((_DIGITS, _MASK + 1), np.int64)
    for i in range(k.shape[0]):
        x = k[i]
        for p in range(_DIGITS):
            cnt[p, (x >> np.uint64(_DIGIT * p)) & np.uint64(_MASK)] += 1
    return cnt


@njit(cache=True, nogil=True)
def active_digits(cnt, n):
    """How many digits of :func:`digit_counts` differ between keys: the passes :func:`radix_passes` makes."""
    active = 0
    for p in range(_DIGITS):
        if cnt[p].max() < n:
            active += 1
    return active


@njit(cache=True, nogil=True)
def radix_passes(k, tmp, payload, src, cnt):
    """Stable ascending LSD radix sort of the n uint64 keys ``k`` carrying the uint32 payloads
    ``payload[src:src + n]``, with the counts ``cnt`` of :func:`digit_counts` (consumed).

    ``tmp`` (uint64 [n]) and the other half of ``payload`` (uint32 [>= 2n], ``src`` 0 or n) are the scratch
    the passes alternate with; a digit that is the same for every key costs no pass, so after
    :func:`active_digits` passes the payloads lie in the half ``src`` did not start in when that count is odd.
    Returns (the sorted keys, which are ``k`` or ``tmp``; the offset of the sorted payloads). O(n) per pass,
    at most 6 passes."""
    n = k.shape[0]
    for p in range(_DIGITS):
        c = cnt[p]
        if c.max() == n:
            continue
        total = 0
        for d in range(_MASK + 1):
            t = c[d]
            c[d] = total
            total += t
        sh = np.uint64(_DIGIT * p)
        dst = n - src
        for i in range(n):
            x = k[i]
            d = (x >> sh) & np.uint64(_MASK)
            q = c[d]
            c[d] = q + 1
            tmp[q] = x
            payload[dst + q] = payload[src + i]
        k, tmp = tmp, k
        src = dst
    return k, src


def radix_sort_pairs(k: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stable ascending sort of the uint64 keys ``k`` carrying the uint32 payload ``idx``: (sorted keys,
    payloads), new arrays or ``k`` overwritten. :func:`radix_passes` with scratch of its own."""
    n = k.shape[0]
    payload = np.empty(2 * n, np.uint32)
    payload[:n] = idx
    keys, at = radix_passes(k, np.empty(n, np.uint64), payload, 0, digit_counts(k))
    return keys, payload[at:at + n]


@njit(cache=True, nogil=True)
def _sort_live_range(keys, ids, pos, size, capacity):
    """``full_sort`` when the heap's ids are a contiguous range without repeats and its keys >= 0; returns
    False, having written nothing, otherwise. The keys are scattered into id order as ``~bits(|key|)`` (keys
    >= 0, never NaN, order as their bits; -0.0 sorts as +0.0), so one stable sort ascending gives key
    descending, then id ascending; the sorted keys are written back from those bits, or, if some key was
    -0.0, from a copy.

    Once scattered, ``keys[:size]`` and ``ids[:size]`` are the sort's scratch (``ids[:size]`` as two halves of
    uint32 payloads), so besides the id-order keys it allocates only the id check's flags (n bytes), the digit
    counts and, if some key is -0.0, the keys' copy: no payload arrays. The caller passes only C-contiguous
    int64 ``ids`` and float64 ``keys`` (``full_sort`` checks). With the 12-bit digits, sorting in the heap's
    own arrays took about a fifth off the whole ``RankBased.sort`` at 1e7 and over a quarter at 1e6, with the
    same arrays bit for bit (measured: docs/history/speed.md, change 23). The payloads start in the half where
    the passes end in the upper one: writing ``ids[q]`` then overwrites only the payload words of positions
    <= q, already read."""
    n = size
    lo = ids[0]
    hi = ids[0]
    for i in range(n):
        lo = min(lo, ids[i])
        hi = max(hi, ids[i])
    if hi - lo != n - 1 or n >= 2**32:
        return False
    sign = np.uint64(1) << np.uint64(63)
    bits = keys.view(np.uint64)
    k = np.empty(n, np.uint64)
    seen = np.zeros(n, np.bool_)
    negative_zero = False
    for i in range(n):
        j = ids[i] - lo
        if seen[j] or not keys[i] >= 0.0:  # a repeated id; a negative or NaN key (refused on every way in)
            return False
        seen[j] = True
        negative_zero |= bits[i] == sign
        k[j] = ~(bits[i] & ~sign)
    by_id = np.empty(n if negative_zero else 0, np.float64)
    for i in range(by_id.shape[0]):
        by_id[ids[i] - lo] = keys[i]
    cnt = digit_counts(k)
    payload = ids.view(np.uint32)  # words [0, 2n) are ids[:n]: free from here on
    src = n if active_digits(cnt, n) % 2 == 0 else 0
    for i in range(n):
        payload[src + i] = i
    k, at = radix_passes(k, bits[:n], payload, src, cnt)
    for q in range(n):
        m = payload[at + q]  # at == n; read before ids[q] overwrites words 2q and 2q + 1 (<= n + q)
        if negative_zero:
            keys[q] = by_id[m]
        else:
            bits[q] = ~k[q]
        v = lo + np.int64(m)
        ids[q] = v
        pos[v % capacity] = q
    return True


def full_sort(keys: np.ndarray, ids: np.ndarray, pos: np.ndarray, size: int, capacity: int) -> None:
    """Sort the heap array in heap order (a sorted array is a valid heap); O(size) on the fast path below,
    O(size log size) by lexsort otherwise.

    The order of ``np.lexsort((ids, -keys))``: the heap holds the live ids, a contiguous range, so a
    scatter puts the keys in id order, and one stable radix sort by key keeps that order among equal keys
    (``_sort_live_range``, one compiled call, several times faster than lexsort: docs/history/speed.md,
    changes 17, 18 and 23). Any other ids, and arrays that are not C-contiguous int64 ids and float64 keys
    (the fast path uses their memory as scratch by word): lexsort itself."""
    if (size and ids.dtype == np.int64 and keys.dtype == np.float64 and ids.flags.c_contiguous
            and keys.flags.c_contiguous and _sort_live_range(keys, ids, pos, size, capacity)):
        return
    order = np.lexsort((ids[:size], -keys[:size]))
    keys[:size] = keys[:size][order]
    ids[:size] = ids[:size][order]
    pos[ids[:size] % capacity] = np.arange(size)


def _check_live_ids(ids: np.ndarray, size: int, next_id: int, what: str) -> None:
    live = np.arange(next_id - size, next_id, dtype=np.int64)
    if not np.array_equal(np.sort(ids), live):
        raise ValueError(f"ids: the {what} must hold exactly the live ids {next_id - size}..{next_id - 1}")


def _check_keys(keys: np.ndarray) -> None:
    bad = ~(keys >= 0.0)  # catches NaN and negatives; +inf (not yet replayed) is allowed
    if bad.any():
        raise ValueError(f"keys: must be >= 0 (or +inf), got {keys[bad][0]!r}")


def check_heap(keys: np.ndarray, ids: np.ndarray, pos: np.ndarray, size: int, next_id: int,
               capacity: int) -> None:
    """Raise ValueError unless the arrays form a valid heap of the ``size`` live transitions: positions
    in range and inverse to the ids, ids exactly the live ids, keys valid, heap order. O(N log N)."""
    if (pos[size:] != -1).any() or (size and (pos[:size].min() < 0 or pos[:size].max() >= size)):
        raise ValueError(f"pos: heap positions must lie in [0, {size}) for the stored slots and be -1 elsewhere")
    _check_live_ids(ids[:size], size, next_id, "heap")
    _check_keys(keys[:size])
    if not is_heap(keys, ids, pos, size, capacity):
        raise ValueError("keys/pos: the saved arrays are not a heap in (key descending, id ascending) order")


def check_slots(keys: np.ndarray, ids: np.ndarray, pos: np.ndarray, size: int, next_id: int,
                capacity: int) -> None:
    """The per-slot layout of RankBased(exact=True): ids[s] the id in slot s, pos[s] 0 (stored) or -1."""
    if (pos[:size] != 0).any() or (pos[size:] != -1).any():
        raise ValueError(f"pos: must be 0 for the {size} stored slots and -1 elsewhere")
    if size and not np.array_equal(ids[:size], ids_of_slots(np.arange(size, dtype=np.int64), next_id, capacity)):
        raise ValueError("ids: each stored slot must hold the live id that lives there")
    _check_keys(keys[:size])


def is_heap(keys: np.ndarray, ids: np.ndarray, pos: np.ndarray, size: int, capacity: int) -> bool:
    """Check the invariant (for tests); O(size)."""
    h = np.arange(1, size)
    parent = (h - 1) // 2
    kp, kh = keys[parent], keys[h]
    ordered = (kp > kh) | ((kp == kh) & (ids[parent] <= ids[h]))
    return bool(ordered.all() and (pos[ids[:size] % capacity] == np.arange(size)).all())
