"""The compiled sorted list behind RankBased(exact=True), against a plain sorted Python list."""

import bisect

import numpy as np
import pytest

from perx.samplers import _ordered


def sort_key(k, i):
    return (-k, i)  # ascending (-key, id) = key descending, then id ascending


def check(ordered, model):
    keys, ids = ordered.items()
    assert len(ordered) == len(model)
    assert [sort_key(k, i) for k, i in zip(keys.tolist(), ids.tolist(), strict=True)] == model
    if model:
        positions = np.arange(len(model), dtype=np.int64)
        np.testing.assert_array_equal(ordered.ids_at(positions), [i for _, i in model])
        np.testing.assert_array_equal(ordered.ranks_of(-np.array([k for k, _ in model]),
                                                       np.array([i for _, i in model], np.int64)), positions)


@pytest.mark.parametrize("block", [2, 4, 8, 512])
@pytest.mark.parametrize("seed", range(4))
def test_random_inserts_and_removes_keep_the_exact_order(block, seed):
    """Tiny blocks force splits, emptied blocks and re-packs; ties in key are broken by id."""
    rng = np.random.default_rng(seed)
    capacity = 60
    ordered = _ordered.Ordered(capacity, block=block)
    model = []  # sorted list of (-key, id)
    present = {}
    next_id = 0
    for step in range(1500):
        if present and (len(present) == capacity or rng.random() < 0.45):
            i = int(rng.choice(list(present)))
            k = present.pop(i)
            assert _ordered.remove(*ordered.arrays, k, i)
            model.remove(sort_key(k, i))
        else:
            k = float(rng.choice([np.inf, 0.0, 1.0, 2.5, rng.random()]))  # many ties
            _ordered.insert(*ordered.arrays, k, next_id)
            bisect.insort(model, sort_key(k, next_id))
            present[next_id] = k
            next_id += 1
        if step % 50 == 0 or block == 2:
            check(ordered, model)
    check(ordered, model)


def test_removing_a_pair_that_is_not_there_changes_nothing():
    ordered = _ordered.Ordered(10, block=4)
    for i, k in enumerate([3.0, 1.0, 2.0]):
        _ordered.insert(*ordered.arrays, k, i)
    before = [a.copy() for a in ordered.arrays]
    assert not _ordered.remove(*ordered.arrays, 2.0, 7)  # right key, wrong id
    assert not _ordered.remove(*ordered.arrays, 9.0, 0)
    for a, b in zip(before, ordered.arrays, strict=True):
        np.testing.assert_array_equal(a, b)
    assert ordered.ranks_of(np.array([2.0]), np.array([7])).tolist() == [-1]


def test_build_equals_the_same_pairs_inserted_one_by_one():
    rng = np.random.default_rng(1)
    keys = rng.choice([0.5, 1.0, np.inf], 300)
    ids = rng.permutation(300).astype(np.int64)
    built = _ordered.Ordered(300, block=16)
    built.build(keys, ids)
    one_by_one = _ordered.Ordered(300, block=16)
    for k, i in zip(keys, ids, strict=True):
        _ordered.insert(*one_by_one.arrays, k, i)
    for a, b in zip(built.items(), one_by_one.items(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_repacking_keeps_the_order_and_frees_blocks():
    rng = np.random.default_rng(2)
    ordered = _ordered.Ordered(100, block=8)
    model = []
    for i in range(100):
        k = float(rng.integers(0, 5))
        _ordered.insert(*ordered.arrays, k, i)
        bisect.insort(model, sort_key(k, i))
    for i in range(0, 100, 3):  # thin the blocks out
        k = -model[[j for _, j in model].index(i)][0]
        assert _ordered.remove(*ordered.arrays, k, i)
        model.remove(sort_key(k, i))
    _ordered._repack(*ordered.arrays)
    check(ordered, model)
    assert ordered.meta[0] == -(-len(model) // 4)  # half-full blocks of 8
    for i in range(100, 130):
        _ordered.insert(*ordered.arrays, 2.0, i)
        bisect.insort(model, sort_key(2.0, i))
    check(ordered, model)


def test_every_block_in_use_triggers_a_repack():
    """Adversarial: thin every block to one pair, then fill each until it splits, again and again, until
    no block is free. All keys are equal, so the ids alone set the order and are easy to place."""
    capacity = 40
    ordered = _ordered.Ordered(capacity, block=4)  # 3 * 10 + 4 = 34 blocks
    ids = sorted(int(i) << 20 for i in range(capacity))
    for i in ids:
        _ordered.insert(*ordered.arrays, 0.0, i)
    repacks = 0
    for _ in range(20):
        nb = int(ordered.meta[0])
        firsts = [int(ordered.bids[b, 0]) for b in ordered.order[:nb]]
        for b in ordered.order[:nb].copy():  # keep only the first pair of each block
            for j in ordered.bids[b, 1 : ordered.blen[b]].copy():
                assert _ordered.remove(*ordered.arrays, 0.0, int(j))
                ids.remove(int(j))
        for y in firsts:  # three new pairs right before each first pair: the block splits
            prev = ids[bisect.bisect_left(ids, y) - 1] if ids[0] != y else y - (1 << 40)
            for _ in range(3):
                new = (prev + y) // 2  # strictly between the previous pair and y: lands in y's block
                if len(ids) < capacity and prev < new < y:
                    free_before = int(ordered.meta[1])
                    _ordered.insert(*ordered.arrays, 0.0, new)
                    bisect.insort(ids, new)
                    repacks += int(ordered.meta[1]) > free_before + 1
                    prev = new
        check(ordered, [(-0.0, i) for i in ids])
    assert repacks > 0
