"""The cache-line block tree of perx.Proportional gives bit for bit the full binary tree's nodes and answers."""

import numpy as np
import pytest

from perx import SumTree, _blocktree
from perx.trees import leaf_count


def both(masses):
    """A full SumTree and the block structure over the same leaves."""
    leaves = leaf_count(len(masses))
    full = SumTree(len(masses))
    full.set(np.arange(len(masses)), masses)
    g, nblocks = _blocktree.layout(leaves)
    mass = _blocktree.aligned_zeros(leaves)
    mass[: len(masses)] = masses
    heap = np.zeros((2 * nblocks, 2))
    _blocktree.rebuild(heap, mass, nblocks, g)
    return full, (heap, mass, nblocks, g)


def block_find(block, targets):
    heap, mass, nblocks, g = block
    out = np.empty(len(targets), np.int64)
    _blocktree.find(heap, mass, nblocks, g, np.asarray(targets, np.float64), out)
    return out


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 8, 9, 64, 1000, 4099])
def test_block_heap_equals_the_full_trees_upper_levels_bit_for_bit(capacity):
    rng = np.random.default_rng(capacity)
    masses = rng.random(capacity) ** 3 * 10.0 ** rng.integers(-8, 8, capacity)
    masses[rng.random(capacity) < 0.2] = 0.0
    masses[0] = 0.5  # at least one positive mass
    full, block = both(masses)
    heap, _, nblocks, _ = block
    # the rows the block heap keeps (the blocks, every second level above them, the root) hold the full
    # tree's sums of those nodes
    rows = _blocktree.maintained_rows(nblocks)
    np.testing.assert_array_equal(heap[rows, 0], full.nodes[rows])
    positive = masses[masses > 0]
    assert heap[1, 1] == positive.min()


@pytest.mark.parametrize("nblocks, expected", [(1, [1]), (2, [1, 2, 3]), (4, [1, 4, 5, 6, 7]),
                                               (8, [1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15])])
def test_maintained_rows_are_the_blocks_every_second_level_above_them_and_the_root(nblocks, expected):
    assert _blocktree.maintained_rows(nblocks).tolist() == expected


@pytest.mark.parametrize("capacity", [1, 9, 17, 64, 1000, 4099, 9000])
def test_searches_and_updates_never_read_the_levels_that_are_not_kept(capacity):
    """The rows outside maintained_rows set to NaN before the trees are built and updated, and before
    every search: the same slots as the full tree's search, and the kept rows as a rebuild gives them."""
    rng = np.random.default_rng(capacity)
    masses = rng.random(capacity) * (rng.random(capacity) < 0.9)
    masses[0] = 0.25
    full, (heap, mass, nblocks, g) = both(np.zeros(capacity))
    free = np.setdiff1d(np.arange(2 * nblocks), _blocktree.maintained_rows(nblocks))
    free = free[free > 0]  # row 0 is never a node
    heap[free] = np.nan
    mass[:capacity] = masses
    _blocktree.propagate(heap, mass, nblocks, g, np.arange(capacity), capacity)
    full.set(np.arange(capacity), masses)
    for _ in range(20):
        slots = np.sort(rng.integers(0, capacity, 16))
        values = rng.random(16)
        mass[slots] = values
        full.set(slots, values)
        _blocktree.propagate(heap, mass, nblocks, g, slots, 16)
        s = int(rng.integers(0, capacity))
        mass[s] = full_value = float(rng.random())
        full.set(np.array([s]), np.array([full_value]))
        _blocktree.propagate_one(heap, mass, nblocks, g, s)
        assert np.isnan(heap[free]).all()  # never written either
        targets = rng.random(64) * heap[1, 0]
        np.testing.assert_array_equal(block_find((heap, mass, nblocks, g), targets), full.find(targets))
    again = np.full_like(heap, np.nan)
    _blocktree.rebuild(again, mass, nblocks, g)
    np.testing.assert_array_equal(heap[1:], again[1:])  # NaN where not kept, equal elsewhere


@pytest.mark.parametrize("capacity", [1, 3, 8, 17, 1000, 4099])
def test_block_search_returns_the_full_trees_slot_for_every_target(capacity):
    rng = np.random.default_rng(7 + capacity)
    masses = rng.random(capacity) * 10.0 ** rng.integers(-3, 3, capacity)
    masses[rng.random(capacity) < 0.3] = 0.0
    masses[-1] = 0.0  # a zero leaf at the end: targets past the total must not land on it
    masses[0] = 1.0
    full, block = both(masses)
    cum = np.cumsum(masses)
    total = full.total
    # random targets, every exact prefix boundary (ties go right, past zero leaves), and targets at and
    # past the total, where rounding sends stratified draws
    targets = np.concatenate([rng.random(5000) * total, cum, np.nextafter(cum, 0), [total, total * (1 + 1e-15),
                                                                                   total * 2, 0.0]])
    targets = targets[targets >= 0]
    got = block_find(block, targets)
    np.testing.assert_array_equal(got, full.find(targets))
    assert (masses[got] > 0).all()


def test_block_search_clamps_into_the_left_when_the_right_half_of_a_line_is_empty():
    # one line of 8 leaves: [1, 1, 0, 0, 0, 0, 0, 0]; any target at or past 2 must return slot 1
    masses = np.array([1.0, 1.0, 0, 0, 0, 0, 0, 0])
    full, block = both(masses)
    assert block_find(block, [0.0, 0.99, 1.0, 1.99, 2.0, 3.5]).tolist() == [0, 0, 1, 1, 1, 1]
    assert full.find([0.0, 0.99, 1.0, 1.99, 2.0, 3.5]).tolist() == [0, 0, 1, 1, 1, 1]


def test_masses_start_on_a_cache_line():
    for n in (8, 1000, 1 << 16):
        assert _blocktree.aligned_zeros(n).ctypes.data % 64 == 0
        assert _blocktree.aligned_heap(n).ctypes.data % 64 == 0


# leaves 8 (the root is the only block), 16 (one level above the blocks), 32, 64 (two, three: one step of two
# levels, then one alone), 4096 (nine levels: odd) and 8192 (ten: even)
@pytest.mark.parametrize("capacity", [5, 16, 32, 64, 3000, 4099])
def test_incremental_block_updates_equal_a_rebuild(capacity):
    rng = np.random.default_rng(3 + capacity)
    _, block = both(np.ones(capacity))
    heap, mass, nblocks, g = block
    for _ in range(50):
        slots = rng.integers(0, capacity, 64)
        if rng.random() < 0.5:
            slots.sort()  # sorted slots share ancestors, which the steps merge
        mass[slots] = rng.random(64) * (rng.random(64) < 0.8)
        _blocktree.propagate(heap, mass, nblocks, g, slots, len(slots))
        again = np.zeros_like(heap)
        _blocktree.rebuild(again, mass, nblocks, g)
        np.testing.assert_array_equal(heap, again)


@pytest.mark.parametrize("capacity", [5, 16, 32, 64, 3000, 4099])
def test_single_slot_update_equals_the_batched_update(capacity):
    rng = np.random.default_rng(11 + capacity)
    _, one = both(np.ones(capacity))
    _, batched = both(np.ones(capacity))
    for _ in range(300):
        s = int(rng.integers(0, capacity))
        value = float(rng.random()) * (rng.random() < 0.9)
        one[1][s] = batched[1][s] = value
        _blocktree.propagate_one(*one, s)
        _blocktree.propagate(*batched, np.array([s]), 1)
        np.testing.assert_array_equal(one[0], batched[0])
    again = np.zeros_like(one[0])
    _blocktree.rebuild(again, one[1], one[2], one[3])
    np.testing.assert_array_equal(one[0], again)


@pytest.mark.parametrize("capacity", [1, 5, 16, 32, 64, 3000, 4099])
def test_a_range_update_equals_the_batched_update_of_its_slots(capacity):
    rng = np.random.default_rng(17 + capacity)
    _, ranged = both(np.ones(capacity))
    _, batched = both(np.ones(capacity))
    for step in range(200):
        count = int(rng.integers(1, capacity + 1)) if step % 3 else int(rng.integers(1, min(capacity, 9) + 1))
        first = int(rng.integers(0, capacity - count + 1)) if step % 5 else capacity - count  # the end included
        value = float(rng.random()) * (rng.random() < 0.9)
        ranged[1][first : first + count] = batched[1][first : first + count] = value
        _blocktree.propagate_range(*ranged, first, count)
        _blocktree.propagate(*batched, np.arange(first, first + count), count)
        np.testing.assert_array_equal(ranged[0], batched[0])
    _blocktree.propagate_range(*ranged, 0, 0)  # nothing to do
    np.testing.assert_array_equal(ranged[0], batched[0])
    again = np.zeros_like(ranged[0])
    _blocktree.rebuild(again, ranged[1], ranged[2], ranged[3])
    np.testing.assert_array_equal(ranged[0], again)


def test_raising_the_smallest_mass_raises_the_root_minimum():
    # the minimum path stops early only where a node's minimum is unchanged; here it must reach the root
    masses = np.full(64, 5.0)
    masses[37] = 0.5
    masses[3] = 0.7
    _, block = both(masses)
    heap, mass, nblocks, g = block
    assert heap[1, 1] == 0.5
    mass[[3, 37]] = [2.0, 9.0]
    _blocktree.propagate(heap, mass, nblocks, g, np.array([3, 37]), 2)
    assert heap[1, 1] == 2.0
    mass[37] = 0.0  # a zero mass is an empty leaf: skipped by the minimum
    _blocktree.propagate(heap, mass, nblocks, g, np.array([37]), 1)
    assert heap[1, 1] == 2.0 and heap[1, 0] == 5.0 * 62 + 2.0
