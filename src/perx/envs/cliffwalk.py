"""The Blind Cliffwalk (Schaul et al. 2016, Sec. 3.1, Figure 1, App. B.1).

n states in a chain, two actions. In state s the 'right' action is ``s % 2`` (it alternates from
state to state, so no representation can generalise "right" across states); the other is 'wrong'.
'wrong' ends the episode with reward 0; 'right' moves to s + 1 with reward 0, except in the last
state, where it ends the episode with reward 1. A random policy reaches the reward with
probability 2^-n.

Ground truth with discount gamma: Q*(s, right) = gamma^(n - 1 - s), Q*(s, wrong) = 0.
"""

from __future__ import annotations

import numbers

import numpy as np


class BlindCliffwalk:
    """The chain of 000 Figure 1 with gymnasium-style ``reset``/``step`` and its own Generator.

    Args:
        n: number of states, >= 1.
        seed: seed of the environment's ``np.random.Generator`` (used by :meth:`replay_memory`).
    """

    n_actions = 2

    def __init__(self, n: int, seed: int | None = None) -> None:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"n: expected an int >= 1, got {n!r}")
        self.n = int(n)
        self.rng = np.random.default_rng(seed)
        self.state = 0

    @property
    def gamma(self) -> float:
        """The discount of 000 App. B.1, 1 - 1/n (keeps values on one scale for every n)."""
        return 1.0 - 1.0 / self.n

    def right_action(self, s):
        """The 'right' action in state(s) ``s`` (alternates: 0, 1, 0, ...)."""
        return np.asarray(s) % 2

    def reset(self) -> int:
        self.state = 0
        return self.state

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        """Returns (next_state, reward, terminated, truncated, info); the episode has no time limit."""
        if action not in (0, 1):
            raise ValueError(f"action: must be 0 or 1, got {action!r}")
        s = self.state
        if action != s % 2:
            return s, 0.0, True, False, {}
        if s == self.n - 1:
            return s, 1.0, True, False, {}
        self.state = s + 1
        return self.state, 0.0, False, False, {}

    def q_star(self, gamma: float | None = None) -> np.ndarray:
        """Ground-truth Q-values, float64 [n, 2] (000 App. B.1)."""
        gamma = self.gamma if gamma is None else gamma
        q = np.zeros((self.n, 2))
        s = np.arange(self.n)
        q[s, s % 2] = gamma ** (self.n - 1 - s)
        return q

    def replay_memory(self) -> dict[str, np.ndarray]:
        """Execute all 2^n action sequences until termination, in random order (000 App. B.1).

        Returns the transitions in execution order as arrays ``obs`` (state), ``action``, ``reward``,
        ``next_obs``, ``terminated``, ``truncated``: 2^(n+1) - 2 of them, exactly one with reward 1.
        A terminal transition's ``next_obs`` repeats its state (it is never bootstrapped from).
        """
        n = self.n
        if n > 24:
            raise ValueError(f"n: 2^{n} action sequences would not fit in memory; use n <= 24")
        order = self.rng.permutation(2**n)
        # bit t of a sequence says whether its (t+1)-th action is right; the episode ends at the
        # first wrong action, so a sequence contributes (first wrong position) transitions, n if none
        bits = (order[:, None] >> np.arange(n)) & 1
        wrong_at = np.where(bits.all(axis=1), n, np.argmin(bits, axis=1))  # 0-based step of the first wrong
        lengths = np.minimum(wrong_at + 1, n)
        total = int(lengths.sum())
        seq = np.repeat(np.arange(len(order)), lengths)
        step = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # = state index
        right = bits[seq, step].astype(bool)
        action = np.where(right, step % 2, 1 - step % 2)
        last = step == n - 1
        reward = (right & last).astype(np.float64)
        terminated = ~right | last
        next_obs = np.where(terminated, step, step + 1)
        return {
            "obs": step.astype(np.int64),
            "action": action.astype(np.int64),
            "reward": reward,
            "next_obs": next_obs.astype(np.int64),
            "terminated": terminated,
            "truncated": np.zeros(total, bool),
        }
