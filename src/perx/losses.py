"""Losses on TD errors and their gradients, in numpy (Fujimoto, Meger & Precup 2020, "004").

Every loss is elementwise: it returns an array shaped like ``delta`` (no reduction), and has an
analytic gradient ``*_grad`` with respect to delta (= with respect to Q, since delta = Q - y). The
gradients are what the equivalence results are about: tests/test_losses.py and ``perx theory`` check
the theorems exactly on finite sets of TD errors, and tests/torch check that torch autograd agrees.

Conventions: ``kappa`` is the Huber threshold and LAP's priority floor (004 eq. 29-31); ``lam`` is
lambda = mean_j max(|delta_j|^alpha, kappa^alpha) (eq. 10/31), taken from ``delta`` itself when not
given (a batch estimate, as a practical agent computes it), or passed in (e.g. the buffer's exact
value). A gradient at delta = 0 of a term |delta|^e with e <= 0 is defined as 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perx.validation import check_real

Array = np.ndarray


def _delta(delta) -> Array:
    d = np.asarray(delta, dtype=np.float64)
    if not np.isfinite(d).all():
        raise ValueError(f"delta: TD errors must be finite, got {d!r}")
    return d


def _signed_power(d: Array, e: float) -> Array:
    """sign(d) |d|^e, with 0 where d == 0."""
    a = np.abs(d)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.sign(d) * np.where(a > 0, a, 1.0) ** e
    return np.where(a > 0, out, 0.0)


# -- the basic losses (004 Sec. 3) ----------------------------------------------------------------

def mse(delta) -> Array:
    """0.5 delta^2."""
    d = _delta(delta)
    return 0.5 * d * d


def mse_grad(delta) -> Array:
    return _delta(delta).copy()


def l1(delta) -> Array:
    """|delta|."""
    return np.abs(_delta(delta))


def l1_grad(delta) -> Array:
    return np.sign(_delta(delta))


def huber(delta, kappa: float = 1.0) -> Array:
    """Huber loss (004 eq. 2, eq. 29): 0.5 d^2 if |d| <= kappa, else kappa (|d| - 0.5 kappa)."""
    d = _delta(delta)
    kappa = check_real(kappa, "kappa", low=0.0, low_open=True)
    a = np.abs(d)
    return np.where(a <= kappa, 0.5 * d * d, kappa * (a - 0.5 * kappa))


def huber_grad(delta, kappa: float = 1.0) -> Array:
    d = _delta(delta)
    kappa = check_real(kappa, "kappa", low=0.0, low_open=True)
    return np.where(np.abs(d) <= kappa, d, kappa * np.sign(d))


# -- LAP and PAL (004 Sec. 5.2, App. D) ---------------------------------------------------------------

def lap_priority(delta, alpha: float = 0.4, kappa: float = 1.0) -> Array:
    """LAP's priority max(|delta|^alpha, kappa^alpha) = max(|delta|, kappa)^alpha (004 eq. 9, eq. 30)."""
    d = _delta(delta)
    alpha = check_real(alpha, "alpha", low=0.0)
    kappa = check_real(kappa, "kappa", low=0.0, low_open=True)
    return np.maximum(np.abs(d), kappa) ** alpha


def pal_lambda(delta, alpha: float = 0.4, kappa: float = 1.0) -> float:
    """lambda = mean_j max(|delta_j|^alpha, kappa^alpha) (004 eq. 10, eq. 31)."""
    return float(lap_priority(delta, alpha, kappa).mean())


def pal(delta, alpha: float = 0.4, kappa: float = 1.0, lam: float | None = None) -> Array:
    """Prioritized Approximation Loss (004 eq. 10, generalised eq. 31), elementwise:

    (1/lambda) * { 0.5 kappa^alpha d^2              if |d| <= kappa
                 { kappa |d|^(1+alpha) / (1+alpha)   otherwise

    Uniformly sampled, it has the expected gradient of the Huber loss under LAP sampling
    (Observation 4). ``lam`` defaults to :func:`pal_lambda` of ``delta`` (a batch estimate).
    """
    d = _delta(delta)
    alpha = check_real(alpha, "alpha", low=0.0)
    kappa = check_real(kappa, "kappa", low=0.0, low_open=True)
    lam = pal_lambda(d, alpha, kappa) if lam is None else check_real(lam, "lam", low=0.0, low_open=True)
    a = np.abs(d)
    inner = np.where(a <= kappa, 0.5 * kappa**alpha * d * d, kappa * a ** (1 + alpha) / (1 + alpha))
    return inner / lam


def pal_grad(delta, alpha: float = 0.4, kappa: float = 1.0, lam: float | None = None) -> Array:
    """(1/lambda) * (kappa^alpha d if |d| <= kappa else kappa |d|^alpha sign(d)); lambda held fixed."""
    d = _delta(delta)
    lam = pal_lambda(d, alpha, kappa) if lam is None else check_real(lam, "lam", low=0.0, low_open=True)
    return np.where(np.abs(d) <= kappa, kappa**alpha * d, kappa * _signed_power(d, alpha)) / lam


# -- the uniformly sampled equivalent of PER (004 Theorem 3, Corollary 3) ----------------------------

def per_eta(delta, alpha: float, beta: float) -> float:
    """eta = min_j |delta_j|^(alpha beta) / sum_j |delta_j|^alpha over the buffer ``delta`` (eq. 7)."""
    a = np.abs(_delta(delta))
    if (a == 0).any():
        raise ValueError("delta: PER's equivalent loss needs every |delta| > 0 (eps = 0 in 004 eq. 3)")
    return float(a.min() ** (alpha * beta) / (a**alpha).sum())


def _per_args(delta, alpha, beta, eta, size):
    d = _delta(delta)
    alpha = check_real(alpha, "alpha", low=0.0)
    beta = check_real(beta, "beta", low=0.0, high=1.0)
    if eta is None:
        eta, size = per_eta(d, alpha, beta), d.size
    elif size is None:
        raise ValueError("size: needed with an explicit eta (N, the number of stored transitions)")
    return d, alpha, beta, float(eta), int(size)


def per_equivalent(delta, alpha: float = 0.6, beta: float = 0.4, tau: float = 2.0, *,
                   eta: float | None = None, size: int | None = None) -> Array:
    """L_PER^tau = eta N / (tau + alpha - alpha beta) |delta|^(tau + alpha - alpha beta) (004 eq. 7).

    Uniformly sampled, it has the same expected gradient as (1/tau)|delta|^tau under PER with IS
    weights normalised by the buffer-wide maximum (Theorem 3). ``delta`` is the whole buffer unless
    ``eta`` and ``size`` (N) are given.
    """
    d, alpha, beta, eta, n = _per_args(delta, alpha, beta, eta, size)
    tau = check_real(tau, "tau", low=0.0, low_open=True)
    power = tau + alpha - alpha * beta
    return eta * n / power * np.abs(d) ** power


def per_equivalent_grad(delta, alpha: float = 0.6, beta: float = 0.4, tau: float = 2.0, *,
                        eta: float | None = None, size: int | None = None) -> Array:
    d, alpha, beta, eta, n = _per_args(delta, alpha, beta, eta, size)
    return eta * n * _signed_power(d, tau + alpha - alpha * beta - 1)


def per_equivalent_huber(delta, alpha: float = 0.6, beta: float = 0.4, kappa: float = 1.0, *,
                         eta: float | None = None, size: int | None = None) -> Array:
    """Corollary 3 (004 eq. 8): Theorem 3 applied piecewise to the Huber loss.

    eta N |d|^(2+alpha-alpha beta) / (2+alpha-alpha beta)           if |d| <= kappa
    eta N kappa |d|^(1+alpha-alpha beta) / (1+alpha-alpha beta)     otherwise
    (the paper states kappa = 1, where the factor kappa disappears).
    """
    d, alpha, beta, eta, n = _per_args(delta, alpha, beta, eta, size)
    kappa = check_real(kappa, "kappa", low=0.0, low_open=True)
    a = np.abs(d)
    p2, p1 = 2 + alpha - alpha * beta, 1 + alpha - alpha * beta
    return eta * n * np.where(a <= kappa, a**p2 / p2, kappa * a**p1 / p1)


def per_equivalent_huber_grad(delta, alpha: float = 0.6, beta: float = 0.4, kappa: float = 1.0, *,
                              eta: float | None = None, size: int | None = None) -> Array:
    d, alpha, beta, eta, n = _per_args(delta, alpha, beta, eta, size)
    p = alpha - alpha * beta
    return eta * n * np.where(np.abs(d) <= kappa, _signed_power(d, 1 + p), kappa * _signed_power(d, p))


# -- general converters (004 Theorem 1, Corollaries 1 and 2) -----------------------------------------

@dataclass(frozen=True)
class Loss:
    """An elementwise loss on TD errors with its gradient; ``value`` and ``grad`` map arrays to arrays."""

    name: str
    value: Callable[..., Array]
    grad: Callable[..., Array]


MSE = Loss("MSE", mse, mse_grad)
L1 = Loss("L1", l1, l1_grad)


def huber_loss(kappa: float = 1.0) -> Loss:
    return Loss(f"Huber(kappa={kappa})", lambda d: huber(d, kappa), lambda d: huber_grad(d, kappa))


def power_loss(tau: float) -> Loss:
    """(1/tau) |delta|^tau, the family of 004 Theorem 3."""
    tau = check_real(tau, "tau", low=0.0, low_open=True)
    return Loss(f"|d|^{tau}/{tau}", lambda d: np.abs(_delta(d)) ** tau / tau,
                lambda d: _signed_power(_delta(d), tau - 1))


def uniform_equivalent(loss: Loss, priority: Callable[[Array], Array]) -> Loss:
    """Corollary 1: the uniformly sampled loss L1 = |pr|_x L2 / lambda, lambda = mean pr.

    ``loss`` (L2) is used with transitions sampled with probability pr(i) / sum_j pr(j); the returned
    L1, sampled uniformly, has the same expected gradient (Theorem 1). ``|.|_x`` is a stop-gradient:
    the returned gradient is pr(delta) / lambda * L2'(delta). Both returned functions take the whole
    set of TD errors (the buffer) and an optional ``lam``.
    """

    def scale(d, lam):
        d = _delta(d)
        pr = np.asarray(priority(d), dtype=np.float64)
        if (pr < 0).any() or not np.isfinite(pr).all():
            raise ValueError("priority: must return finite values >= 0")
        return pr / (pr.mean() if lam is None else lam), d

    def value(d, lam=None):
        s, d = scale(d, lam)
        return s * loss.value(d)

    def grad(d, lam=None):
        s, d = scale(d, lam)
        return s * loss.grad(d)

    return Loss(f"uniform equivalent of {loss.name}", value, grad)


def equivalent_priority(target: Loss, sampled: Loss) -> Callable[[Array], Array]:
    """Corollary 2: the priority pr = grad L1 / grad L2 that makes ``sampled`` (L2, scaled by lambda)
    under prioritized sampling match ``target`` (L1) under uniform sampling in expected gradient.

    Where both gradients are 0 the priority is 0 (the transition contributes nothing either way).

    Raises (from the returned function):
        ValueError: the gradients differ in sign, or L2's gradient is 0 where L1's is not.
    """

    def priority(d):
        d = _delta(d)
        g1, g2 = target.grad(d), sampled.grad(d)
        both_zero = (g1 == 0) & (g2 == 0)
        if ((np.sign(g1) != np.sign(g2)) & ~both_zero).any():
            raise ValueError(f"sampled: the gradients of {target.name} and {sampled.name} must have the "
                             "same sign at every TD error (Corollary 2)")
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(both_zero, 0.0, g1 / np.where(g2 == 0, 1.0, g2))

    return priority
