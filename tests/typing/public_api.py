"""A typed user of perx's public API, for the type checker (not collected by pytest: no test_ prefix).

`.ci/run` runs mypy over this file and the core modules listed in pyproject.toml ([tool.mypy]); a public
signature whose annotations stop agreeing with how the README and docs use it fails there. It also runs as a
script (`python tests/typing/public_api.py`), so the calls below are real ones, not only declarations.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

import perx


def use_the_buffer(sampler: perx.Sampler) -> float:
    buf: perx.ReplayBuffer = perx.ReplayBuffer(1000, sampler, seed=0)
    ids: np.ndarray = buf.extend(obs=np.zeros((64, 4), np.float32), action=np.zeros(64, np.int64),
                                 reward=np.ones(64, np.float32))
    one: np.ndarray = buf.add(obs=np.ones(4, np.float32), action=1, reward=0.5)
    assert len(ids) == 64 and len(one) == 1
    schedule = perx.LinearSchedule(0.4, 1.0, steps=100)
    batch: perx.Batch = buf.sample(32, beta=schedule(10))
    obs: np.ndarray = batch["obs"]
    weights: np.ndarray = batch.weights
    indices: np.ndarray = batch.indices
    probabilities: np.ndarray = buf.probabilities(indices, batch_size=32)
    written: int = buf.update_priorities(indices, np.abs(np.random.default_rng(0).normal(size=len(batch))))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "buffer.npz"
        buf.save(path)
        again: perx.ReplayBuffer = perx.ReplayBuffer.load(path)
    assert len(again) == len(buf) and obs.shape == (32, 4) and written >= 0 and probabilities.shape == (32,)
    w: np.ndarray = perx.importance_weights(batch.probabilities, len(buf), 0.5, normalize="batch")
    perx.check_weight_scale(weights)
    return float(weights.sum() + w.sum())


def use_the_episodes() -> perx.Batch:
    buf = perx.ReplayBuffer(100, perx.Proportional(alpha=0.6), episodes=perx.Episodes(n_step=3, gamma=0.9))
    for t in range(10):
        buf.add(obs=np.full(2, t, np.float32), next_obs=np.full(2, t + 1, np.float32), action=0,
                reward=1.0, terminated=t == 9, truncated=False)
    return buf.sample(4)


if __name__ == "__main__":
    for s in (perx.Uniform(), perx.Proportional(), perx.RankBased(), perx.LAP(), perx.Greedy()):
        use_the_buffer(s)
    print(len(use_the_episodes()))
