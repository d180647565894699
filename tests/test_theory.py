"""004's statements hold exactly on fixed sets of TD errors -- and the checks catch wrong variants."""

import numpy as np
import pytest

import perx
from perx import losses
from perx.experiments import theorems as theory


@pytest.mark.parametrize("check", [theory.check_theorem1, theory.check_corollary2, theory.check_theorem2,
                                   theory.check_theorem3, theory.check_corollary3, theory.check_observation4,
                                   theory.check_observations_2_3_exact, theory.check_observations_2_3_numeric])
def test_statement_holds(check):
    result = check()
    assert result.passed, f"{result.statement}: error {result.max_abs_error}"


def test_lap_sampler_probabilities_are_eq_30():
    d = theory.td_errors(scale=0.01, seed=4)
    p = theory.sampler_probabilities(perx.LAP(alpha=0.6, kappa=0.01), d)
    expected = np.maximum(np.abs(d) ** 0.6, 0.01**0.6)
    np.testing.assert_allclose(p, expected / expected.sum(), rtol=1e-12)


def test_observation4_fails_for_ordinary_per_sampling():
    """The identity is specific to LAP's floor: PER's (|d| + eps)^alpha sampling breaks it."""
    d = theory.td_errors(seed=1)
    n = len(d)
    p = theory.sampler_probabilities(perx.Proportional(alpha=0.4, eps=1e-6), d)
    err = np.max(np.abs(p * losses.huber_grad(d, 1.0) - losses.pal_grad(d, 0.4, 1.0) / n))
    assert err > 1e-4


def test_theorem3_fails_without_the_buffer_wide_normalisation():
    """Normalising IS weights by the batch maximum changes eta: the per-transition identity breaks."""
    d = theory.td_errors()
    n = len(d)
    p = theory.sampler_probabilities(perx.Proportional(alpha=0.6, eps=0.0), d)
    half = p[: n // 2]  # as if the maximum came from a batch that missed the least likely transition
    w = perx.importance_weights(p, n, 0.4, normalize="buffer", min_probability=half.min())
    err = np.max(np.abs(p * w * d - losses.per_equivalent_grad(d, 0.6, 0.4, 2.0) / n))
    assert p.min() < half.min() and err > 1e-6


def test_theorem1_fails_when_alpha_is_applied_twice():
    d = theory.td_errors()
    pr = np.abs(d) ** 0.6
    p_twice = pr**0.6 / (pr**0.6).sum()
    uniform = losses.uniform_equivalent(losses.MSE, lambda x: np.abs(x) ** 0.6).grad(d) / len(d)
    assert np.max(np.abs(uniform - p_twice * losses.mse_grad(d))) > 1e-4


def test_l1_prioritisation_has_strictly_less_variance_than_uniform_mse():
    d = theory.td_errors()
    target = losses.MSE
    v_l1 = theory.gradient_variance(target, np.sign, d)
    g = d.copy()
    assert v_l1 < (g**2).mean() - g.mean() ** 2
