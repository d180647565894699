"""Sampling frequencies against the exact P(i) of 000 eq. (1), by chi-square tests.

Threshold: the test fails when the chi-square p-value is below P_MIN = 1e-3, i.e. a correct sampler
would fail for about one random seed in a thousand. The seeds are fixed, so every run is the same.
Stratified sampling draws one item per equal slice of the mass, which makes counts *less* variable
than multinomial: the statistic is then conservative (smaller), so each family also has a power check
that the same counts reject a slightly wrong distribution.
"""

import numpy as np
import pytest
from scipy import stats

import perx
from tests.conftest import transitions

P_MIN = 1e-3


def counts_and_expected(buf, batch_size, batches, beta=0.4):
    size = len(buf)
    counts = np.zeros(size)
    for _ in range(batches):
        batch = buf.sample(batch_size, beta=beta)
        np.add.at(counts, batch.indices % buf.capacity, 1)
    expected = buf.probabilities() * batch_size * batches
    return counts, expected


def chi2_pvalue(counts, expected):
    stat = ((counts - expected) ** 2 / expected).sum()
    return stats.chi2.sf(stat, df=len(counts) - 1)


def make_buffer(sampler, size=60, seed=0):
    buf = perx.ReplayBuffer(size, sampler, seed=seed)
    buf.extend(**transitions(size))
    td = np.random.default_rng(123).standard_normal(size) * np.linspace(0.05, 4, size)
    buf.update_priorities(np.arange(size), td)
    return buf


@pytest.mark.parametrize("stratified", [True, False])
def test_proportional_frequencies_match_eq1(stratified):
    buf = make_buffer(perx.Proportional(alpha=0.6, stratified=stratified))
    counts, expected = counts_and_expected(buf, 32, 2000)
    assert chi2_pvalue(counts, expected) > P_MIN
    # Power: the same counts reject P(i) computed with a wrong alpha (0.5 instead of 0.6).
    prio = buf.sampler.priorities(np.arange(60))
    wrong = prio**0.5 / (prio**0.5).sum() * counts.sum()
    assert chi2_pvalue(counts, wrong) < 1e-12


def test_proportional_probabilities_are_eq1_of_the_priorities():
    buf = make_buffer(perx.Proportional(alpha=0.7, eps=0.01))
    prio = buf.sampler.priorities(np.arange(60))
    td = np.random.default_rng(123).standard_normal(60) * np.linspace(0.05, 4, 60)
    np.testing.assert_allclose(prio, np.abs(td) + 0.01, rtol=0, atol=0)
    np.testing.assert_allclose(buf.probabilities(), prio**0.7 / (prio**0.7).sum(), rtol=1e-12)


@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_uniform_frequencies_are_flat(batch_size):
    buf = make_buffer(perx.Uniform(), size=40)
    counts, expected = counts_and_expected(buf, batch_size, 40_000 // batch_size)
    assert np.allclose(expected, expected[0])
    assert chi2_pvalue(counts, expected) > P_MIN
    tilted = np.linspace(0.9, 1.1, 40)
    assert chi2_pvalue(counts, tilted / tilted.sum() * counts.sum()) < 1e-6


def test_stratified_batch_holds_one_draw_per_mass_slice():
    """000 App. B.2.1: with k = B slices, each slice contributes exactly one transition."""
    buf = make_buffer(perx.Proportional(alpha=1.0), size=8)
    buf.set_priorities(np.arange(8), np.full(8, 1.0))  # 8 equal masses, B = 8 -> a permutation
    for _ in range(20):
        batch = buf.sample(8)
        assert sorted(batch.indices % 8) == list(range(8))


@pytest.mark.slow
def test_proportional_frequencies_million_draws():
    buf = make_buffer(perx.Proportional(alpha=0.6, stratified=False), size=500, seed=9)
    counts, expected = counts_and_expected(buf, 256, 4000)
    assert chi2_pvalue(counts, expected) > P_MIN


def test_sampling_is_correct_for_a_one_slot_buffer():
    buf = perx.ReplayBuffer(1, perx.Proportional(), seed=0)
    buf.extend(**transitions(3))
    batch = buf.sample(5)
    assert batch.indices.tolist() == [2] * 5
    assert batch.probabilities.tolist() == [1.0] * 5
    assert batch.weights.tolist() == [1.0] * 5
