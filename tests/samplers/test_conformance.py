"""The contract every sampler keeps inside a ReplayBuffer (run against each entry of conftest.SAMPLERS), on
storage in RAM and on memmap storage (files on disk, ``ReplayBuffer(memmap=...)``)."""

import itertools

import numpy as np
import pytest

import perx
from tests.conftest import DETERMINISTIC, SAMPLERS, assert_same, filled, snapshot, transitions


@pytest.fixture(autouse=True, params=["ram", "memmap"])
def storage(request, tmp_path, monkeypatch):
    """With "memmap", every buffer these tests build (``ReplayBuffer.load``'s too) keeps its fields in a new
    folder of files under tmp_path."""
    if request.param == "memmap":
        folders = itertools.count()
        build = perx.ReplayBuffer.__init__

        def on_disk(self, *args, memmap=None, **kwargs):
            build(self, *args, memmap=tmp_path / f"memmap-{next(folders)}" if memmap is None else memmap, **kwargs)

        monkeypatch.setattr(perx.ReplayBuffer, "__init__", on_disk)
        yield request.param
        monkeypatch.undo()
    else:
        yield request.param


def test_sampling_an_empty_buffer_is_refused(make_sampler):
    buf = perx.ReplayBuffer(10, make_sampler())
    with pytest.raises(ValueError, match="empty"):
        buf.sample(4)


@pytest.mark.parametrize("batch_size", [0, -3])
def test_non_positive_batch_size_is_refused(make_sampler, batch_size):
    buf = filled(make_sampler())
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(batch_size)


@pytest.mark.parametrize("batch_size", [2.5, True, "8", None])
def test_non_integer_batch_size_is_refused(make_sampler, batch_size):
    buf = filled(make_sampler())
    with pytest.raises(TypeError, match="batch_size"):
        buf.sample(batch_size)


@pytest.mark.parametrize("beta", [-0.1, 1.5, float("nan"), float("inf")])
def test_beta_outside_unit_interval_is_refused(make_sampler, beta):
    buf = filled(make_sampler())
    before = snapshot(buf)
    with pytest.raises(ValueError, match="beta"):
        buf.sample(4, beta=beta)
    assert_same(before, snapshot(buf))


def test_batch_has_every_field_with_shapes_dtypes_and_metadata(make_sampler):
    buf = filled(make_sampler(), capacity=40)
    batch = buf.sample(16, beta=0.5)
    assert set(batch) == {"obs", "action", "reward", "next_obs", "terminated", "truncated"}
    assert batch["obs"].shape == (16, 3) and batch["obs"].dtype == np.float32
    assert batch["action"].dtype == np.int64 and batch["terminated"].dtype == np.bool_
    assert batch.indices.dtype == np.int64 and batch.indices.shape == (16,)
    assert batch.weights.dtype == np.float64 and batch.weights.shape == (16,)
    assert batch.probabilities.dtype == np.float64 and batch.probabilities.shape == (16,)
    assert ((batch.weights > 0) & (batch.weights <= 1)).all()
    assert len(batch) == 16


def test_returned_rows_belong_to_their_indices(make_sampler):
    buf = filled(make_sampler(), capacity=30, n=75)  # wrapped around twice
    for _ in range(5):
        batch = buf.sample(20)
        np.testing.assert_array_equal(batch["obs"][:, 0], batch.indices.astype(np.float32))
        assert (batch.indices >= 75 - 30).all() and (batch.indices < 75).all()


def test_only_stored_transitions_are_sampled(make_sampler):
    buf = perx.ReplayBuffer(1000, make_sampler(), seed=1)
    buf.extend(**transitions(7))
    batch_size = 7 if isinstance(buf.sampler, DETERMINISTIC) else 64
    for _ in range(50):
        batch = buf.sample(batch_size)
        assert ((batch.indices >= 0) & (batch.indices < 7)).all()


def test_batch_probabilities_are_the_exact_current_probabilities(make_sampler):
    buf = filled(make_sampler(), capacity=50)
    rng = np.random.default_rng(0)
    batch = buf.sample(32)
    buf.update_priorities(batch.indices, rng.standard_normal(32))
    batch = buf.sample(32)
    all_p = buf.probabilities(batch_size=32)
    if not isinstance(buf.sampler, DETERMINISTIC):
        assert abs(all_p.sum() - 1) < 1e-12
        assert abs(buf.probabilities().sum() - 1) < 1e-12
    np.testing.assert_allclose(batch.probabilities, buf.probabilities(batch.indices, batch_size=32),
                               rtol=0, atol=0)
    np.testing.assert_allclose(batch.probabilities, all_p[batch.indices % 50], rtol=0, atol=0)


def test_stale_update_is_skipped_after_wraparound(make_sampler):
    """A twin that never received the stale part of the update must end up identical."""
    bufs = [filled(make_sampler(), capacity=20) for _ in range(2)]
    for buf in bufs:
        buf.update_priorities(np.arange(20), np.linspace(0.1, 2.0, 20))
        buf.extend(**transitions(10, start=20))  # ids 20..29 overwrite slots 0..9: 3 and 5 go stale
    ids = np.array([3, 5, 15, 18])  # as a batch sampled before the extend would return them
    assert bufs[0].update_priorities(ids, np.full(4, 50.0)) == 2
    assert bufs[1].update_priorities(ids[2:], np.full(2, 50.0)) == 2
    assert_same(snapshot(bufs[0]), snapshot(bufs[1]))
    if isinstance(bufs[0].sampler, perx.Proportional):
        new = bufs[0].sampler.priorities(np.array([3, 5]))
        assert (new == new[0]).all() and new[0] != 50.0 + bufs[0].sampler.eps


def test_all_stale_update_applies_nothing(make_sampler):
    buf = filled(make_sampler(), capacity=10)
    ids = np.arange(10)
    buf.extend(**transitions(10, start=10))
    before = snapshot(buf)
    assert buf.update_priorities(ids, np.ones(10)) == 0
    assert_same(before, snapshot(buf))


@pytest.mark.parametrize(
    ("indices", "values", "error", "match"),
    [
        ([0, 1, 2], [1.0, np.nan, 1.0], ValueError, "td_errors.*nan"),
        ([0, 1, 2], [1.0, 2.0, np.inf], ValueError, "td_errors.*inf"),
        ([0, 1, 2], [1.0, 2.0], ValueError, "td_errors.*2 values.*3"),
        ([0, 1, 99], [1.0, 2.0, 3.0], ValueError, "indices: 99.*never issued"),
        ([0, -1], [1.0, 2.0], ValueError, "indices: -1.*never issued"),
        ([0.0, 1.0], [1.0, 2.0], TypeError, "indices.*float"),
        ([[0, 1]], [1.0, 2.0], ValueError, "indices.*1-D"),
        ([0, 1], ["a", "b"], TypeError, "td_errors"),
    ],
)
def test_bad_update_is_refused_and_changes_nothing(make_sampler, indices, values, error, match):
    buf = filled(make_sampler(), capacity=50)
    buf.update_priorities(np.arange(50), np.linspace(0.1, 3, 50))
    before = snapshot(buf)
    with pytest.raises(error, match=match):
        buf.update_priorities(indices, values)
    assert_same(before, snapshot(buf))


@pytest.mark.parametrize("values", [[1.0, -0.5], [np.nan, 1.0], [1.0, -np.inf]])
def test_negative_or_non_finite_priorities_are_refused(make_sampler, values):
    buf = filled(make_sampler(), capacity=10)
    before = snapshot(buf)
    with pytest.raises(ValueError, match="priorities"):
        buf.set_priorities([0, 1], values)
    assert_same(before, snapshot(buf))


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda t: t.pop("reward"), ValueError, "missing \\['reward'\\]"),
        (lambda t: t.update(extra=np.zeros(4)), ValueError, "unexpected \\['extra'\\]"),
        (lambda t: t.update(obs=np.zeros((4, 5), np.float32)), ValueError, "obs: expected shape"),
        (lambda t: t.update(action=np.full(4, 1.5)), TypeError, "action: cannot cast dtype float64"),
        (lambda t: t.update(terminated=np.ones(4, np.int64)), TypeError, "terminated: cannot cast"),
        (lambda t: t.update(reward=np.zeros(3, np.float32)), ValueError, "reward: has 3 rows"),
        (lambda t: t.update(obs=np.float32(1.0)), ValueError, "obs: expected shape"),
    ],
)
def test_failed_extend_adds_nothing(make_sampler, change, error, match):
    buf = filled(make_sampler(), capacity=20, n=25)
    before = snapshot(buf)
    bad = transitions(4, start=25)
    change(bad)
    with pytest.raises(error, match=match):
        buf.extend(**bad)
    assert_same(before, snapshot(buf))


def test_failed_add_adds_nothing(make_sampler):
    buf = filled(make_sampler(), capacity=20)
    before = snapshot(buf)
    row = {k: v[0] for k, v in transitions(1, start=20).items()}
    row["action"] = 2.5
    with pytest.raises(TypeError, match="action"):
        buf.add(**row)
    del row["action"]
    with pytest.raises(ValueError, match="missing"):
        buf.add(**row)
    assert_same(before, snapshot(buf))


def test_add_and_extend_return_ids_usable_for_updates(make_sampler):
    buf = perx.ReplayBuffer(10, make_sampler(), seed=0)
    one = {k: v[0] for k, v in transitions(1).items()}
    ids = buf.add(**one)
    assert ids.dtype == np.int64 and ids.tolist() == [0]
    ids = buf.extend(**transitions(5, start=1))
    assert ids.tolist() == [1, 2, 3, 4, 5]
    assert buf.update_priorities(ids, np.arange(5.0)) == 5
    assert buf.set_priorities(ids[:2], [0.5, 0.25]) == 2


def test_seed_makes_sampling_reproducible(make_sampler):
    a = filled(make_sampler(), seed=3)
    b = filled(make_sampler(), seed=3)
    for _ in range(3):
        ba, bb = a.sample(8, beta=0.3), b.sample(8, beta=0.3)
        np.testing.assert_array_equal(ba.indices, bb.indices)
        np.testing.assert_array_equal(ba.weights, bb.weights)
        a.update_priorities(ba.indices, np.arange(8.0))
        b.update_priorities(bb.indices, np.arange(8.0))


def test_save_load_reproduces_the_next_ten_batches(make_sampler, tmp_path):
    rng = np.random.default_rng(5)
    buf = filled(make_sampler(), capacity=40, n=57, seed=11)
    for _ in range(3):
        batch = buf.sample(16, beta=0.6)
        buf.update_priorities(batch.indices, rng.standard_normal(16))
    path = tmp_path / "buf.npz"
    buf.save(path)
    twin = perx.ReplayBuffer.load(path)
    assert len(twin) == len(buf) and twin.capacity == buf.capacity and twin.next_index == buf.next_index
    assert twin.sampler.config() == buf.sampler.config()
    for _ in range(10):
        a, b = buf.sample(16, beta=0.6), twin.sample(16, beta=0.6)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.weights, b.weights)
        np.testing.assert_array_equal(a.probabilities, b.probabilities)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
        td = rng.standard_normal(16)
        assert buf.update_priorities(a.indices, td) == twin.update_priorities(b.indices, td)
        new = transitions(3, start=buf.next_index)
        np.testing.assert_array_equal(buf.extend(**new), twin.extend(**new))


def test_a_sampler_belongs_to_one_buffer(make_sampler):
    sampler = make_sampler()
    perx.ReplayBuffer(5, sampler)
    with pytest.raises(ValueError, match=r"sampler.*already bound"):
        perx.ReplayBuffer(5, sampler)


def test_zero_td_errors_sample_uniformly(make_sampler):
    if any(n in repr(make_sampler()) for n in ("RankBased", "Greedy")):
        pytest.skip("ranks and top-k do not depend on the magnitude of |delta|, only on its order")
    buf = filled(make_sampler(), capacity=30)
    buf.update_priorities(np.arange(30), np.zeros(30))
    np.testing.assert_allclose(buf.probabilities(), np.full(30, 1 / 30), rtol=1e-12)


def test_distinct_batches_where_the_sampler_supports_them(make_sampler):
    buf = filled(make_sampler(), capacity=30)
    name = buf.sampler.name
    if name in ("Uniform", "Greedy"):
        for _ in range(20):
            batch = buf.sample(30, replace=False)
            assert len(set(batch.indices.tolist())) == 30
        with pytest.raises(ValueError, match="batch_size"):
            buf.sample(31, replace=False)
    else:
        with pytest.raises(ValueError, match="replace"):
            buf.sample(4, replace=False)
    with pytest.raises(TypeError, match="replace"):
        buf.sample(4, replace="no")


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_an_unbound_sampler_copies_and_pickles_and_the_copy_binds(name):
    import copy
    import pickle

    sampler = SAMPLERS[name]()
    for twin in (copy.deepcopy(sampler), pickle.loads(pickle.dumps(sampler))):
        assert twin.capacity is None and twin.config() == sampler.config()
        buf = filled(twin, capacity=8)
        assert len(buf.sample(4).indices) == 4
