"""A prototype, not used by perx: RankBased-style priority updates in a binary heap against 4- and 8-ary heaps
(docs/speed.md, "Deliberate limits"; docs/history/speed.md, "What is left").

A 1e6-entry heap sorted by key (valid for any arity), then 400 batches of 256 updates at positions drawn with
a power-law density like rank-based segments, new keys uniform in [0, 1); 32 MB are rewritten before each
batch (cold caches, as in a training loop). Same order rule as perx.samplers._heap (key descending, then id
ascending), slot-position writes included. Prints the median microseconds per batch of 256 updates.

    python benchmarks/bench_dary_heap.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from numba import njit


def make_update(d: int):
    """A compiled batch update (set key, sift up or down) for a d-ary heap."""

    @njit
    def sift(keys, ids, pos, h, size, capacity):
        key = keys[h]
        iid = ids[h]
        start = h
        while h > 0:
            parent = (h - 1) // d
            kp = keys[parent]
            if not (key > kp or (key == kp and iid < ids[parent])):
                break
            keys[h] = kp
            ids[h] = ids[parent]
            pos[ids[h] % capacity] = h
            h = parent
        if h == start:
            while True:
                first = d * h + 1
                if first >= size:
                    break
                best = first
                for c in range(first + 1, min(first + d, size)):
                    if keys[c] > keys[best] or (keys[c] == keys[best] and ids[c] < ids[best]):
                        best = c
                kc = keys[best]
                if not (kc > key or (kc == key and ids[best] < iid)):
                    break
                keys[h] = kc
                ids[h] = ids[best]
                pos[ids[h] % capacity] = h
                h = best
        keys[h] = key
        ids[h] = iid
        pos[iid % capacity] = h

    @njit
    def update(keys, ids, pos, update_ids, values, capacity, size):
        for b in range(update_ids.shape[0]):
            h = pos[update_ids[b] % capacity]
            keys[h] = values[b]
            sift(keys, ids, pos, h, size, capacity)

    return update


def main(n: int = 1_000_000, batches: int = 400, batch_size: int = 256, arities=(2, 4, 8), seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    keys0 = np.sort(rng.random(n))[::-1].copy()  # sorted descending: a valid heap for any arity
    ids0 = rng.permutation(n).astype(np.int64)
    pos0 = np.empty(n, np.int64)
    pos0[ids0] = np.arange(n)
    updates = {d: make_update(d) for d in arities}
    state = {d: (keys0.copy(), ids0.copy(), pos0.copy()) for d in arities}
    for d in arities:  # compile
        updates[d](*state[d], np.arange(3), np.zeros(3), n, n)
    evict = np.zeros(4 << 20)
    times: dict[int, list[float]] = {d: [] for d in arities}
    for _ in range(batches):
        # positions with density ~ p^-0.7, as rank-based segments draw them
        positions = np.minimum((rng.random(batch_size) ** (1 / 0.3) * n).astype(np.int64), n - 1)
        values = rng.random(batch_size)
        for d in arities:
            keys, ids, pos = state[d]
            update_ids = ids[positions]  # the ids now at those positions
            evict += 1.0
            t0 = time.perf_counter_ns()
            updates[d](keys, ids, pos, update_ids, values, n, n)
            times[d].append((time.perf_counter_ns() - t0) / 1000)
    result = {d: statistics.median(t) for d, t in times.items()}
    for d, t in result.items():
        print(f"{d}-ary heap: {t:.1f} us per batch of {batch_size} updates")
    return result


if __name__ == "__main__":
    main()
