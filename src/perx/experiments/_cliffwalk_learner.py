"""The learner of the Blind Cliffwalk studies (000 Sec. 3.1 and App. B.1): tabular or linear Q-learning, eq. (2)-(3),
shared by ``perx cliffwalk`` (Figures 1-2) and ``perx variants`` (App. A) so that both study the same learner."""

from __future__ import annotations

import numpy as np
from numba import njit

from perx.envs import BlindCliffwalk

#: a run has converged when the MSE of Q to Q* falls below this
CONVERGED_MSE = 1e-3
#: step size eta of eq. (3)
ETA = 0.25
#: standard deviation of the initial weights
INIT_STD = 0.1


@njit(cache=True)
def _learn(theta, bias_of, qstar, linear, gamma, s, a, r, s2, term, w, deltas, threshold):
    """Q-learning on the transitions (s, a, r, s2, term) in order, eq. (2)-(3) with IS weight w, until the
    MSE to ``qstar`` falls below ``threshold``. Writes each TD error to ``deltas``; returns (updates applied,
    MSE after the last). One update costs O(2n) for the MSE (2n = 32 values at n = 16)."""
    m = qstar.shape[0]
    mse = np.inf
    for i in range(s.shape[0]):
        k = 2 * s[i] + a[i]
        q = theta[k] + (theta[bias_of[k]] if linear else 0.0)
        target = r[i]
        if not term[i]:
            k0 = 2 * s2[i]
            q0 = theta[k0] + (theta[bias_of[k0]] if linear else 0.0)
            q1 = theta[k0 + 1] + (theta[bias_of[k0 + 1]] if linear else 0.0)
            target += gamma * max(q0, q1)
        delta = target - q
        deltas[i] = delta
        step = ETA * w[i] * delta  # eq. (3): theta += eta * w * delta * phi(s, a)
        theta[k] += step
        if linear:
            theta[bias_of[k]] += step
        acc = 0.0
        for j in range(m):
            e = theta[j] + (theta[bias_of[j]] if linear else 0.0) - qstar[j]
            acc += e * e
        mse = acc / m
        if mse < threshold:
            return i + 1, mse
    return s.shape[0], mse


@njit(cache=True)
def _qv(theta, bias_of, linear, j):
    return theta[j] + (theta[bias_of[j]] if linear else 0.0)


@njit(cache=True)
def _mse(theta, bias_of, qstar, linear):
    acc = 0.0
    for j in range(qstar.shape[0]):
        e = _qv(theta, bias_of, linear, j) - qstar[j]
        acc += e * e
    return acc / qstar.shape[0]



class Learner:
    """Q(s, a) = theta[2s + a] (+ a bias weight if linear); updates by eq. (2)-(3).

    ``bias="shared"`` (default): one bias feature for every (s, a), the issue's reading of "one-hot
    state concatenated with a bias feature of 1". ``bias="per-action"``: one bias per action (a weight
    block [one-hot(s), 1] per action), the other possible reading of 000 App. B.1.
    """

    def __init__(self, env: BlindCliffwalk, linear: bool, rng: np.random.Generator, bias: str = "shared") -> None:
        if bias not in ("shared", "per-action"):
            raise ValueError(f"bias: must be 'shared' or 'per-action', got {bias!r}")
        self.n = env.n
        self.m = 2 * env.n
        self.linear = linear
        self.gamma = env.gamma
        self.qstar = env.q_star().reshape(-1)  # index 2s + a
        n_bias = 0 if not linear else (1 if bias == "shared" else 2)
        self.theta = rng.normal(0.0, INIT_STD, self.m + n_bias)
        # feature index of the bias weight of each (s, a) = 2s + a
        self.bias_of = self.m + (np.arange(self.m) % 2 if bias == "per-action" else np.zeros(self.m, np.int64))

    def q(self) -> np.ndarray:
        """All Q-values, index 2s + a."""
        return self.theta[: self.m] + self.theta[self.bias_of] if self.linear else self.theta.copy()

    def mse(self) -> float:
        e = self.q() - self.qstar
        return float(e @ e) / self.m

    def td_error(self, s: int, a: int, r: float, s2: int, terminated: bool) -> float:
        th = self.theta
        target = r
        if not terminated:
            q0, q1 = th[2 * s2], th[2 * s2 + 1]
            if self.linear:
                q0 += th[self.bias_of[2 * s2]]
                q1 += th[self.bias_of[2 * s2 + 1]]
            target += self.gamma * max(q0, q1)
        k = 2 * s + a
        return float(target - (th[k] + (th[self.bias_of[k]] if self.linear else 0.0)))

    def learn(self, s, a, r, s2, terminated, weights, deltas) -> tuple[int, float]:
        """Compiled updates on a sequence of transitions (int64 / float64 / bool arrays of one length)
        until convergence: (updates applied, MSE after them); ``deltas`` receives their TD errors."""
        return _learn(self.theta, self.bias_of, self.qstar, self.linear, self.gamma, s, a, r, s2, terminated,
                      weights, deltas, CONVERGED_MSE)

    def update(self, s: int, a: int, delta: float, weight: float = 1.0) -> None:
        step = ETA * weight * delta  # eq. (3): theta += eta * w * delta * phi(s, a)
        k = 2 * s + a
        self.theta[k] += step
        if self.linear:
            self.theta[self.bias_of[k]] += step
