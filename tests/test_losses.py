"""numpy losses of 004: values at hand-computed points, gradients, converters, bad input."""

import numpy as np
import pytest

from perx import losses


def test_huber_matches_eq_29_at_hand_points():
    d = np.array([-3.0, -1.0, -0.5, 0.0, 0.25, 2.0])
    np.testing.assert_allclose(losses.huber(d, 1.0), [2.5, 0.5, 0.125, 0.0, 0.03125, 1.5])
    # kappa = 0.01 (004 App. D, Atari): 0.01 * (|d| - 0.005) above the threshold
    np.testing.assert_allclose(losses.huber([0.005, 2.0], 0.01), [0.0000125, 0.01 * 1.995])
    np.testing.assert_allclose(losses.huber_grad(d, 1.0), [-1.0, -1.0, -0.5, 0.0, 0.25, 1.0])


def test_pal_matches_eq_31_at_hand_points():
    alpha, kappa = 0.5, 0.25
    d = np.array([0.1, -0.25, 1.0, -4.0])
    lam = np.mean(np.maximum(np.abs(d), kappa) ** alpha)  # (0.5 + 0.5 + 1 + 2) / 4 = 1
    assert lam == 1.0
    expected = [0.5 * kappa**alpha * 0.01, 0.5 * kappa**alpha * 0.0625,
                kappa * 1.0 / 1.5, kappa * 4.0**1.5 / 1.5]
    np.testing.assert_allclose(losses.pal(d, alpha, kappa), expected, rtol=1e-15)
    np.testing.assert_allclose(losses.pal(d, alpha, kappa, lam=2.0), np.array(expected) / 2, rtol=1e-15)


def test_pal_with_kappa_one_is_eq_10():
    d = np.array([0.3, -0.9, 1.5, -7.0])
    lam = np.mean(np.maximum(np.abs(d) ** 0.4, 1.0))
    eq10 = np.where(np.abs(d) <= 1, 0.5 * d**2, np.abs(d) ** 1.4 / 1.4) / lam
    np.testing.assert_allclose(losses.pal(d, 0.4, 1.0), eq10, rtol=1e-15)


def test_pal_gradient_is_the_stop_gradient_form_of_corollary_1():
    """PAL = (1/lambda) |pr|_x Huber: its gradient is pr * Huber' / lambda (004 App. A.4)."""
    d = np.linspace(-5, 5, 1001)
    for alpha, kappa in [(0.4, 1.0), (0.6, 0.01), (0.7, 0.5)]:
        converted = losses.uniform_equivalent(losses.huber_loss(kappa),
                                              lambda x, a=alpha, k=kappa: losses.lap_priority(x, a, k))
        np.testing.assert_allclose(losses.pal_grad(d, alpha, kappa), converted.grad(d), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize(("fn", "grad", "kwargs"), [
    (losses.huber, losses.huber_grad, {"kappa": 0.7}),
    (losses.pal, losses.pal_grad, {"alpha": 0.4, "kappa": 1.0, "lam": 1.7}),
    (losses.per_equivalent, losses.per_equivalent_grad, {"alpha": 0.6, "beta": 0.4, "tau": 2.0, "eta": 0.01,
                                                         "size": 100}),
    (losses.per_equivalent_huber, losses.per_equivalent_huber_grad, {"alpha": 0.6, "beta": 0.4, "kappa": 1.0,
                                                                     "eta": 0.01, "size": 100}),
])
def test_analytic_gradients_match_finite_differences(fn, grad, kwargs):
    d = np.array([-3.1, -1.3, -0.4, 0.2, 0.8, 2.7])  # away from the kinks
    h = 1e-6
    numeric = (fn(d + h, **kwargs) - fn(d - h, **kwargs)) / (2 * h)
    np.testing.assert_allclose(grad(d, **kwargs), numeric, rtol=1e-6, atol=1e-8)


def test_per_equivalent_power_exceeds_two_with_mse_and_beta_below_one():
    """004 Sec. 5.1: with MSE (tau = 2) and beta < 1 the equivalent loss has power 2 + a - a b > 2."""
    d = np.array([1.0, 2.0])
    v = losses.per_equivalent(d, 0.6, 0.4, 2.0, eta=1.0, size=1)
    power = np.log(v[1] / v[0]) / np.log(2.0)
    assert power == pytest.approx(2.36)


def test_equivalent_priority_refuses_gradients_of_opposite_sign():
    flipped = losses.Loss("minus MSE", lambda d: -losses.mse(d), lambda d: -losses.mse_grad(d))
    with pytest.raises(ValueError, match="same sign"):
        losses.equivalent_priority(losses.MSE, flipped)(np.array([1.0, -2.0]))
    pr = losses.equivalent_priority(losses.MSE, losses.L1)(np.array([-2.0, 0.0, 3.0]))
    np.testing.assert_array_equal(pr, [2.0, 0.0, 3.0])  # |delta|, and 0 where both gradients vanish


@pytest.mark.parametrize(("call", "match"), [
    (lambda: losses.huber([np.nan]), "delta"),
    (lambda: losses.huber([1.0], kappa=0.0), "kappa"),
    (lambda: losses.pal([1.0], alpha=-1), "alpha"),
    (lambda: losses.pal([1.0], lam=0.0), "lam"),
    (lambda: losses.per_equivalent([0.0, 1.0]), "delta"),
    (lambda: losses.per_equivalent([1.0], eta=0.1), "size"),
    (lambda: losses.per_equivalent([1.0], beta=2.0), "beta"),
])
def test_bad_loss_arguments_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_losses_are_elementwise_and_keep_the_shape():
    d = np.random.default_rng(0).standard_normal((3, 4)) + 0.1
    for f in (losses.mse, losses.l1, losses.huber, losses.pal, losses.per_equivalent):
        assert f(d).shape == (3, 4)
