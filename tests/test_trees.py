"""Sum, min and max trees: hand-drawn tiny trees, an oracle, drift, and the never-a-bad-slot rule."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perx import MaxTree, MinTree, SumTree


def oracle_find(leaves, targets):
    """searchsorted over the exact prefix sums; past the total -> the last positive leaf."""
    cum = np.cumsum(leaves)
    out = np.searchsorted(cum, targets, side="right")
    last_positive = np.flatnonzero(leaves > 0)[-1]
    return np.minimum(out, last_positive)


# Capacity 1:        [2.0]      (the root is the only leaf)
def test_capacity_one_tree_returns_its_only_slot():
    tree = SumTree(1)
    tree.set([0], [2.0])
    assert tree.total == 2.0
    assert tree.find([0.0, 1.0, 1.999, 2.0, 5.0]).tolist() == [0, 0, 0, 0, 0]


# Capacity 3 (padded to 4 leaves):
#            [6]
#       [3]       [3]
#    [1]   [2]  [3]  [pad 0]
def test_capacity_three_boundaries_and_padding():
    tree = SumTree(3)
    tree.set([0, 1, 2], [1.0, 2.0, 3.0])
    assert tree.total == 6.0
    targets = [0.0, 0.999, 1.0, 2.999, 3.0, 5.999, 6.0, 100.0]
    # A target equal to a prefix boundary goes right; at or past the total the last real slot wins,
    # never the padding leaf 3.
    assert tree.find(targets).tolist() == [0, 0, 1, 1, 2, 2, 2, 2]


# Capacity 4:
#             [2.5]
#        [1.5]     [1.0]
#     [0.5] [1.0] [0.5] [0.5]
def test_capacity_four_hand_drawn():
    tree = SumTree(4)
    tree.set([0, 1, 2, 3], [0.5, 1.0, 0.5, 0.5])
    assert tree.nodes[1:4].tolist() == [2.5, 1.5, 1.0]
    assert tree.find([0.0, 0.5, 1.49, 1.5, 2.0, 2.49, 2.5]).tolist() == [0, 1, 1, 2, 3, 3, 3]


# Capacity 5 (padded to 8 leaves), slot 1 has zero mass:
#                       [4]
#             [3]                  [1]
#       [1]        [2]        [1]       [0]
#    [1]  [0]   [1]   [1]   [1] [0]   [0] [0]
def test_capacity_five_skips_zero_mass_at_exact_ties():
    tree = SumTree(5)
    tree.set([0, 1, 2, 3, 4], [1.0, 0.0, 1.0, 1.0, 1.0])
    assert tree.total == 4.0
    # t = 1.0 is exactly where slot 0 ends: slot 1 (zero mass) must be skipped for slot 2.
    assert tree.find([0.0, 1.0, 2.0, 3.0, 3.5, 4.0]).tolist() == [0, 2, 3, 4, 4, 4]


def test_zero_mass_first_leaf_is_not_returned_for_target_zero():
    tree = SumTree(4)
    tree.set([0, 1, 2, 3], [0.0, 0.0, 2.0, 0.0])
    assert tree.find([0.0, 1.0, 2.0, 3.0]).tolist() == [2, 2, 2, 2]


def test_write_head_empty_slots_are_never_returned():
    """Only written slots have mass; the rest of a partly filled tree is never returned."""
    tree = SumTree(1000)
    tree.set(np.arange(7), np.full(7, 0.1))
    targets = np.linspace(0, tree.total * 1.5, 10_001)
    assert tree.find(targets).max() == 6


def test_target_pushed_to_total_by_rounding_stays_in_range():
    rng = np.random.default_rng(0)
    for capacity in (3, 5, 6, 7, 100, 1023, 1025):
        tree = SumTree(capacity)
        leaves = rng.random(capacity) * 10 ** rng.uniform(-8, 8, capacity)
        tree.set(np.arange(capacity), leaves)
        total = tree.total
        targets = np.array([total, np.nextafter(total, 0), total * (1 + 1e-15), 0.0])
        slots = tree.find(targets)
        assert ((slots >= 0) & (slots < capacity)).all()
        assert (leaves[slots] > 0).all()


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 40),
    writes=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 16)), min_size=1, max_size=80),
    fractions=st.lists(st.floats(0, 1), min_size=1, max_size=20),
)
def test_find_matches_cumsum_searchsorted_oracle(capacity, writes, fractions):
    """Dyadic leaf values keep every sum exact, so the tree must agree with the oracle exactly."""
    tree = SumTree(capacity)
    leaves = np.zeros(capacity)
    for slot, value in writes:
        slot %= capacity
        tree.set([slot], [value / 8])
        leaves[slot] = value / 8
    assert np.array_equal(tree.leaves, leaves)
    assert tree.total == leaves.sum()
    if leaves.sum() == 0:
        with pytest.raises(ValueError, match="total"):
            tree.find([0.0])
        return
    targets = np.array(fractions) * leaves.sum()
    assert tree.find(targets).tolist() == oracle_find(leaves, targets).tolist()


@settings(max_examples=100, deadline=None)
@given(
    capacity=st.integers(1, 33),
    batches=st.lists(
        st.lists(st.tuples(st.integers(0, 32), st.floats(0, 1e6, allow_nan=False)), min_size=1, max_size=10),
        min_size=1, max_size=10,
    ),
)
def test_incremental_updates_equal_rebuild(capacity, batches):
    """Every internal node equals op(children) after any batch of sets: identical to a rebuild."""
    trees = [SumTree(capacity), MinTree(capacity), MaxTree(capacity)]
    for batch in batches:
        slots = [s % capacity for s, _ in batch]
        values = [v for _, v in batch]
        for tree in trees:
            tree.set(slots, values)
    for tree in trees:
        before = tree.nodes.copy()
        tree.rebuild()
        assert np.array_equal(before, tree.nodes)


def test_duplicate_slots_in_one_set_last_wins():
    tree = SumTree(4)
    tree.set([1, 2, 1], [5.0, 1.0, 3.0])
    assert tree.get([1]).tolist() == [3.0]
    assert tree.total == 4.0


def test_min_and_max_trees_track_extremes_with_padding():
    for capacity in (1, 3, 5, 8):
        rng = np.random.default_rng(capacity)
        values = rng.random(capacity)
        mn, mx = MinTree(capacity), MaxTree(capacity)
        mn.set(np.arange(capacity), values)
        mx.set(np.arange(capacity), values)
        assert mn.min == values.min()
        assert mx.max == values.max()


@pytest.mark.slow
def test_root_does_not_drift_after_a_million_updates():
    """1e6 random single-leaf updates (in batches of 1000), then root == exact sum within 1e-9."""
    rng = np.random.default_rng(42)
    capacity = 100_003
    tree = SumTree(capacity)
    for _ in range(1000):
        slots = rng.integers(0, capacity, 1000)
        values = rng.random(1000) * 10 ** rng.uniform(-6, 6, 1000)
        tree.set(slots, values)
    exact = math.fsum(tree.leaves)
    assert abs(tree.total - exact) <= 1e-9 * exact
    before = tree.nodes.copy()
    tree.rebuild()
    assert np.array_equal(before, tree.nodes)


def test_root_does_not_drift_fast_version():
    rng = np.random.default_rng(7)
    capacity = 1001
    tree = SumTree(capacity)
    for _ in range(200):
        tree.set(rng.integers(0, capacity, 500), rng.random(500) * 10 ** rng.uniform(-6, 6, 500))
    exact = math.fsum(tree.leaves)
    assert abs(tree.total - exact) <= 1e-9 * exact


@pytest.mark.parametrize("capacity", [0, -1])
def test_non_positive_capacity_is_refused(capacity):
    with pytest.raises(ValueError, match="capacity"):
        SumTree(capacity)


def test_bad_values_are_refused_and_nothing_changes():
    tree = SumTree(4)
    tree.set([0, 1], [1.0, 2.0])
    before = tree.nodes.copy()
    for values in ([1.0, -1.0], [np.nan, 1.0], [np.inf, 1.0]):
        with pytest.raises(ValueError, match="values"):
            tree.set([2, 3], values)
    with pytest.raises(ValueError, match="slots"):
        tree.set([4], [1.0])
    with pytest.raises(ValueError, match="values"):
        tree.set([0, 1], [1.0])
    with pytest.raises(TypeError, match="slots"):
        tree.set([0.5], [1.0])
    assert np.array_equal(before, tree.nodes)
    with pytest.raises(ValueError, match="targets"):
        tree.find([-1.0])
