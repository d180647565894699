"""VectorRecorder: real transitions only, in each of Gymnasium's autoreset modes."""

import numpy as np
import pytest

import perx
import perx.gym

gym = pytest.importorskip("gymnasium")
from gymnasium.vector import AutoresetMode, SyncVectorEnv  # noqa: E402

LOG = []  # every real environment step: (sub-env, episode, t after the step, terminated, truncated)


class Counter(gym.Env):
    """Observation [sub-env, episode, t]; episode e of sub-env i lasts LENGTHS[i][e % 3] steps and ends
    terminated when e is even, truncated when odd. Deterministic, so every boundary is known."""

    LENGTHS = ((3, 1, 4), (2, 5, 1), (6, 2, 2))
    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, index):
        self.index = index
        self.episode = -1
        self.t = 0

    def _obs(self):
        return np.array([self.index, self.episode, self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.LENGTHS[self.index][self.episode % 3]
        terminated = done and self.episode % 2 == 0
        truncated = done and not terminated
        LOG.append((self.index, self.episode, self.t, terminated, truncated))
        return self._obs(), float(self.t), terminated, truncated, {}


def run(mode, buf, steps=40):
    LOG.clear()
    envs = SyncVectorEnv([lambda i=i: Counter(i) for i in range(3)], autoreset_mode=mode)
    rec = perx.gym.VectorRecorder(buf, envs)
    rec.reset(seed=0)
    for _ in range(steps):
        _, _, term, trunc, _ = rec.step(np.zeros(3, np.int64))
        if mode == AutoresetMode.DISABLED and (term | trunc).any():
            rec.reset(options={"reset_mask": term | trunc})
    return rec


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("episodic", [False, True])
def test_only_real_transitions_are_stored(mode, episodic):
    eps = perx.Episodes(n_step=1, streams=3, next_obs="shared") if episodic else None
    buf = perx.ReplayBuffer(1000, episodes=eps)
    rec = run(mode, buf)
    batch = buf.get(np.arange(len(buf)))
    obs, nxt = batch["obs"], batch["next_obs"]
    # no transition crosses an episode boundary: same sub-env, same episode, one step later
    np.testing.assert_array_equal(obs[:, :2], nxt[:, :2])
    np.testing.assert_array_equal(nxt[:, 2], obs[:, 2] + 1)
    np.testing.assert_array_equal(batch["reward"], nxt[:, 2])
    # exactly the environment's real steps, each once, with terminated and truncated kept apart
    stored = sorted(zip(nxt[:, 0].astype(int).tolist(), nxt[:, 1].astype(int).tolist(),
                        nxt[:, 2].astype(int).tolist(), batch["terminated"].tolist(), batch["truncated"].tolist(),
                        strict=True))
    assert stored == sorted(LOG)
    assert any(t for *_, t, _ in LOG) and any(t for *_, t in LOG)  # both kinds of ends happened
    assert rec.transitions == len(LOG)
    if mode == AutoresetMode.NEXT_STEP:
        assert rec.skipped > 0  # the reset-only steps were seen and dropped


def test_each_sub_env_keeps_its_own_episode_stream_for_n_step_returns():
    eps = perx.Episodes(n_step=3, gamma=0.5, streams=3, next_obs="shared")
    buf = perx.ReplayBuffer(1000, episodes=eps)
    run(AutoresetMode.NEXT_STEP, buf, steps=30)
    batch = buf.get(np.arange(len(buf)))
    for row in range(len(buf)):
        i, episode, t = batch["obs"][row].astype(int)
        length = Counter.LENGTHS[i][episode % 3]
        k = batch["steps"][row]
        # the window stays inside the episode: it bootstraps from step t + k of the same episode
        assert tuple(batch["next_obs"][row].astype(int)) == (i, episode, t + k)
        reached = max(tt for ii, ee, tt, *_ in LOG if (ii, ee) == (i, episode))  # the stream's newest step
        assert k == min(3, length - t, reached - t)  # full, ended by the episode, or cut at the write head
        expected = sum(0.5**j * (t + 1 + j) for j in range(k))
        assert batch["return"][row] == pytest.approx(expected)
        ended_here = t + k == length
        assert batch["terminated"][row] == (ended_here and episode % 2 == 0)
        assert batch["discount"][row] == (0.0 if batch["terminated"][row] else 0.5**k)


class DictCounter(Counter):
    """Counter with a Dict observation: "pos" = [sub-env, episode, t] (float32[3]) and "t" (an int64 scalar)."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
                                         "t": gym.spaces.Box(0, 1000, (), np.int64)})

    def _obs(self):
        return {"pos": np.array([self.index, self.episode, self.t], np.float32), "t": np.int64(self.t)}


DICT_LAYOUTS = {"plain": None, "stored": dict(next_obs="stored"), "shared": dict(next_obs="shared"),
                "frames": dict(frame_stack=3)}


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("layout", sorted(DICT_LAYOUTS))
def test_dict_observations_are_stored_key_by_key_in_every_autoreset_mode(mode, layout):
    """A vector env with a Dict observation space (and, for "frames", Gymnasium's FrameStackObservation stacking
    every key of it): the same real transitions as with arrays, each key in its own shape, n-step windows inside
    their episodes."""
    from gymnasium.wrappers import FrameStackObservation

    cfg = DICT_LAYOUTS[layout]
    k = (cfg or {}).get("frame_stack")
    eps = perx.Episodes(n_step=3, gamma=0.5, streams=3, **cfg) if cfg is not None else None
    buf = perx.ReplayBuffer(1000, episodes=eps)
    LOG.clear()
    wrap = (lambda env: FrameStackObservation(env, k)) if k else (lambda env: env)
    envs = SyncVectorEnv([lambda i=i: wrap(DictCounter(i)) for i in range(3)], autoreset_mode=mode)
    rec = perx.gym.VectorRecorder(buf, envs)
    rec.reset(seed=0)
    for _ in range(40):
        _, _, term, trunc, _ = rec.step(np.zeros(3, np.int64))
        if mode == AutoresetMode.DISABLED and (term | trunc).any():
            rec.reset(options={"reset_mask": term | trunc})
    batch = buf.get(np.arange(len(buf)))
    obs, nxt = batch["obs"], batch["next_obs"]
    assert set(obs) == {"pos", "t"} and obs["t"].dtype == np.int64 and obs["pos"].dtype == np.float32
    frames = (k,) if k else ()
    assert obs["pos"].shape == (len(buf), *frames, 3) and nxt["t"].shape == (len(buf), *frames)
    pos, t = (obs["pos"][:, -1], obs["t"][:, -1]) if k else (obs["pos"], obs["t"])
    npos, nt = (nxt["pos"][:, -1], nxt["t"][:, -1]) if k else (nxt["pos"], nxt["t"])
    np.testing.assert_array_equal(pos[:, 2], t)
    if eps is None:  # one-step transitions: exactly the environment's real steps, each once
        np.testing.assert_array_equal(pos[:, :2], npos[:, :2])
        np.testing.assert_array_equal(npos[:, 2], pos[:, 2] + 1)
        np.testing.assert_array_equal(nt, npos[:, 2])
        stored = sorted(zip(npos[:, 0].astype(int).tolist(), npos[:, 1].astype(int).tolist(),
                            npos[:, 2].astype(int).tolist(), batch["terminated"].tolist(),
                            batch["truncated"].tolist(), strict=True))
        assert stored == sorted(LOG)
    else:  # 3-step windows: they stay inside their episode, ended by it or cut at the write head
        for row in range(len(buf)):
            i, episode, step = pos[row].astype(int)
            length = Counter.LENGTHS[i][episode % 3]
            steps = batch["steps"][row]
            assert tuple(npos[row].astype(int)) == (i, episode, step + steps) and nt[row] == step + steps
            reached = max(tt for ii, ee, tt, *_ in LOG if (ii, ee) == (i, episode))
            assert steps == min(3, length - step, reached - step)
            assert batch["return"][row] == pytest.approx(sum(0.5**j * (step + 1 + j) for j in range(steps)))
        if k:  # every key's stack is padded with the episode's first frame and shifted by one frame a step
            np.testing.assert_array_equal(obs["t"], np.maximum(t[:, None] + np.arange(1 - k, 1), 0))
            np.testing.assert_array_equal(obs["pos"][:, :, 2], obs["t"])
            np.testing.assert_array_equal(nxt["t"], np.maximum(nt[:, None] + np.arange(1 - k, 1), 0))
        assert len(buf) == len(LOG)
    assert rec.transitions == len(LOG)


def test_nested_dict_observations_are_refused_clearly():
    class Nested(Counter):
        observation_space = gym.spaces.Dict({"a": gym.spaces.Dict({"b": gym.spaces.Box(-1, 1, (2,))})})

        def reset(self, *, seed=None, options=None):
            return {"a": {"b": np.zeros(2, np.float32)}}, {}

    envs = SyncVectorEnv([lambda: Nested(0)])
    rec = perx.gym.VectorRecorder(perx.ReplayBuffer(10), envs)
    with pytest.raises(TypeError, match="nested Dict observations"):
        rec.reset()


def test_one_buffer_per_sub_env_with_dict_observations():
    bufs = [perx.ReplayBuffer(100, episodes=perx.Episodes(n_step=2, next_obs="shared")) for _ in range(3)]
    LOG.clear()
    envs = SyncVectorEnv([lambda i=i: DictCounter(i) for i in range(3)], autoreset_mode=AutoresetMode.SAME_STEP)
    rec = perx.gym.VectorRecorder(bufs, envs)
    rec.reset(seed=0)
    for _ in range(20):
        rec.step(np.zeros(3, np.int64))
    for i, buf in enumerate(bufs):
        batch = buf.get(np.arange(len(buf)))
        assert (batch["obs"]["pos"][:, 0] == i).all() and len(buf) == sum(1 for entry in LOG if entry[0] == i)


def test_too_few_streams_are_refused():
    envs = SyncVectorEnv([lambda i=i: Counter(i) for i in range(3)])
    with pytest.raises(ValueError, match="streams"):
        perx.gym.VectorRecorder(perx.ReplayBuffer(10, episodes=perx.Episodes(streams=2)), envs)


def test_a_reset_in_the_middle_of_episodes_ends_them_in_the_buffer():
    eps = perx.Episodes(n_step=3, gamma=0.5, streams=3, next_obs="shared")
    buf = perx.ReplayBuffer(100, episodes=eps)
    envs = SyncVectorEnv([lambda i=i: Counter(i) for i in range(3)])
    rec = perx.gym.VectorRecorder(buf, envs)
    rec.reset(seed=0)
    rec.step(np.zeros(3, np.int64))
    rec.reset(seed=1)  # e.g. a re-seed: every running episode is abandoned
    rec.step(np.zeros(3, np.int64))  # accepted: new episodes
    batch = buf.get(np.arange(len(buf)))
    np.testing.assert_array_equal(batch["obs"][:, :2], batch["next_obs"][:, :2])  # no window crosses the reset


def test_a_masked_reset_restarts_only_those_sub_envs():
    buf = perx.ReplayBuffer(100, episodes=perx.Episodes(streams=3, next_obs="shared"))
    envs = SyncVectorEnv([lambda i=i: Counter(i) for i in range(3)], autoreset_mode=AutoresetMode.NEXT_STEP)
    rec = perx.gym.VectorRecorder(buf, envs)
    rec.reset(seed=0)
    for _ in range(3):  # sub-env 0's first episode lasts 3 steps: it now owes a reset-only step
        rec.step(np.zeros(3, np.int64))
    owed = rec._autoreset.copy()
    assert owed.tolist() == [True, False, False]
    options = {"reset_mask": np.array([False, False, True])}
    rec.reset(options=options)
    assert (rec._autoreset[:2] == owed[:2]).all() and not rec._autoreset[2]
    for _ in range(5):
        rec.step(np.zeros(3, np.int64))
    batch = buf.get(np.arange(len(buf)))
    np.testing.assert_array_equal(batch["obs"][:, :2], batch["next_obs"][:, :2])


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_one_buffer_per_sub_env(mode):
    bufs = [perx.ReplayBuffer(200, episodes=perx.Episodes(n_step=2, next_obs="shared")) for _ in range(3)]
    LOG.clear()
    envs = SyncVectorEnv([lambda i=i: Counter(i) for i in range(3)], autoreset_mode=mode)
    rec = perx.gym.VectorRecorder(bufs, envs)
    rec.reset(seed=0)
    for _ in range(30):
        _, _, term, trunc, _ = rec.step(np.zeros(3, np.int64))
        if mode == AutoresetMode.DISABLED and (term | trunc).any():
            rec.reset(options={"reset_mask": term | trunc})
    for i, buf in enumerate(bufs):
        batch = buf.get(np.arange(len(buf)))
        assert (batch["obs"][:, 0] == i).all()  # only sub-env i's steps
        assert len(buf) == sum(1 for entry in LOG if entry[0] == i)
