"""Rank-based PER and greedy prioritization (000 Sec. 3.2, 3.3, App. B.2.1)."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import stats

import perx
from perx.samplers import _heap
from perx.samplers.rank import power_law, rank_segments, segment_probabilities
from tests.conftest import transitions

P_MIN = 1e-3  # chi-square p-value threshold (a correct sampler fails ~1 seed in 1000; seeds fixed)


def true_order(keys, ids):
    """Slots in exact rank order: key descending, then id ascending."""
    return np.lexsort((ids, -keys))


def rank_buffer(n, *, alpha=0.7, exact=False, sort_every=None, seed=0):
    buf = perx.ReplayBuffer(n, perx.RankBased(alpha=alpha, exact=exact, sort_every=sort_every), seed=seed)
    buf.extend(**transitions(n))
    td = np.random.default_rng(seed + 1).standard_cauchy(n)  # heavy-tailed |delta|
    buf.update_priorities(np.arange(n), td)
    return buf, np.abs(td)


@pytest.mark.parametrize(("n", "k", "alpha"), [(1000, 32, 0.7), (10_000, 32, 0.5), (100_000, 256, 0.7),
                                               (5000, 64, 1.0), (40, 32, 0.7)])
def test_segments_carry_equal_mass_within_the_rounding_of_a_discrete_distribution(n, k, alpha):
    lo, hi = rank_segments(n, k, alpha)
    assert lo[0] == 0 and hi[-1] == n and (hi > lo).all()
    assert (np.diff(lo) >= 0).all() and (np.diff(hi) >= 0).all() and (lo[1:] <= hi[:-1]).all()
    pmf = power_law(n, alpha)
    cum = np.concatenate(([0.0], np.cumsum(pmf)))
    mass = cum[hi] - cum[lo]
    # Segment j covers its quantile slice of mass exactly 1/k, plus at most the parts of its two
    # straddling ranks that fall outside the slice.
    assert (mass >= 1 / k - 1e-12).all()
    assert (mass <= 1 / k + pmf[lo] + pmf[hi - 1] + 1e-12).all()


def test_a_rank_heavier_than_a_segment_spans_several_segments():
    n, k = 5000, 64
    pmf = power_law(n, 1.0)  # rank 1 alone has 0.11 > 1/64: about 7 segments' worth
    lo, hi = rank_segments(n, k, 1.0)
    holding_rank_1 = int(((lo <= 0) & (hi > 0)).sum())
    assert holding_rank_1 == int(np.ceil(pmf[0] * k))
    p = segment_probabilities(lo, hi, np.arange(n))
    assert abs(p.sum() - 1) < 1e-12
    assert abs(p[0] - pmf[0]) < 1 / k  # the head keeps its weight, up to one segment


def test_segment_probabilities_sum_to_one_and_approximate_the_power_law():
    n, k = 10_000, 32
    buf, _ = rank_buffer(n, exact=True)
    p_seg = buf.probabilities(batch_size=k)
    assert abs(p_seg.sum() - 1) < 1e-12
    ranks = buf.sampler.ranks(np.arange(n))
    tv = 0.5 * np.abs(p_seg - power_law(n, 0.7)[ranks]).sum()
    # The price of the paper's piecewise-linear CDF with 32 segments at N = 1e4 (docs/rank_based.md).
    assert tv < 0.04  # measured 0.0367


def test_exact_mode_ranks_are_the_true_sorted_order():
    buf, keys = rank_buffer(500, exact=True)
    order = true_order(keys, np.arange(500))
    np.testing.assert_array_equal(buf.sampler.ranks(order), np.arange(500))


@pytest.mark.parametrize("exact", [True, False])
def test_sampled_rank_positions_match_the_reported_probabilities(exact):
    """Chi-square of counts per rank position against the per-draw probabilities (1/(k L_j))."""
    n, k, batches = 300, 16, 4000
    buf, _ = rank_buffer(n, exact=exact, alpha=0.7, seed=3)
    counts = np.zeros(n)
    for _ in range(batches):
        b = buf.sample(k, beta=0.5)
        np.add.at(counts, buf.sampler.ranks(b.indices % n), 1)
    slots_by_rank = np.argsort(buf.sampler.ranks(np.arange(n)))
    expected = buf.probabilities(slots_by_rank, batch_size=k) * k * batches
    stat = ((counts - expected) ** 2 / expected).sum()
    assert stats.chi2.sf(stat, df=n - 1) > P_MIN
    # Power: the same counts reject the segment probabilities of a wrong alpha (0.6 instead of 0.7).
    wrong = segment_probabilities(*rank_segments(n, k, 0.6), np.arange(n)) * k * batches
    assert stats.chi2.sf(((counts - wrong) ** 2 / wrong).sum(), df=n - 1) < 1e-12


def test_draw_j_lies_in_segment_j():
    n, k = 1000, 32
    buf, _ = rank_buffer(n, exact=True)
    lo, hi = rank_segments(n, k, 0.7)
    for _ in range(20):
        ranks = buf.sampler.ranks(buf.sample(k).indices % n)
        assert ((lo <= ranks) & (ranks < hi)).all()


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("beta", [0.5, 1.0])
def test_is_weights_match_closed_form_with_max_at_lowest_probability_rank(exact, beta):
    n, k = 2000, 32
    buf, _ = rank_buffer(n, exact=exact)
    batch = buf.sample(k, beta=beta)
    all_p = buf.probabilities(batch_size=k)
    closed = (n * batch.probabilities) ** -beta / ((n * all_p) ** -beta).max()
    np.testing.assert_allclose(batch.weights, closed, rtol=1e-12)
    # the lowest-probability ranks are the last segment's: their weight is the maximum, 1
    assert batch.weights[np.argmin(batch.probabilities)] == 1.0
    lowest = np.argsort(buf.sampler.ranks(batch.indices % n))[-1]
    assert batch.weights[lowest] == 1.0


def test_fewer_transitions_than_segments_use_the_exact_power_law():
    buf, _ = rank_buffer(10, exact=True)
    batch = buf.sample(32, beta=1.0)
    ranks = buf.sampler.ranks(batch.indices % 10)
    np.testing.assert_allclose(batch.probabilities, power_law(10, 0.7)[ranks], rtol=1e-15)
    np.testing.assert_allclose(batch.weights, (power_law(10, 0.7)[ranks] / power_law(10, 0.7)[-1]) ** -1.0)


@settings(max_examples=60, deadline=None)
@example(capacity=3, ops=[("add", 12), ("add", 2), ("add", 8)])  # ids 12 and 19 in the heap at once
@given(
    capacity=st.integers(1, 40),
    ops=st.lists(st.one_of(st.tuples(st.just("add"), st.integers(1, 12)),
                           st.tuples(st.just("upd"), st.lists(st.floats(0, 8, allow_nan=False), min_size=1,
                                                               max_size=12))), min_size=1, max_size=25),
)
def test_heap_invariant_holds_after_random_adds_and_updates(capacity, ops):
    buf = perx.ReplayBuffer(capacity, perx.RankBased(sort_every=10**9), seed=0)
    rng = np.random.default_rng(0)
    for op, arg in ops:
        if op == "add":
            buf.extend(**transitions(arg, start=buf.next_index))
        elif len(buf):
            live = np.arange(buf.next_index - len(buf), buf.next_index)
            ids = rng.choice(live, len(arg))
            buf.update_priorities(ids, np.round(arg, 1))  # rounding makes ties common
        s = buf.sampler
        assert _heap.is_heap(s._keys, s._ids, s._pos, int(s._state[0]), capacity)
        assert int(s._state[0]) == len(buf)


def test_full_sort_every_sort_every_updates_makes_positions_exact():
    buf, _ = rank_buffer(400, sort_every=10**9)
    rng = np.random.default_rng(2)
    buf.update_priorities(rng.integers(0, 400, 300), rng.exponential(1, 300))
    keys = buf.sampler.keys(np.arange(400))
    exact_ranks = np.empty(400, np.int64)
    exact_ranks[true_order(keys, np.arange(400))] = np.arange(400)
    assert not np.array_equal(buf.sampler.ranks(np.arange(400)), exact_ranks)  # a heap, not sorted
    buf.sampler.sort()
    np.testing.assert_array_equal(buf.sampler.ranks(np.arange(400)), exact_ranks)


def test_sort_is_triggered_after_sort_every_priority_updates():
    buf, _ = rank_buffer(100, sort_every=50)  # the fill's 100 updates already triggered one sort
    s = buf.sampler
    assert s._state[1] == 0
    buf.update_priorities(np.arange(30), np.arange(30.0))
    assert s._state[1] == 30
    buf.update_priorities(np.arange(30), np.arange(30.0))
    assert s._state[1] == 0  # 60 >= 50: sorted and reset


@pytest.mark.parametrize("exact", [True, False])
def test_new_transitions_enter_at_the_top_ranks_oldest_first(exact):
    buf, _ = rank_buffer(50, exact=exact)
    ids = buf.extend(**transitions(3, start=50))  # overwrite slots 0, 1, 2
    assert buf.sampler.ranks(ids % 50).tolist() == [0, 1, 2]
    buf.update_priorities(ids[:1], [0.0])
    assert buf.sampler.keys(ids % 50).tolist() == [0.0, np.inf, np.inf]
    ranks = buf.sampler.ranks(ids[1:] % 50)
    if exact:
        assert ranks.tolist() == [0, 1]
    else:  # a heap is only approximately sorted: the oldest unreplayed transition is its root
        assert ranks[0] == 0 and ranks[1] <= 2


def test_segments_are_cached_and_reused_for_close_sizes():
    s = perx.RankBased()
    perx.ReplayBuffer(100_000, s)
    lo, hi, _, _ = s.boundaries(10_000, 32)
    assert s.boundaries(10_000, 32)[0] is lo
    lo2, hi2, _, _ = s.boundaries(10_050, 32)  # within 1%: reused, last segment stretched
    assert lo2 is lo
    np.testing.assert_array_equal(hi2[:-1], hi[:-1])
    assert hi2[-1] == 10_050
    lo3, hi3, _, _ = s.boundaries(10_200, 32)  # beyond 1%: recomputed
    np.testing.assert_array_equal(lo3, rank_segments(10_200, 32, 0.7)[0])
    np.testing.assert_array_equal(hi3, rank_segments(10_200, 32, 0.7)[1])


@pytest.mark.parametrize(("kwargs", "match"), [({"alpha": -1}, "alpha"), ({"sort_every": 0}, "sort_every"),
                                               ({"sort_every": 2.5}, "sort_every"),
                                               ({"normalize": "x"}, "normalize")])
def test_rank_based_refuses_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        perx.RankBased(**kwargs)


# -- greedy ------------------------------------------------------------------------------------------

def test_greedy_returns_the_true_top_k_with_deterministic_ties():
    n = 200
    buf = perx.ReplayBuffer(n, perx.Greedy())
    buf.extend(**transitions(n))
    rng = np.random.default_rng(4)
    td = np.round(rng.exponential(1.0, n), 1)  # many ties
    buf.update_priorities(np.arange(n), -td)
    for k in (1, 5, 37, 200):
        expected = true_order(td, np.arange(n))[:k]
        np.testing.assert_array_equal(buf.sample(k).indices, expected)


@pytest.mark.parametrize("seed", range(6))
def test_radix_sort_pairs_is_numpys_stable_argsort(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3000))
    pools = [rng.integers(0, 2**64, n, dtype=np.uint64),  # every digit varies
             rng.choice(np.array([0, 1, 2047, 2048, 2**63, 2**64 - 1], np.uint64), n),  # ties, edge values
             (rng.integers(0, 8, n, dtype=np.uint64) << np.uint64(40)),  # only one digit varies
             np.full(n, 12345, np.uint64)]  # nothing varies: every pass skipped
    if n:
        odd = np.full(n, 7, np.uint64)
        odd[rng.integers(0, n)] = 7 | (1 << 30)  # one key differs, in one digit: that pass must not be skipped
        pools.append(odd)
    for k in pools:
        payload = rng.integers(0, 2**32, n, dtype=np.uint32)
        order = np.argsort(k, kind="stable")
        got_k, got_payload = _heap.radix_sort_pairs(k.copy(), payload.copy())
        np.testing.assert_array_equal(got_k, k[order])
        np.testing.assert_array_equal(got_payload, payload[order])


@pytest.mark.parametrize("negative_zero", [True, False])
@pytest.mark.parametrize("ids_kind", ["live", "gaps", "one_gap", "repeated"])
def test_full_sort_orders_as_lexsort_of_key_descending_then_id(ids_kind, negative_zero, monkeypatch):
    """One stable sort after an id-order scatter for a contiguous range of ids, lexsort otherwise: the same
    arrays either way, with ties at +inf and 0.0, and -0.0 (equal to 0.0, and kept as -0.0) or not."""
    rng = np.random.default_rng(2)
    cap, size = 500, 430
    zeros = [0.0, -0.0] if negative_zero else [0.0]
    keys = rng.choice([np.inf, *zeros, 0.5, 1.0, 2.5], cap) * rng.choice([1.0, 1.0, rng.random()], cap)
    assert np.signbit(keys[:size]).any() == negative_zero
    ids = np.zeros(cap, np.int64)
    ids[:size] = rng.permutation(np.arange(1070, 1070 + size))  # the live ids: a contiguous range
    if ids_kind == "gaps":
        ids[:size] = np.sort(rng.choice(np.arange(900, 2000), size, replace=False))
    elif ids_kind == "one_gap":  # distinct, one id past the range of `size` ids
        ids[np.argmax(ids[:size])] += 1
    elif ids_kind == "repeated":
        ids[1] = ids[0]
    order = np.lexsort((ids[:size], -keys[:size]))
    expected_keys, expected_ids = keys[:size][order], ids[:size][order]
    pos = np.full(cap, -1, np.int64)
    if ids_kind == "live":  # the one-sort path, not lexsort
        monkeypatch.setattr(np, "lexsort", None)
    _heap.full_sort(keys, ids, pos, size, cap)
    monkeypatch.undo()
    np.testing.assert_array_equal(keys[:size], expected_keys)
    np.testing.assert_array_equal(np.signbit(keys[:size]), np.signbit(expected_keys))
    np.testing.assert_array_equal(ids[:size], expected_ids)
    if ids_kind == "live":  # (other ids may share slots)
        np.testing.assert_array_equal(pos[ids[:size] % cap], np.arange(size))


def test_full_sort_matches_lexsort_on_random_small_heaps_with_heavy_ties():
    """Capacities 1-79, sizes up to 12 or full, ids from a contiguous range that starts anywhere (near 0,
    2**32, 2**40), keys drawn from a few values with +inf, 0.0, -0.0 and a subnormal: keys, ids and positions
    as lexsort orders them, bit for bit; the slots past `size`, and the positions of slots that hold no live
    id, untouched."""
    rng = np.random.default_rng(11)
    pool = np.array([np.inf, 0.0, -0.0, 0.5, 1.0, 2.5, 5e-324, 1e308])
    for case in range(3000):
        cap = int(rng.integers(1, 13)) if case % 3 else int(rng.integers(13, 80))
        size = int(rng.integers(1, min(cap, 12) + 1)) if case % 4 else cap
        start = int(rng.choice([0, 5, 2**32 - 3, 2**40 + 12345]))
        keys = np.full(cap, 7.0)
        ids = np.full(cap, -5, np.int64)
        keys[:size] = rng.choice(pool[rng.choice(len(pool), int(rng.integers(1, 5)))], size)
        ids[:size] = rng.permutation(np.arange(start, start + size))
        pos = np.full(cap, -9, np.int64)  # a sentinel: the slots of no live id must keep it
        order = np.lexsort((ids[:size], -keys[:size]))
        expected = keys[:size][order], ids[:size][order]
        _heap.full_sort(keys, ids, pos, size, cap)
        assert keys[:size].tobytes() == expected[0].tobytes(), case
        np.testing.assert_array_equal(ids[:size], expected[1])
        np.testing.assert_array_equal(pos[ids[:size] % cap], np.arange(size))
        assert (keys[size:] == 7.0).all() and (ids[size:] == -5).all()
        others = np.setdiff1d(np.arange(cap), ids[:size] % cap)
        assert (pos[others] == -9).all(), case


@pytest.mark.parametrize("varying", [(), (0,), (1, 3), (0, 2, 3), (0, 1, 2, 3)])
def test_full_sort_ends_in_place_whatever_the_number_of_radix_passes(varying):
    """The sort's payloads start in the half of ``ids`` where its passes end in the upper one: keys that
    differ in exactly 0-4 of the 12-bit digits (an even and an odd number of passes) are ordered as lexsort
    orders them, with the slots past ``size`` untouched."""
    rng = np.random.default_rng(len(varying))
    cap, size = 3000, 2900
    bits = np.full(size, np.float64(1.5).view(np.uint64))
    for p in varying:  # the digits of the mantissa: any value there is a finite positive float
        bits |= rng.integers(0, 4096, size, dtype=np.uint64) << np.uint64(12 * p)
    keys = np.full(cap, 9.0)
    keys[:size] = bits.view(np.float64)
    ids = np.full(cap, -3, np.int64)
    ids[:size] = rng.permutation(np.arange(70, 70 + size))
    flipped = ~bits  # the sort's own keys, in some order: the digits that differ are the ones that vary
    assert _heap.active_digits(_heap.digit_counts(flipped), size) == len(varying)
    order = np.lexsort((ids[:size], -keys[:size]))
    expected_keys, expected_ids = keys[:size][order], ids[:size][order]
    pos = np.full(cap, -1, np.int64)
    assert _heap._sort_live_range(keys, ids, pos, size, cap)
    assert keys[:size].tobytes() == expected_keys.tobytes()
    np.testing.assert_array_equal(ids[:size], expected_ids)
    np.testing.assert_array_equal(pos[ids[:size] % cap], np.arange(size))
    assert (keys[size:] == 9.0).all() and (ids[size:] == -3).all()
    empty = np.setdiff1d(np.arange(cap), ids[:size] % cap)
    assert len(empty) == cap - size and (pos[empty] == -1).all()


@pytest.mark.parametrize("case", ["repeat_in_range", "negative_key", "nan_key", "one_gap", "negative_subnormal"])
def test_full_sort_takes_lexsort_where_the_one_sort_does_not_apply(case):
    """A repeated id that keeps max - min == size - 1 (only the seen-check catches it), and keys no way in
    accepts (negative, NaN): the compiled sort writes nothing and lexsort orders them."""
    keys = np.array([3.0, 1.0, 2.0, 0.5])
    ids = np.array([10, 11, 12, 13], np.int64)
    if case == "repeat_in_range":
        ids = np.array([10, 11, 11, 13], np.int64)
    elif case == "negative_key":
        keys[1] = -1.0
    elif case == "one_gap":  # distinct ids, one past the range of four
        ids = np.array([10, 11, 12, 14], np.int64)
    elif case == "negative_subnormal":
        keys[3] = -5e-324
    else:
        keys[2] = np.nan
    order = np.lexsort((ids, -keys))
    expected_keys, expected_ids = keys[order], ids[order]
    before = keys.tobytes(), ids.tobytes()
    pos = np.full(4, -1, np.int64)
    assert not _heap._sort_live_range(keys, ids, pos, 4, 4)
    assert (keys.tobytes(), ids.tobytes()) == before and (pos == -1).all()  # nothing written
    _heap.full_sort(keys, ids, pos, 4, 4)
    np.testing.assert_array_equal(keys, expected_keys)
    np.testing.assert_array_equal(ids, expected_ids)


@pytest.mark.parametrize("kind", ["strided_ids", "int32_ids", "strided_keys"])
def test_full_sort_takes_lexsort_for_arrays_the_fast_path_cannot_use_as_scratch(kind, monkeypatch):
    """The fast path reuses the heap's memory by word (ids as uint32 halves), so ids that are strided or not
    int64, and keys that are strided, are sorted by lexsort (the fast path is never called): the same order,
    nothing written past them."""

    def fast_path(*args):
        raise AssertionError("the fast path was called")

    monkeypatch.setattr(_heap, "_sort_live_range", fast_path)
    rng = np.random.default_rng(5)
    n = 9
    keys = rng.choice([0.5, 1.0, np.inf], n)
    ids = rng.permutation(np.arange(40, 40 + n)).astype(np.int64)
    order = np.lexsort((ids, -keys))
    expected_keys, expected_ids = keys[order], ids[order]
    backing = np.full(2 * n, 777, np.int64 if kind != "int32_ids" else np.int32)
    if kind == "strided_ids":
        ids_arg = backing[::2]
        ids_arg[:] = ids
    elif kind == "int32_ids":
        ids_arg = backing[:n]
        ids_arg[:] = ids
    else:
        ids_arg = ids.copy()
    keys_backing = np.full(2 * n, 3.0)
    keys_arg = keys_backing[::2] if kind == "strided_keys" else keys_backing[:n]
    keys_arg[:] = keys
    pos = np.full(n, -1, np.int64)
    _heap.full_sort(keys_arg, ids_arg, pos, n, n)
    np.testing.assert_array_equal(keys_arg, expected_keys)
    np.testing.assert_array_equal(ids_arg, expected_ids)
    np.testing.assert_array_equal(pos[ids_arg % n], np.arange(n))
    if kind == "int32_ids":
        assert (backing[n:] == 777).all()
    elif kind == "strided_ids":
        assert (backing[1::2] == 777).all()
    if kind == "strided_keys":
        assert (keys_backing[1::2] == 3.0).all()


@pytest.mark.parametrize("capacity", [1, 3, 8, 1000])
def test_slot_of_an_id_is_its_remainder_inside_and_outside_the_window(capacity):
    for base in (0, capacity, 5 * capacity):
        for i in range(0, base + 3 * capacity + 2):
            assert _heap._slot(i, base, capacity) == i % capacity, (i, base)


@pytest.mark.parametrize("cap", [1, 3, 7, 200])
def test_batched_heap_kernels_leave_the_arrays_a_sift_per_transition_leaves(cap):
    """heap_add and heap_update write the sift's steps out in their loops (for speed, with the slot of an id
    found without a division); a Python loop calling sift for each transition must leave the same keys, ids
    and positions."""
    rng = np.random.default_rng(8 + cap)
    fast = [np.zeros(cap), np.zeros(cap, np.int64), np.full(cap, -1, np.int64), np.zeros(2, np.int64)]
    slow = [a.copy() for a in fast]
    next_id = 0
    for step in range(300):
        if step % 3 == 0:
            # every 10th add is larger than the buffer: only its last `cap` ids reach the heap (as the storage
            # passes them), so the heap holds ids more than `cap` apart while they are replaced
            rows = cap + int(rng.integers(1, 3 * cap + 1)) if step % 30 == 0 else int(rng.integers(1, 30))
            rows += 2**40 if step == 150 else 0  # one jump of the ids far past the window
            new = np.arange(next_id + max(0, rows - cap), next_id + rows, dtype=np.int64)
            next_id += rows
            _heap.heap_add(*fast, new % cap, new, cap)
            keys, ids, pos, state = slow
            for i in new.tolist():
                s = i % cap
                h = pos[s]
                if h < 0:
                    h = state[0]
                    state[0] += 1
                keys[h], ids[h], pos[s] = np.inf, i, h
                _heap.sift(keys, ids, pos, h, state[0], cap)
        else:
            upd = rng.integers(max(0, next_id - cap - 5), next_id, int(rng.integers(1, 40)))
            values = np.round(rng.exponential(1.0, len(upd)), 1) * rng.choice([-1, 1], len(upd))
            assert _heap.heap_update(*fast, upd, values, next_id, cap, False) >= 0
            keys, ids, pos, state = slow
            for i, v in zip(upd.tolist(), values.tolist(), strict=True):
                if i >= next_id - cap:
                    h = pos[i % cap]
                    keys[h] = abs(v)
                    _heap.sift(keys, ids, pos, h, state[0], cap)
                    state[1] += 1
        for a, b in zip(fast, slow, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}")


@pytest.mark.parametrize("limits", ["default", "tiny"])
def test_greedy_matches_a_sorted_list_through_compactions_pending_batches_and_reloads(tmp_path, monkeypatch, limits):
    """Greedy against a dict of the live keys, top k by (key descending, id ascending): a small capacity so
    the heap array fills and compacts often; samples left without an update (pending entries pushed back),
    updates of pending, stale and repeated ids, overwrites of pending transitions, reloads mid-run. "tiny":
    versions of 2 bits (a forced compaction every 3 bumps, versions wrapping all the time) and tags holding
    ids up to 40 above the base (a rebase every ~23 adds)."""
    from perx.samplers import _greedy
    if limits == "tiny":
        monkeypatch.setattr(_greedy, "STAMP_BITS", 2)
        monkeypatch.setattr(_greedy, "ID_SPAN", 40)
    cap = 17
    rng = np.random.default_rng(11)
    buf = perx.ReplayBuffer(cap, perx.Greedy())
    assert buf.sampler._meta[_greedy.VBITS] == (2 if limits == "tiny" else 24)
    live: dict[int, float] = {}
    bases = set()
    compactions = applied = 0
    for step in range(3000):
        op = rng.integers(0, 6)
        if op == 0 or len(live) == 0:
            start = buf.next_index
            rows = int(rng.integers(1, 6))
            buf.extend(x=np.arange(start, start + rows, dtype=float))
            live.update({i: np.inf for i in range(start, start + rows)})
            live = {i: k for i, k in live.items() if i >= buf.next_index - cap}
        elif op in (1, 2):
            ids = rng.integers(max(0, buf.next_index - cap - 3), buf.next_index, int(rng.integers(1, 9)))
            values = np.round(rng.exponential(1.0, len(ids)), 1)  # ties, and ids repeated in a batch
            before = int(buf.sampler._meta[_greedy.HEAP])
            applied += buf.update_priorities(ids, values)
            compactions += int(buf.sampler._meta[_greedy.HEAP]) < before
            for i, v in zip(ids.tolist(), values.tolist(), strict=True):
                if i in live:
                    live[i] = v
        else:
            k = int(rng.integers(1, len(live) + 1))
            expected = sorted(live, key=lambda i: (-live[i], i))[:k]
            got = buf.sample(k).indices
            np.testing.assert_array_equal(got, expected, err_msg=f"step {step}")
            if op == 3:  # the sampled ones get new errors; otherwise they stay pending
                values = np.round(rng.exponential(1.0, k), 1)
                applied += buf.update_priorities(got, values)
                live.update(zip(got.tolist(), values.tolist(), strict=True))
        if step % 250 == 249:
            buf.save(tmp_path / "greedy.npz")
            buf = perx.ReplayBuffer.load(tmp_path / "greedy.npz")
        _greedy.check(*buf.sampler._arrays(), cap)
        np.testing.assert_array_equal(buf.sampler.keys(np.array(sorted(live)) % cap), [live[i] for i in sorted(live)])
        bases.add(int(buf.sampler._meta[_greedy.BASE]))
    assert compactions > 20
    assert len(bases) > (20 if limits == "tiny" else 0)
    assert buf.sampler.state_dict()[1]["state"][1] == applied  # saved as the heap samplers save it


def test_greedy_ranks_a_negative_zero_priority_as_zero_and_keeps_it_as_given(tmp_path):
    # keys are compared as the bits of floats >= +0.0, so a raw -0.0 must enter the heap as +0.0
    buf = perx.ReplayBuffer(6, perx.Greedy())
    buf.extend(x=np.arange(6.0))
    buf.set_priorities(np.arange(6), [0.0, -0.0, 0.0, -0.0, 1.0, -0.0])
    buf.save(tmp_path / "g.npz")
    for b in (buf, perx.ReplayBuffer.load(tmp_path / "g.npz")):
        assert np.signbit(b.sampler.keys(np.arange(6))).tolist() == [False, True, False, True, False, True]
        assert b.sample(6).indices.tolist() == [4, 0, 1, 2, 3, 5]  # equal keys: the older first


@pytest.mark.parametrize("copier", ["deepcopy", "pickle", "save"])
def test_a_copied_greedy_buffer_returns_the_same_batches_from_a_heap_on_a_cache_line(copier, tmp_path):
    import copy
    import pickle

    from perx.samplers import _greedy
    rng = np.random.default_rng(3)
    buf = perx.ReplayBuffer(300, perx.Greedy())
    buf.extend(x=np.arange(450.0))
    buf.update_priorities(np.arange(150, 450), np.round(rng.exponential(1.0, 300), 1))
    buf.sample(40)  # leaves 40 pending entries
    if copier == "save":
        buf.save(tmp_path / "g.npz")
        twin = perx.ReplayBuffer.load(tmp_path / "g.npz")
    else:
        twin = copy.deepcopy(buf) if copier == "deepcopy" else pickle.loads(pickle.dumps(buf))
    assert twin.sampler._heap.ctypes.data % 64 == 0 and twin.sampler._heap.flags.c_contiguous
    for step in range(20):
        got = [b.sample(25).indices for b in (buf, twin)]
        np.testing.assert_array_equal(*got)
        values = np.round(rng.exponential(1.0, 25), 1)
        for b in (buf, twin):
            b.update_priorities(got[0], values)
            b.extend(x=[float(step)])
    _greedy.check(*twin.sampler._arrays(), 300)


def test_greedy_replays_every_new_transition_before_any_twice():
    buf = perx.ReplayBuffer(10, perx.Greedy())
    buf.extend(**transitions(10))
    seen = []
    for _ in range(10):
        b = buf.sample(1)
        seen.append(int(b.indices[0]))
        buf.update_priorities(b.indices, [100.0])  # even a huge error does not beat an unseen one
    assert seen == list(range(10))


def test_greedy_weights_and_probabilities_are_one():
    buf = perx.ReplayBuffer(10, perx.Greedy())
    buf.extend(**transitions(10))
    b = buf.sample(4, beta=1.0)
    assert b.weights.tolist() == [1.0] * 4 and b.probabilities.tolist() == [1.0] * 4
    assert buf.probabilities(batch_size=4).sum() == 4


def test_greedy_refuses_a_batch_larger_than_the_buffer():
    buf = perx.ReplayBuffer(10, perx.Greedy())
    buf.extend(**transitions(3))
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(4)


def test_greedy_is_found_where_it_lived_before_it_had_a_module_of_its_own():
    """perx.samplers.greedy since issue 38; imports from perx.samplers.rank and pickles that name it there work."""
    import pickle

    from perx.samplers import greedy, rank

    assert rank.Greedy is greedy.Greedy is perx.Greedy is perx.samplers.Greedy
    buf = perx.ReplayBuffer(10, perx.Greedy(), seed=0)
    buf.extend(**transitions(10))
    old = pickle.dumps(buf, protocol=0).replace(b"perx.samplers.greedy\n", b"perx.samplers.rank\n")
    assert b"perx.samplers.rank\nGreedy" in old and b"perx.samplers.greedy" not in old
    np.testing.assert_array_equal(pickle.loads(old).sample(4).indices, buf.sample(4).indices)


def test_fixed_segments_with_single_draws_follow_the_segment_probabilities():
    """segments=k, batch 1: a segment is picked at random, then a position uniformly inside it."""
    n, k, draws = 200, 8, 40_000
    buf, _ = rank_buffer(n, exact=True, seed=5)
    buf.sampler.n_segments = k
    counts = np.zeros(n)
    for _ in range(draws):
        np.add.at(counts, buf.sampler.ranks(buf.sample(1).indices % n), 1)
    expected = segment_probabilities(*rank_segments(n, k, 0.7), np.arange(n)) * draws
    stat = ((counts - expected) ** 2 / expected).sum()
    assert stats.chi2.sf(stat, df=n - 1) > P_MIN
    # and not uniform: a batch of one with k = batch size would have been
    assert stats.chi2.sf(((counts - draws / n) ** 2 / (draws / n)).sum(), df=n - 1) < 1e-12


@pytest.mark.parametrize("make", [lambda: perx.RankBased(alpha=0.7), lambda: perx.RankBased(alpha=0.7, exact=True),
                                  lambda: perx.Greedy()])
def test_single_adds_leave_the_heap_as_one_row_extends_leave_it(make):
    # add() takes the scalar kernel (heap_add_one), extend() of one row the batched heap_add
    rng = np.random.default_rng(5)
    one, batched = (perx.ReplayBuffer(23, make(), seed=0) for _ in range(2))
    for step in range(200):
        assert one.add(x=float(step)).tolist() == batched.extend(x=[float(step)]).tolist()
        if step % 5 == 2:
            ids = rng.integers(max(0, step - 22), step + 1, 4)
            values = rng.choice([0.0, 0.5, 3.0, float(step)], 4)
            for buf in (one, batched):
                buf.update_priorities(ids, values)
        names = (("_heap", "_cur", "_key", "_meta") if isinstance(one.sampler, perx.Greedy)
                 else ("_keys", "_ids", "_pos", "_state"))
        for name in names:
            np.testing.assert_array_equal(getattr(one.sampler, name), getattr(batched.sampler, name),
                                          err_msg=name, strict=True)
        k = min(3, len(one))
        np.testing.assert_array_equal(one.sample(k).indices, batched.sample(k).indices)


def test_exact_rank_based_samples_in_two_steps_and_refuses_to_refill():
    # only the heap mode draws and gathers in one call; exact mode's positions need its sorted list
    assert perx.RankBased().fuses_gather and not perx.RankBased(exact=True).fuses_gather
    buf = perx.ReplayBuffer(100, perx.RankBased(exact=True), seed=0)
    buf.extend(x=np.arange(100.0))
    batch = buf.sample(32)
    with pytest.raises(ValueError, match="out"):
        buf.sample(32, out=batch)


def test_asking_for_probabilities_does_not_change_what_later_samples_draw():
    """probabilities(batch_size=k) at a size the segment cache does not cover used to cache the boundaries it
    computed there, so a later sample stretched those instead of the ones sampling had cached (found by an
    independent review); a query now leaves the cache as it was."""

    def made():
        buf = perx.ReplayBuffer(5000, perx.RankBased(alpha=0.7), seed=0)
        buf.extend(**transitions(2100))
        buf.sample(16)
        return buf

    asked, twin = made(), made()
    for buf in (asked, twin):
        buf.extend(**transitions(25))  # 2125: more than the stretch allows over 2100
    reported = asked.probabilities(batch_size=16)
    for buf in (asked, twin):
        buf.extend(**transitions(15))  # 2140
    a, b = asked.sample(16), twin.sample(16)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.probabilities, b.probabilities)
    twin_reported = made()
    twin_reported.extend(**transitions(25))
    twin_reported.sample(16)  # sampling at 2125 caches these boundaries; the query reported the same
    np.testing.assert_array_equal(reported, twin_reported.probabilities(batch_size=16))
