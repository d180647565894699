"""Other libraries' prioritized buffers behind the interface perx's agents call, so that the benchmarks time
one agent (``perx.agents.td3``) with every buffer.

What a run calls (``perx.agents.runner.LockstepRuns``): ``extend(obs=, action=, reward=, next_obs=,
terminated=, truncated=)`` with arrays of one or more rows, ``sample(batch_size, beta=)`` returning a batch with
fields ``obs``, ``action``, ``next_obs``, ``return`` and ``discount`` and attributes ``weights`` and
``indices``, and ``update_priorities(indices, priorities)``. Each adapter stores reward and 1 - terminated,
as each library's own examples do, and makes ``return`` and ``discount`` (gamma where the episode goes on, 0
where it terminated; a time limit is not a termination) from them when it samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class PeerBatch(dict):
    """A sampled batch: fields by name, importance weights and the ids to update."""

    weights: np.ndarray
    indices: np.ndarray


class CpprbPER:
    """cpprb's ``PrioritizedReplayBuffer`` (alpha 0.6; cpprb adds its ``eps`` to the priorities it is given)."""

    def __init__(self, capacity: int, gamma: float = 0.99, alpha: float = 0.6, eps: float = 1e-10) -> None:
        import cpprb

        self._cpprb = cpprb
        self.capacity, self.gamma, self.alpha, self.eps = capacity, gamma, alpha, eps
        self.buf: Any = None  # made at the first extend, when the shapes are known

    def extend(self, *, obs, action, reward, next_obs, terminated, truncated=None) -> np.ndarray:
        obs, action = np.asarray(obs, np.float32), np.asarray(action, np.float32)
        if self.buf is None:
            env = {"obs": {"shape": obs.shape[1:]}, "act": {"shape": action.shape[1:]}, "rew": {},
                   "next_obs": {"shape": obs.shape[1:]}, "not_done": {}}
            self.buf = self._cpprb.PrioritizedReplayBuffer(self.capacity, env, alpha=self.alpha, eps=self.eps)
        n = len(obs)
        self.buf.add(obs=obs, act=action, rew=np.asarray(reward, np.float32), next_obs=np.asarray(next_obs, np.float32),
                     not_done=1.0 - np.asarray(terminated, np.float32))
        return np.zeros(n, np.int64)  # cpprb does not return ids; the agent only samples them

    def sample(self, batch_size: int, *, beta: float) -> PeerBatch:
        s = self.buf.sample(batch_size, beta=beta)
        out = PeerBatch(obs=s["obs"], action=s["act"], next_obs=s["next_obs"], **{"return": s["rew"][:, 0]},
                        discount=self.gamma * s["not_done"][:, 0])
        out.weights, out.indices = s["weights"], s["indexes"]
        return out

    def update_priorities(self, indices, priorities) -> None:
        self.buf.update_priorities(indices, priorities)


class TianshouPER:
    """Tianshou's ``PrioritizedReplayBuffer`` (alpha 0.6, its default weight normalisation), one row per add."""

    def __init__(self, capacity: int, gamma: float = 0.99, alpha: float = 0.6) -> None:
        from tianshou.data import Batch, PrioritizedReplayBuffer

        self._batch = Batch
        self.gamma = gamma
        self.buf = PrioritizedReplayBuffer(capacity, alpha=alpha, beta=0.4)

    def extend(self, *, obs, action, reward, next_obs, terminated, truncated) -> np.ndarray:
        for i in range(len(obs)):  # Tianshou's add takes a single transition unless given buffer ids
            self.buf.add(self._batch(obs=obs[i], act=action[i], rew=float(reward[i]), obs_next=next_obs[i],
                                     terminated=bool(terminated[i]), truncated=bool(truncated[i]), info={}))
        return np.zeros(len(obs), np.int64)

    def sample(self, batch_size: int, *, beta: float) -> PeerBatch:
        self.buf.set_beta(beta)
        b, idx = self.buf.sample(batch_size)
        out = PeerBatch(obs=b.obs, action=b.act, next_obs=b.obs_next, **{"return": b.rew},
                        discount=self.gamma * (1.0 - np.asarray(b.terminated, np.float32)))
        out.weights, out.indices = np.asarray(b.weight), idx
        return out

    def update_priorities(self, indices, priorities) -> None:
        self.buf.update_weight(indices, priorities)


PEERS = {"cpprb per": CpprbPER, "tianshou per": TianshouPER}
