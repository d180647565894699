"""Proportional PER specifics: priority function, max priority for new items, duplicates, arguments."""

import numpy as np
import pytest

import perx
from tests.conftest import assert_same, filled, snapshot, transitions


def one(k=0):
    return {key: v[0] for key, v in transitions(1, start=k).items()}


def test_first_transitions_get_priority_one():
    """000 Alg. 1 line 2: p_1 = 1 before any priority has been seen."""
    buf = perx.ReplayBuffer(8, perx.Proportional(alpha=0.6))
    buf.extend(**transitions(3))
    assert buf.sampler.priorities(np.arange(3)).tolist() == [1.0, 1.0, 1.0]
    assert buf.sampler.masses[:3].tolist() == [1.0, 1.0, 1.0]


def test_new_transition_gets_max_priority_with_alpha_applied_once():
    """Regression guard for the double-alpha bug (pytorch/rl#2211, #3925): leaf = max_priority ** alpha."""
    alpha, eps = 0.6, 1e-6
    buf = perx.ReplayBuffer(8, perx.Proportional(alpha=alpha, eps=eps))
    buf.extend(**transitions(3))
    buf.update_priorities([0, 1, 2], [-3.0, 0.5, 2.0])  # the sign does not matter: |delta|
    idx = buf.add(**one(3))
    slot = int(idx[0]) % 8
    assert buf.sampler.max_priority == 3.0 + eps
    assert buf.sampler.priorities(np.array([slot]))[0] == 3.0 + eps
    assert buf.sampler.masses[slot] == (3.0 + eps) ** alpha
    assert buf.sampler.mass_totals(len(buf))[1] == buf.sampler.masses[:4].min()  # the IS weights' reference


def test_priority_is_absolute_td_error_plus_eps():
    buf = filled(perx.Proportional(alpha=0.6, eps=0.25), capacity=4)
    buf.update_priorities([0, 1, 2, 3], [-2.0, 2.0, 0.0, -0.5])
    assert buf.sampler.priorities(np.arange(4)).tolist() == [2.25, 2.25, 0.25, 0.75]
    np.testing.assert_array_equal(buf.sampler.priority([-2.0, 0.0]), [2.25, 0.25])


def test_historical_max_never_decreases():
    buf = filled(perx.Proportional(eps=0.0), capacity=4)
    buf.update_priorities([0, 1, 2, 3], [5.0, 1.0, 1.0, 1.0])
    buf.update_priorities([0], [0.1])  # the 5 is gone from the buffer but not from history
    idx = buf.add(**one(4))  # overwrites slot 0
    assert buf.sampler.priorities(idx % 4)[0] == 5.0


def test_buffer_max_follows_the_stored_priorities():
    buf = filled(perx.Proportional(eps=0.0, max_priority="buffer"), capacity=4)
    buf.update_priorities([0, 1, 2, 3], [5.0, 1.0, 2.0, 1.0])
    buf.update_priorities([0], [0.1])
    assert buf.sampler.max_priority == 2.0
    idx = buf.add(**one(4))  # overwrites slot 0 (priority 0.1): the max of the rest is 2
    assert buf.sampler.priorities(idx % 4)[0] == 2.0
    buf.update_priorities([2, 4], [0.3, 0.2])
    idx = buf.add(**one(5))  # overwrites slot 1 (priority 1): remaining are 0.2, 0.3, 1.0... slot 3
    assert buf.sampler.priorities(idx % 4)[0] == 1.0


def test_buffer_max_excludes_the_transition_being_overwritten():
    buf = filled(perx.Proportional(eps=0.0, max_priority="buffer"), capacity=2)
    buf.update_priorities([0, 1], [9.0, 1.0])
    idx = buf.add(**one(2))  # evicts id 0, the only transition with 9
    assert buf.sampler.priorities(idx % 2)[0] == 1.0


def test_duplicate_indices_in_one_update_last_wins():
    """Documented rule: updates apply in order, so the last duplicate wins; each one is counted."""
    buf = filled(perx.Proportional(alpha=1.0, eps=0.0), capacity=5)
    applied = buf.update_priorities([1, 2, 1, 1], [4.0, 2.0, 7.0, 3.0])
    assert applied == 4
    assert buf.sampler.priorities(np.array([1, 2])).tolist() == [3.0, 2.0]
    assert buf.sampler.max_priority == 7.0  # every applied value counts toward the historical max
    s = buf.sampler
    for now, rebuilt in zip((s._mass, s._heap), s._rebuilt(len(buf)), strict=True):
        np.testing.assert_array_equal(now, rebuilt)


def test_alpha_zero_is_uniform_replay():
    buf = filled(perx.Proportional(alpha=0.0), capacity=10)
    buf.update_priorities(np.arange(10), np.arange(10.0) * 100)
    np.testing.assert_allclose(buf.probabilities(), np.full(10, 0.1), rtol=1e-15)


def test_zero_priority_transitions_are_never_sampled():
    buf = filled(perx.Proportional(alpha=0.6, eps=0.0), capacity=10)
    buf.set_priorities(np.arange(10), [0, 0, 1, 0, 0, 2, 0, 0, 0, 0])
    for _ in range(100):
        assert set(buf.sample(16).indices % 10) <= {2, 5}
    # weights stay finite: the buffer-wide maximum weight is over transitions that can be drawn
    assert np.isfinite(buf.sample(16, beta=1.0).weights).all()


def test_all_zero_priorities_cannot_be_sampled():
    buf = filled(perx.Proportional(eps=0.0), capacity=4)
    buf.set_priorities(np.arange(4), np.zeros(4))
    with pytest.raises(ValueError, match="priority 0"):
        buf.sample(2)


def test_refused_sample_with_numbers_drawn_ahead_hands_none_out():
    """With a block of random numbers already drawn, the no-mass check is the compiled call's: a refused
    sample (plain or ``out=``) must leave the generator where a buffer that never tried it is."""
    bufs = [filled(perx.Proportional(eps=0.0), capacity=8, seed=5) for _ in range(2)]
    batches = [buf.sample(2) for buf in bufs]
    for buf, batch in zip(bufs, batches, strict=True):
        buf.sample(2, out=batch)  # a batch refilled once takes the shortest path of sample(out=)
        buf.set_priorities(np.arange(8), np.zeros(8))
    tried = bufs[0]
    assert tried.sampler._pool is not None  # the path under test: numbers drawn ahead, none left unused
    for kwargs in ({}, {"out": batches[0]}):
        with pytest.raises(ValueError, match="priority 0"):
            tried.sample(2, **kwargs)
    for buf in bufs:
        buf.set_priorities(np.arange(8), np.arange(1.0, 9.0))
    np.testing.assert_array_equal(bufs[0].sample(64).indices, bufs[1].sample(64).indices)
    assert_same(snapshot(bufs[0]), snapshot(bufs[1]))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"alpha": -0.1}, ValueError, "alpha"),
        ({"alpha": float("nan")}, ValueError, "alpha"),
        ({"alpha": "0.6"}, TypeError, "alpha"),
        ({"eps": -1e-6}, ValueError, "eps"),
        ({"normalize": "max"}, ValueError, "normalize"),
        ({"max_priority": "all"}, ValueError, "max_priority"),
        ({"stratified": 1}, TypeError, "stratified"),
    ],
)
def test_bad_constructor_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        perx.Proportional(**kwargs)


@pytest.mark.parametrize("capacity", [0, -5])
def test_non_positive_capacity_is_refused(capacity):
    with pytest.raises(ValueError, match="capacity"):
        perx.ReplayBuffer(capacity, perx.Proportional())


def test_bad_capacity_type_is_refused():
    with pytest.raises(TypeError, match="capacity"):
        perx.ReplayBuffer(10.0)
    with pytest.raises(TypeError, match="sampler"):
        perx.ReplayBuffer(10, "proportional")


def test_updates_with_float32_and_lists_are_accepted():
    buf = filled(perx.Proportional(eps=0.0), capacity=4)
    assert buf.update_priorities(np.array([0, 1], np.int32), np.array([1.5, 2.5], np.float32)) == 2
    assert buf.update_priorities([2], [3]) == 1
    assert buf.update_priorities(3, 0.5) == 1
    assert buf.sampler.priorities(np.arange(4)).tolist() == [1.5, 2.5, 3.0, 0.5]


def test_refused_update_leaves_the_max_priority_alone():
    buf = filled(perx.Proportional(), capacity=4)
    before = snapshot(buf)
    with pytest.raises(ValueError):
        buf.update_priorities([0, 1], [100.0, np.nan])
    assert_same(before, snapshot(buf))
    assert buf.sampler.max_priority == 1.0


@pytest.mark.parametrize("kwargs", [{}, {"alpha": 0.0}, {"max_priority": "buffer"}, {"alpha": 1.0, "eps": 0.0}])
def test_single_adds_leave_every_tree_bit_identical_to_one_row_extends(kwargs):
    # add() takes the scalar kernel (_add_one, propagate_one); extend() of one row the batched one
    rng = np.random.default_rng(3)
    one, batched = (perx.ReplayBuffer(37, perx.Proportional(**kwargs), seed=0) for _ in range(2))
    for step in range(300):
        assert one.add(x=float(step)).tolist() == batched.extend(x=[float(step)]).tolist()
        if step % 7 == 3:  # new maxima, zero priorities (the min tree's empty leaves) and ordinary ones
            ids = rng.integers(max(0, step - 36), step + 1, 5)
            values = rng.choice([0.0, 0.3, 2.5, 40.0 + step], 5)
            for buf in (one, batched):
                buf.set_priorities(ids, values)
        a, b = one.sampler, batched.sampler
        for name in ("_heap", "_mass", "_priority", "_state"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name, strict=True)
        np.testing.assert_array_equal(a.max_tree.nodes, b.max_tree.nodes)


class _Recorder:
    """A picklable on_add wrapper: records the ids of each call, then calls the sampler's own."""

    def __init__(self, inner):
        self.inner = inner
        self.seen = []

    def __call__(self, slots, ids):
        self.seen.append(ids.tolist())
        self.inner(slots, ids)


@pytest.mark.parametrize("make", [lambda: perx.Proportional(), lambda: perx.Proportional(max_priority="buffer"),
                                  lambda: perx.Uniform(), lambda: perx.RankBased()])
def test_an_on_add_set_on_the_instance_sees_adds_and_extends_after_a_pickle_round_trip(make):
    import pickle

    buf = perx.ReplayBuffer(8, make(), spec={"x": ((), np.float32)}, seed=0)
    buf.sampler.on_add = _Recorder(buf.sampler.on_add)
    twin = pickle.loads(pickle.dumps(buf))
    twin.add(x=1.0)
    twin.extend(x=np.array([2.0, 3.0], np.float32))
    twin.extend(x=[4.0])
    assert twin.sampler.on_add.seen == [[0], [1, 2], [3]]
    assert buf.sampler.on_add.seen == []


def test_a_redefined_on_add_sees_single_adds_and_extends_whether_set_on_the_class_or_on_the_instance():
    seen = []

    class Logged(perx.Proportional):
        def on_add(self, slots, ids):
            seen.append(ids.tolist())
            super().on_add(slots, ids)

    buf = perx.ReplayBuffer(8, Logged(), seed=0)
    buf.add(x=1.0)
    buf.extend(x=[2.0, 3.0])
    buf.extend(x=np.array([4.0, 5.0]))  # exact arrays: extend's shortest path
    plain = perx.ReplayBuffer(8, perx.Uniform(), seed=0)
    plain.sampler.on_add = lambda slots, ids: seen.append((-ids).tolist())
    plain.add(x=1.0)
    plain.extend(x=np.array([2.0, 3.0]))
    assert seen == [[0], [1, 2], [3, 4], [0], [-1, -2]]
    assert perx.Proportional.on_add_one is not Logged.on_add_one
    assert perx.Proportional.on_add_range is not Logged.on_add_range
