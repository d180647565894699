"""The loss/sampling equivalence of Fujimoto, Meger & Precup (2020, "004"), checked exactly.

Every check takes a fixed, finite set of TD errors (the "buffer") and computes expectations as exact
weighted sums, with no sampling. The prioritized side uses perx's own samplers (their probabilities
P(i) and IS weights) and the uniform side uses :mod:`perx.losses`, so a check fails if either the
sampler or the loss deviates from the paper. Each returns a :class:`Check` with the largest absolute
error found; ``perx theory`` prints them and tests/test_theory.py asserts them.

Theorem 1 is checked per transition, which is stronger than equal expectations: for every i,
(1/N) grad L1(delta_i) = P(i) grad L2(delta_i) -- the contribution of transition i to the expected
gradient is the same under both schemes, whatever grad_theta Q(i) is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perx import losses
from perx.buffer import ReplayBuffer
from perx.samplers.proportional import LAP, Proportional
from perx.weights import importance_weights

#: A check passes when its largest absolute error is below this (float64 rounding on O(1) values).
TOLERANCE = 1e-12


@dataclass(frozen=True)
class Check:
    statement: str
    cases: str
    max_abs_error: float
    tolerance: float = TOLERANCE

    @property
    def passed(self) -> bool:
        return bool(self.max_abs_error <= self.tolerance)


def td_errors(n: int = 1000, scale: float = 1.0, seed: int = 0) -> np.ndarray:
    """A fixed set of nonzero TD errors of both signs spanning several orders of magnitude around
    ``scale`` (so Huber and LAP thresholds at ``scale`` are crossed both ways)."""
    rng = np.random.default_rng(seed)
    mags = scale * np.exp(rng.uniform(np.log(1e-3), np.log(1e2), n))
    return np.where(rng.random(n) < 0.5, -mags, mags)


def sampler_probabilities(sampler, delta: np.ndarray) -> np.ndarray:
    """P(i) of a perx sampler holding one transition per TD error, priorities set from ``delta``."""
    n = len(delta)
    buf = ReplayBuffer(n, sampler, spec={"i": ((), np.int64)})
    ids = buf.extend(i=np.arange(n))
    buf.update_priorities(ids, delta)
    return buf.probabilities(ids)


def _max_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


# -- Theorem 1, Corollaries 1 and 2 -------------------------------------------------------------------

PRIORITY_SCHEMES: dict[str, tuple[losses.Loss, Callable[[np.ndarray], np.ndarray]]] = {
    "MSE with pr = |d|^0.6": (losses.MSE, lambda d: np.abs(d) ** 0.6),
    "Huber(1) with pr = max(|d|,1)^0.4": (losses.huber_loss(1.0), lambda d: np.maximum(np.abs(d), 1.0) ** 0.4),
    "L1 with pr = |d|": (losses.L1, np.abs),
    "|d|^1.5/1.5 with pr = |d|^0.5 + 0.1": (losses.power_loss(1.5), lambda d: np.abs(d) ** 0.5 + 0.1),
}


def check_theorem1(delta: np.ndarray | None = None) -> Check:
    """Theorem 1 via Corollary 1: L1 = |pr|_x L2 / lambda uniformly matches L2 sampled by pr."""
    d = td_errors() if delta is None else delta
    n = len(d)
    err = 0.0
    for loss2, pr in PRIORITY_SCHEMES.values():
        p = pr(d) / pr(d).sum()
        uniform = losses.uniform_equivalent(loss2, pr).grad(d) / n
        err = max(err, _max_err(uniform, p * loss2.grad(d)))
    return Check("Theorem 1 / Corollary 1: (1/N) grad L1(d_i) = P(i) grad L2(d_i) for all i",
                 "; ".join(PRIORITY_SCHEMES), err)


def check_corollary2(delta: np.ndarray | None = None) -> Check:
    """Corollary 2: pr = grad L1 / grad L2 makes lambda L2 under pr match L1 under uniform."""
    d = td_errors() if delta is None else delta
    n = len(d)
    pairs = [(losses.MSE, losses.L1), (losses.huber_loss(1.0), losses.L1), (losses.power_loss(3.0), losses.MSE)]
    err = 0.0
    for target, sampled in pairs:
        pr = losses.equivalent_priority(target, sampled)(d)
        lam = pr.mean()
        err = max(err, _max_err(target.grad(d) / n, pr / pr.sum() * lam * sampled.grad(d)))
    return Check("Corollary 2: pr = grad L1 / grad L2; (1/N) grad L1 = P(i) lambda grad L2",
                 "; ".join(f"{t.name} from {s.name}" for t, s in pairs), err)


# -- Theorem 2 and Observation 1 --------------------------------------------------------------------------

def gradient_variance(target: losses.Loss, f: Callable[[np.ndarray], np.ndarray], d: np.ndarray) -> float:
    """Variance of lambda grad L2 when L2 has gradient f and pr = grad L1 / f (Theorem 1 holds)."""
    g1 = target.grad(d)
    g2 = f(d)
    pr = g1 / g2
    p = pr / pr.sum()
    lam = pr.mean()
    return float((p * (lam * g2) ** 2).sum() - g1.mean() ** 2)


def check_theorem2(delta: np.ndarray | None = None) -> Check:
    """Theorem 2: among losses with the same expected gradient, L1 with pr = |grad L1| has the least
    variance, equal to (mean |grad L1|)^2 - (mean grad L1)^2; Observation 1: at most the uniform one."""
    d = td_errors() if delta is None else delta
    family = {f"sign(d)|d|^{q}": (lambda x, q=q: np.sign(x) * np.abs(x) ** q) for q in (0.0, 0.25, 0.5, 1.0, 1.5)}
    err = 0.0
    for target in (losses.MSE, losses.huber_loss(1.0), losses.power_loss(2.5)):
        g1 = target.grad(d)
        variances = {name: gradient_variance(target, f, d) for name, f in family.items()}
        v_l1 = variances["sign(d)|d|^0.0"]
        closed = np.abs(g1).mean() ** 2 - g1.mean() ** 2
        uniform = (g1**2).mean() - g1.mean() ** 2
        err = max(err, abs(v_l1 - closed) / max(1.0, closed))
        # how far any alternative (or uniform sampling) falls *below* the L1 variance: must be none
        err = max(err, max(0.0, v_l1 - min(variances.values())), max(0.0, v_l1 - uniform))
    return Check("Theorem 2 / Obs. 1: L1 with pr = |grad L1| has the least gradient variance",
                 "targets MSE, Huber(1), |d|^2.5/2.5; L2 gradients sign(d)|d|^q, q in {0,.25,.5,1,1.5}; "
                 "uniform", err, tolerance=1e-9)


# -- Theorem 3 and Corollary 3 (PER) ------------------------------------------------------------------------

PER_CASES = ((0.6, 0.4, 2.0), (0.6, 1.0, 2.0), (0.7, 0.5, 1.0), (0.5, 0.0, 1.5), (1.0, 0.4, 2.0))


def _per_side(d: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """P(i) w(i) from perx.Proportional (eps = 0) with IS weights normalised by the buffer maximum."""
    n = len(d)
    p = sampler_probabilities(Proportional(alpha=alpha, eps=0.0), d)
    w = importance_weights(p, n, beta, normalize="buffer", min_probability=p.min())
    return p * w


def check_theorem3(delta: np.ndarray | None = None) -> Check:
    d = td_errors() if delta is None else delta
    n = len(d)
    err = 0.0
    for alpha, beta, tau in PER_CASES:
        per = _per_side(d, alpha, beta) * losses.power_loss(tau).grad(d)
        uniform = losses.per_equivalent_grad(d, alpha, beta, tau) / n
        err = max(err, _max_err(per, uniform))
    return Check("Theorem 3: PER + IS (buffer max) on |d|^tau/tau = uniform L_PER^tau, per transition",
                 "(alpha, beta, tau) in " + ", ".join(map(str, PER_CASES)), err)


def check_corollary3(delta: np.ndarray | None = None) -> Check:
    d = td_errors() if delta is None else delta
    n = len(d)
    err = 0.0
    cases = ((0.6, 0.4, 1.0), (0.7, 1.0, 1.0), (0.5, 0.2, 0.3))
    for alpha, beta, kappa in cases:
        per = _per_side(d, alpha, beta) * losses.huber_grad(d, kappa)
        uniform = losses.per_equivalent_huber_grad(d, alpha, beta, kappa) / n
        err = max(err, _max_err(per, uniform))
    return Check("Corollary 3: PER + IS on Huber = uniform L_PER^Huber, per transition",
                 "(alpha, beta, kappa) in " + ", ".join(map(str, cases)), err)


# -- Observation 4: LAP and PAL ---------------------------------------------------------------------------

LAP_CASES = ((0.4, 1.0), (0.6, 0.01), (0.7, 0.5))


def check_observation4() -> Check:
    err = 0.0
    for alpha, kappa in LAP_CASES:
        d = td_errors(scale=kappa, seed=1)
        n = len(d)
        p = sampler_probabilities(LAP(alpha=alpha, kappa=kappa), d)
        lap = p * losses.huber_grad(d, kappa)
        pal = losses.pal_grad(d, alpha, kappa, lam=losses.pal_lambda(d, alpha, kappa)) / n
        err = max(err, _max_err(lap, pal))
    return Check("Observation 4: LAP sampling + Huber = uniform PAL, per transition (exact lambda)",
                 "(alpha, kappa) in " + ", ".join(map(str, LAP_CASES)), err)


# -- Observations 2 and 3 -----------------------------------------------------------------------------------

def minimise(f: Callable[[float], float], lo: float, hi: float, iters: int = 200) -> float:
    """Golden-section search of a convex function on [lo, hi]."""
    g = (np.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, e = b - g * (b - a), a + g * (b - a)
    fc, fe = f(c), f(e)
    for _ in range(iters):
        if fc <= fe:
            b, e, fe = e, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, e, fe
            e = a + g * (b - a)
            fe = f(e)
    return (a + b) / 2


def _targets() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    # skewed, heavy-tailed targets (mean and median far apart); odd N, so the median is unique
    return [rng.standard_cauchy(n) for n in (5, 101, 1001)]


def check_observations_2_3_exact() -> Check:
    """The expected gradient of MSE vanishes at the mean target, that of L1 at the median."""
    err = 0.0
    for y in _targets():
        scale = max(1.0, float(np.abs(y).max()))
        err = max(err, abs(losses.mse_grad(y.mean() - y).mean()) / scale,
                  abs(losses.l1_grad(np.median(y) - y).mean()))
    return Check("Obs. 2 / 3: E[grad MSE] = 0 at the mean target, E[grad L1] = 0 at the median",
                 "Cauchy targets, N in {5, 101, 1001}", err)


def check_observations_2_3_numeric() -> Check:
    """A numerical minimiser of the mean loss lands on the mean (MSE) and on the median (L1)."""
    err = 0.0
    for y in _targets():
        lo, hi = float(y.min()), float(y.max())
        q_mse = minimise(lambda q, y=y: float(losses.mse(q - y).mean()), lo, hi)
        q_l1 = minimise(lambda q, y=y: float(losses.l1(q - y).mean()), lo, hi)
        scale = max(1.0, float(np.abs(y).max()))
        err = max(err, abs(q_mse - y.mean()) / scale, abs(q_l1 - np.median(y)) / scale)
    # a minimum of a smooth function is located only to about sqrt(machine epsilon) = 1.5e-8
    return Check("Obs. 2 / 3: golden-section argmin of MSE = mean, of L1 = median (relative)",
                 "Cauchy targets, N in {5, 101, 1001}", err, tolerance=1e-7)


def all_checks() -> list[Check]:
    return [check_theorem1(), check_corollary2(), check_theorem2(), check_theorem3(), check_corollary3(),
            check_observation4(), check_observations_2_3_exact(), check_observations_2_3_numeric()]
