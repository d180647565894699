"""Hybrid minibatches (000 App. A): shares of each batch from different samplers, exact mixture probabilities."""

import copy

import numpy as np
import pytest
from scipy import stats

import perx
from tests.conftest import assert_same, snapshot, transitions


def prioritized(sampler, size=40, seed=0):
    buf = perx.ReplayBuffer(size, sampler, seed=seed)
    buf.extend(**transitions(size))
    td = np.random.default_rng(7).standard_normal(size) * np.linspace(0.05, 5, size)
    buf.update_priorities(np.arange(size), td)
    return buf


def test_shares_are_split_by_largest_remainder():
    h = perx.Hybrid([perx.Proportional(), perx.Uniform(), perx.RankBased()], [0.5, 0.3, 0.2])
    assert h.counts(10).tolist() == [5, 3, 2]
    assert h.counts(7).tolist() == [4, 2, 1]  # 3.5, 2.1, 1.4: the largest remainder (0.5) gets the extra draw
    assert h.counts(1).tolist() == [1, 0, 0]
    assert all(h.counts(b).sum() == b for b in range(1, 200))


def test_batch_probabilities_are_the_exact_mixture():
    buf = prioritized(perx.Hybrid([perx.Proportional(alpha=0.7), perx.Uniform()], [0.75, 0.25]))
    prop = buf.sampler.components[0]
    batch = buf.sample(32, beta=0.5)
    slots = batch.indices % buf.capacity
    expected = 24 / 32 * prop.probabilities(slots, 40) + 8 / 32 * (1 / 40)
    np.testing.assert_allclose(batch.probabilities, expected, rtol=1e-13)
    # closed form of the weights: (N P(i))^-beta over the batch's largest
    w = (40 * expected) ** -0.5
    np.testing.assert_allclose(batch.weights, w / w.max(), rtol=1e-12)
    # the first 24 come from the proportional component, the last 8 from the uniform one
    np.testing.assert_allclose(buf.probabilities(batch.indices, batch_size=32), expected, rtol=1e-13)


def test_draw_frequencies_match_the_mixture_chi_square():
    # Each batch position is a draw from sum_c (k_c / B) P_c(i); over many batches the counts of every
    # transition must match B * P(i) per batch. Fixed seed; fails below p = 1e-3 (a correct sampler fails
    # this one seed's test with probability 1e-3).
    buf = prioritized(perx.Hybrid([perx.Proportional(alpha=0.6), perx.Uniform()], [0.6, 0.4]), seed=3)
    batch_size, batches = 10, 6000
    counts = np.zeros(40)
    for _ in range(batches):
        np.add.at(counts, buf.sample(batch_size).indices % 40, 1)
    expected = buf.probabilities(batch_size=batch_size) * batch_size * batches
    np.testing.assert_allclose(expected.sum(), batch_size * batches)
    stat = ((counts - expected) ** 2 / expected).sum()
    assert stats.chi2.sf(stat, df=39) > 1e-3


def test_rank_component_uses_its_own_batch_share_for_segments():
    buf = prioritized(perx.Hybrid([perx.RankBased(alpha=0.7), perx.Uniform()], [0.5, 0.5]))
    rank = buf.sampler.components[0]
    batch = buf.sample(16)
    slots = batch.indices % 40
    expected = 0.5 * rank.probabilities(slots, 40, 8) + 0.5 / 40
    np.testing.assert_allclose(batch.probabilities, expected, rtol=1e-13)


def test_every_component_gets_each_update():
    buf = prioritized(perx.Hybrid([perx.Proportional(alpha=1.0, eps=0.0), perx.LAP(alpha=1.0, kappa=1.0)],
                                  [0.5, 0.5]))
    buf.update_priorities([3], [0.25])
    prop, lap = buf.sampler.components
    assert prop.priorities(np.array([3]))[0] == 0.25
    assert lap.priorities(np.array([3]))[0] == 1.0  # LAP's floor max(|delta|, kappa)
    assert buf.priorities([3])[0] == 0.25  # the first component that keeps priorities


def test_refused_update_changes_no_component():
    # the first component accepts 1e300 (alpha 1), the second cannot (mass 1e1500): neither may change
    buf = prioritized(perx.Hybrid([perx.Proportional(alpha=1.0), perx.Proportional(alpha=5.0)], [0.5, 0.5]))
    before = snapshot(buf)
    with pytest.raises(ValueError, match="components\\[1\\]"):
        buf.update_priorities([1, 2], [1.0, 1e300])
    assert_same(before, snapshot(buf))


def test_save_load_continues_identically(tmp_path):
    buf = prioritized(perx.Hybrid([perx.RankBased(alpha=0.7), perx.Proportional(alpha=0.6)], [0.3, 0.7]))
    buf.sample(32)
    buf.save(tmp_path / "h.perx")
    twin = perx.ReplayBuffer.load(tmp_path / "h.perx")
    assert repr(twin.sampler) == repr(buf.sampler)
    for _ in range(5):
        a, b = buf.sample(32, beta=0.4), twin.sample(32, beta=0.4)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.weights, b.weights)
        td = np.random.default_rng(len(a)).standard_normal(32)
        buf.update_priorities(a.indices, td)
        twin.update_priorities(b.indices, td)


@pytest.mark.parametrize(("components", "fractions", "match"), [
    ([perx.Uniform()], [1.0], "two or more"),
    ([perx.Uniform(), perx.Greedy()], [0.5, 0.5], "Greedy"),
    ([perx.Uniform(), perx.Uniform()], [0.7, 0.7], "sum to 1"),
    ([perx.Uniform(), perx.Uniform()], [1.0, 0.0], "> 0"),
    ([perx.Uniform(), perx.Uniform()], [1.0], "2 shares"),
    ([perx.Uniform(), "uniform"], [0.5, 0.5], "components\\[1\\]"),
])
def test_bad_configuration_is_refused(components, fractions, match):
    with pytest.raises((ValueError, TypeError), match=match):
        perx.Hybrid(components, fractions)


def test_a_component_cannot_be_shared():
    u = perx.Uniform()
    with pytest.raises(ValueError, match="twice"):
        perx.Hybrid([u, u], [0.5, 0.5])


def test_random_mixing_draws_each_component_with_its_share_even_one_at_a_time():
    # B = 1 with shares would always use the first component; random mixing gives each draw the mixture.
    # Chi-square at a fixed seed against P(i) = 0.3 P_prop(i) + 0.7 / N; fails below p = 1e-3.
    buf = prioritized(perx.Hybrid([perx.Proportional(alpha=1.0), perx.Uniform()], [0.3, 0.7], mixing="random"),
                      seed=11)
    prop = buf.sampler.components[0]
    expected_p = 0.3 * prop.probabilities(np.arange(40), 40) + 0.7 / 40
    np.testing.assert_allclose(buf.probabilities(), expected_p, rtol=1e-13)
    counts = np.zeros(40)
    draws = 40_000
    for _ in range(draws):
        b = buf.sample(1)
        counts[b.indices[0] % 40] += 1
    np.testing.assert_allclose(b.probabilities, expected_p[b.indices % 40], rtol=1e-13)
    stat = ((counts - draws * expected_p) ** 2 / (draws * expected_p)).sum()
    assert stats.chi2.sf(stat, df=39) > 1e-3


def test_random_mixing_needs_fixed_rank_segments():
    with pytest.raises(ValueError, match="segments"):
        perx.Hybrid([perx.RankBased(), perx.Uniform()], [0.5, 0.5], mixing="random")
    perx.Hybrid([perx.RankBased(segments=16), perx.Uniform()], [0.5, 0.5], mixing="random")


def test_probabilities_of_three_components_never_exceed_one():
    # one stored transition has P_c = 1 in every component; the shares must not round the sum above 1
    for mixing, fractions in (("random", [0.7, 0.2, 0.1]), ("shares", [9 / 28, 18 / 28, 1 / 28])):
        buf = perx.ReplayBuffer(8, perx.Hybrid([perx.Uniform(), perx.Proportional(), perx.Uniform()], fractions,
                                               mixing=mixing), seed=0)
        buf.add(x=1.0)
        batch = buf.sample(28, beta=0.5)
        assert (batch.probabilities <= 1.0).all() and (batch.weights == 1.0).all()


def test_weights_of_one_without_importance_sampling():
    buf = prioritized(perx.Hybrid([perx.LAP(alpha=0.4), perx.Uniform()], [0.5, 0.5], importance_sampling=False))
    assert (buf.sample(16, beta=1.0).weights == 1).all()
    buf = prioritized(perx.Hybrid([perx.LAP(alpha=0.4), perx.Uniform()], [0.5, 0.5]))
    assert (buf.sample(16, beta=1.0).weights < 1).any()  # the mixture's weights, whatever LAP's own setting


def test_a_refused_component_state_changes_no_component():
    buf = prioritized(perx.Hybrid([perx.Proportional(alpha=0.6), perx.RankBased(alpha=0.7)], [0.5, 0.5]))
    meta, arrays = buf.sampler.state_dict()
    arrays = {k: v.copy() for k, v in arrays.items()}
    arrays["c0.priority"][:] = 0.5  # a valid state for component 0 ...
    arrays["c1.state"][0] = 99  # ... but not for component 1
    before = snapshot(buf)
    with pytest.raises(ValueError):
        buf.sampler.load_state_dict(meta, arrays, size=len(buf), next_id=buf.next_index)
    assert_same(before, snapshot(buf))


def test_nbytes_counts_every_component():
    h = perx.ReplayBuffer(1000, perx.Hybrid([perx.RankBased(exact=True), perx.Uniform()], [0.5, 0.5])).sampler
    r = perx.ReplayBuffer(1000, perx.RankBased(exact=True)).sampler
    assert h.nbytes == r.nbytes


def test_a_failed_bind_leaves_every_component_unbound():
    # the first component binds, the second cannot allocate its arrays: neither may stay bound, so the same
    # sampler objects bind again to a capacity that fits
    u, p = perx.Uniform(), perx.Proportional()
    h = perx.Hybrid([u, p], [0.5, 0.5])
    with pytest.raises(MemoryError, match="capacity"):
        perx.ReplayBuffer(2**45, h)
    assert h.capacity is None and u.capacity is None and p.capacity is None
    buf = perx.ReplayBuffer(100, h, seed=0)
    buf.extend(**transitions(50))
    assert len(buf.sample(8)) == 8 and u.capacity == p.capacity == 100


def test_a_component_bound_elsewhere_is_named_and_binds_nothing():
    u, p = perx.Uniform(), perx.Proportional()
    h = perx.Hybrid([u, p], [0.5, 0.5])
    perx.ReplayBuffer(10, p)  # bound since the Hybrid was made
    with pytest.raises(ValueError, match=r"components\[1\].*already bound"):
        perx.ReplayBuffer(10, h)
    assert h.capacity is None and u.capacity is None


def _massless_twins(first, mixing):
    def make():
        h = perx.Hybrid([first(), perx.Proportional(alpha=0.6, eps=0.0)], [0.5, 0.5], mixing=mixing)
        buf = perx.ReplayBuffer(30, h, seed=1)
        buf.extend(**transitions(30))
        buf.sample(5)
        buf.set_priorities(np.arange(30), np.zeros(30))  # the Proportional component has no mass left
        return buf
    return make(), make()


@pytest.mark.parametrize(("first", "mixing"), [
    (perx.Uniform, "shares"), (lambda: perx.RankBased(alpha=0.7), "shares"),
    (perx.Uniform, "random"), (lambda: perx.RankBased(alpha=0.7, segments=4), "random"),
])
def test_a_refused_sample_moves_no_generator(first, mixing):
    # The massless component refuses; it must do so before the other component (or the Hybrid's own split of
    # a 'random' batch) draws, so the next batch is the one of a twin that never made the refused call.
    buf, twin = _massless_twins(first, mixing)
    before = snapshot(buf)
    with pytest.raises(ValueError, match="priority 0"):
        buf.sample(8)
    assert_same(before, snapshot(buf))
    for b in (buf, twin):
        b.set_priorities(np.arange(30), np.linspace(0.1, 3, 30))
    for _ in range(3):
        np.testing.assert_array_equal(buf.sample(8).indices, twin.sample(8).indices)


@pytest.mark.parametrize("mixing", ["shares", "random"])
@pytest.mark.parametrize("first", [perx.Uniform, lambda: perx.Proportional(alpha=0.6),
                                   lambda: perx.RankBased(alpha=0.7, segments=4)])
def test_a_component_failing_after_others_drew_moves_no_generator(first, mixing):
    # A failure no check can foresee (here the last component draws, then runs out of memory): every generator
    # is put back where it stood, blocks of numbers drawn ahead included, so the next batches are a twin's.
    buf = perx.ReplayBuffer(40, perx.Hybrid([first(), perx.Uniform(), perx.Uniform()], [0.4, 0.3, 0.3],
                                            mixing=mixing), seed=2)
    buf.extend(**transitions(40))
    buf.sample(7)  # blocks drawn ahead, partly handed out
    twin = copy.deepcopy(buf)
    last = buf.sampler.components[2]

    def fails(batch_size, beta, size, next_id):
        last._rng.random(batch_size)
        raise MemoryError("out of memory")

    last.sample = fails
    before = snapshot(buf)
    with pytest.raises(MemoryError, match="out of memory"):
        buf.sample(9)
    del last.sample
    assert_same(before, snapshot(buf))
    for _ in range(3):
        a, b = buf.sample(9), twin.sample(9)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.weights, b.weights)


@pytest.mark.parametrize("mixing", ["shares", "random"])
@pytest.mark.parametrize(("batch_size", "error"), [(2**55, MemoryError), (2**63, ValueError), (2**70, ValueError)])
def test_a_batch_too_large_to_allocate_is_refused_by_name(batch_size, error, mixing):
    # as numpy refuses it for a single sampler (MemoryError, or ValueError past any array size), but naming
    # batch_size, and before anything is drawn (the 'random' split included)
    buf = prioritized(perx.Hybrid([perx.RankBased(alpha=0.7, segments=8), perx.Uniform()], [0.4, 0.6],
                                  mixing=mixing))
    twin = copy.deepcopy(buf)
    before = snapshot(buf)
    with pytest.raises(error, match=f"batch_size: .*{batch_size}"):
        buf.sample(batch_size)
    assert_same(before, snapshot(buf))
    np.testing.assert_array_equal(buf.sample(8).indices, twin.sample(8).indices)
