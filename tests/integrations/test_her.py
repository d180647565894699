"""perx.sb3.HerReplayBuffer: hindsight goals relabelled at sample time (future / final / episode), over any perx
sampler, with SB3's HerReplayBuffer contract (env passed by SB3, compute_reward, save/load)."""

import copy
import warnings

import numpy as np
import pytest

sb3 = pytest.importorskip("stable_baselines3")
torch = pytest.importorskip("torch")
import gymnasium as gym  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.envs import BitFlippingEnv  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

import perx  # noqa: E402
import perx.sb3  # noqa: E402

torch.set_num_threads(1)


class GoalLine(gym.Env):
    """A goal env for hand-built buffers: every key is one float; the reward is minus the goal distance, so a
    recomputed reward tells which goal it was computed with."""

    observation_space = gym.spaces.Dict({k: gym.spaces.Box(-1e6, 1e6, (1,), np.float32)
                                         for k in ("observation", "achieved_goal", "desired_goal")})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return {k: np.zeros(1, np.float32) for k in self.observation_space.spaces}, {}

    def step(self, action):  # pragma: no cover - the buffers here are filled by hand
        raise NotImplementedError

    def compute_reward(self, achieved_goal, desired_goal, info):
        assert achieved_goal.shape == desired_goal.shape and achieved_goal.ndim == 2 and len(info) == len(achieved_goal)
        return -np.abs(achieved_goal - desired_goal).sum(axis=-1).astype(np.float32)


def _buffer(capacity=100, n_envs=1, **kwargs):
    kwargs.setdefault("seed", 0)
    return perx.sb3.HerReplayBuffer(capacity, GoalLine.observation_space, GoalLine.action_space,
                                    env=DummyVecEnv([GoalLine]), device="cpu", n_envs=n_envs, **kwargs)


class Recorder:
    """Fills a HER buffer step by step, one row per stream per add as SB3 does, and remembers every stored id's
    (stream, episode, step); each stored step's next achieved goal is 1000 + its id (desired goal -1), so a
    relabelled goal names the id it came from."""

    def __init__(self, buf):
        self.buf, self.n = buf, buf.n_envs
        self.where = {}  # id -> (stream, episode number, step)
        self.episode = [0] * self.n
        self.step = [0] * self.n
        self.last = np.zeros(self.n, np.float32)  # each stream's last next observation
        self.fresh = np.zeros(self.n, np.float32) - 5  # observations after a reset: never a next observation

    def add(self, done, reset=()):
        """One step of every stream; ``reset``: streams SB3 reset without a done (a new learn())."""
        n, first = self.n, self.buf.buffer.next_index
        ids = first + np.arange(n)
        for e in reset:
            self.episode[e] += 1
            self.step[e] = 0
        obs_x = np.array([self.last[e] if self.step[e] else self.fresh[e] for e in range(n)], np.float32)
        self.fresh -= 1
        obs = {"observation": obs_x[:, None], "achieved_goal": obs_x[:, None], "desired_goal": np.full((n, 1), -1.0)}
        nxt = {"observation": (1000.0 + ids)[:, None], "achieved_goal": (1000.0 + ids)[:, None],
               "desired_goal": np.full((n, 1), -1.0)}
        self.buf.add(obs, nxt, np.zeros(n, np.int64), -np.ones(n), np.asarray(done, bool), [{} for _ in range(n)])
        for e, i in enumerate(ids):
            self.where[int(i)] = (e, self.episode[e], self.step[e])
            self.last[e] = 1000.0 + i
            self.step[e] += 1
            if done[e]:
                self.episode[e] += 1
                self.step[e] = 0

    def live(self):
        nxt = self.buf.buffer.next_index
        return np.arange(max(0, nxt - self.buf.buffer.capacity), nxt)

    def episode_steps(self, i):
        """The live ids of id i's episode, by step."""
        e, ep, _ = self.where[i]
        mine = {s: j for j in self.live() for (e2, ep2, s) in [self.where[int(j)]] if (e2, ep2) == (e, ep)}
        return [mine[s] for s in sorted(mine)]

    def allowed(self, i, strategy):
        """The ids a strategy may take id i's goal from: its own episode, live steps only, up to its latest."""
        steps = self.episode_steps(i)
        if strategy == "final":
            return {steps[-1]}
        if strategy == "future":
            return {j for j in steps if j >= i}
        return set(steps)


STRATEGIES = ["future", "final", "episode"]


# -- relabelling against hand-computed cases ---------------------------------------------------------------------

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_relabelled_goals_are_the_ones_the_strategy_allows_and_rewards_are_recomputed(strategy):
    buf = _buffer(n_sampled_goal=4, goal_selection_strategy=strategy)
    rec = Recorder(buf)
    # episode A: ids 0-3 (ends), B: ids 4-6 (ends), C: ids 7-8 still running
    for done in [0, 0, 0, 1, 0, 0, 1, 0, 0]:
        rec.add([done])
    expected = {  # by hand: id -> the next achieved goals (1000 + id) its relabelled goal may be
        "final": {0: {1003}, 1: {1003}, 2: {1003}, 3: {1003}, 4: {1006}, 5: {1006}, 6: {1006}, 7: {1008}, 8: {1008}},
        "future": {0: {1000, 1001, 1002, 1003}, 1: {1001, 1002, 1003}, 2: {1002, 1003}, 3: {1003},
                   4: {1004, 1005, 1006}, 5: {1005, 1006}, 6: {1006}, 7: {1007, 1008}, 8: {1008}},
        "episode": {**{i: {1000, 1001, 1002, 1003} for i in range(4)}, **{i: {1004, 1005, 1006} for i in range(4, 7)},
                    7: {1007, 1008}, 8: {1007, 1008}},
    }[strategy]
    seen = {i: set() for i in range(9)}
    for _ in range(40):
        data = buf.sample(64)
        ids = data.indices
        goal = data.observations["desired_goal"].numpy()[:, 0]
        np.testing.assert_array_equal(goal, data.next_observations["desired_goal"].numpy()[:, 0])
        achieved_next = data.next_observations["achieved_goal"].numpy()[:, 0]
        np.testing.assert_array_equal(achieved_next, 1000 + ids)  # the row itself is the stored one
        her = data.goal_indices >= 0
        np.testing.assert_array_equal(goal[~her], -1)  # kept: the goal it was collected with, and its reward
        np.testing.assert_array_equal(data.rewards.numpy()[~her, 0], -1)
        np.testing.assert_array_equal(goal[her], 1000 + data.goal_indices[her])
        for i, g in zip(ids[her], goal[her], strict=True):
            assert int(g) in expected[int(i)], (strategy, i, g)
            seen[int(i)].add(int(g))
        # the reward is compute_reward(next achieved goal, new goal)
        np.testing.assert_allclose(data.rewards.numpy()[her, 0], -np.abs(achieved_next[her] - goal[her]))
    assert seen == expected  # every allowed goal was drawn (uniform over a few values, 2560 draws)


def test_future_matches_sb3s_convention_on_the_same_episode():
    """SB3's HerReplayBuffer on the same episode: its `future` goals for step t are the next achieved goals of the
    steps t..T-1 (inclusive), as ours."""
    env = DummyVecEnv([GoalLine])
    theirs = sb3.HerReplayBuffer(20, GoalLine.observation_space, GoalLine.action_space, env, device="cpu",
                                 n_sampled_goal=10**6, goal_selection_strategy="future")
    ours = _buffer(20, n_sampled_goal=10**6, goal_selection_strategy="future")
    for t in range(4):
        x = np.array([[float(t)]], np.float32)
        obs = {"observation": x, "achieved_goal": x, "desired_goal": np.array([[-1.0]])}
        nxt = {"observation": x + 1, "achieved_goal": x + 1, "desired_goal": np.array([[-1.0]])}
        for buf in (theirs, ours):
            buf.add(obs, nxt, np.zeros(1, np.int64), -np.ones(1), np.array([t == 3]), [{}])
    np.random.seed(0)  # noqa: NPY002 (SB3's buffer draws from NumPy's global generator)
    pairs = {"theirs": set(), "ours": set()}
    for name, buf in (("theirs", theirs), ("ours", ours)):
        for _ in range(50):
            data = buf.sample(64)
            step = data.observations["observation"].numpy()[:, 0]
            goal = data.observations["desired_goal"].numpy()[:, 0]
            pairs[name] |= {(int(s), int(g)) for s, g in zip(step, goal, strict=True) if g != -1}
    assert pairs["ours"] == pairs["theirs"] == {(t, g) for t in range(4) for g in range(t + 1, 5)}


@pytest.mark.parametrize(("k", "batches"), [(4, 20), (1, 20), (0, 5)])
def test_the_relabelled_fraction_is_k_over_k_plus_1(k, batches):
    buf = _buffer(n_sampled_goal=k, seed=3)
    rec = Recorder(buf)
    for t in range(30):
        rec.add([t % 6 == 5])
    draws = 256 * batches
    her = np.array([buf.sample(256).goal_indices >= 0 for _ in range(batches)])  # [batches, 256]
    p = k / (k + 1)
    # binomial(draws, p): at this fixed seed the count must lie within 4 standard deviations of draws * p (a
    # correct buffer fails that with probability 6e-5); measured: k=4 4075 of 5120 (expected 4096, sd 28.6), k=1
    # 2534 (2560, sd 35.8)
    assert abs(her.sum() - draws * p) <= 4 * np.sqrt(draws * p * (1 - p))
    # and wherever the row sits in the batch (a prioritized sampler returns its rows in segment order)
    tail = her[:, -64:]
    assert abs(tail.sum() - tail.size * p) <= 4 * np.sqrt(tail.size * p * (1 - p))
    if k == 0:
        assert not her.any()


# -- the ring buffer: episodes overwritten in part -------------------------------------------------------------

@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("capacity", "n_envs"), [(10, 1), (17, 3)])
def test_a_partly_overwritten_episode_takes_goals_only_from_its_own_live_steps(strategy, capacity, n_envs):
    """A model check: random episode lengths (some longer than the buffer, some cut by resets without a done, as a
    new learn() makes), a ring of a capacity that is no multiple of n_envs, and after every add the goals drawn
    for every live id come from the id's own episode, among its steps still stored, as the strategy allows."""
    buf = _buffer(capacity, n_envs, n_sampled_goal=4, goal_selection_strategy=strategy, seed=7)
    rec = Recorder(buf)
    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 2 * capacity // n_envs + 3, size=(n_envs, 200))
    counts = np.zeros(n_envs, int)
    for t in range(120):
        done = [counts[e] + 1 >= lengths[e, 0] for e in range(n_envs)]
        reset = [e for e in range(n_envs) if not done[e] and counts[e] and rng.random() < 0.03]
        for e in reset:
            counts[e] = 0
        rec.add(done, reset)
        for e in range(n_envs):
            counts[e] += 1
            if done[e]:
                counts[e] = 0
                lengths[e] = np.roll(lengths[e], -1)
        live = rec.live()
        if t % 3 and t < 100:
            continue
        for i, g in zip(np.repeat(live, 8), buf.sample_goal_indices(np.repeat(live, 8)), strict=True):
            assert int(g) in rec.allowed(int(i), strategy), (t, i, g)
    # and through sample(): the goal values are the next achieved goals of those ids (1000 + id)
    data = buf.sample(512)
    her = data.goal_indices >= 0
    goal = data.observations["desired_goal"].numpy()[her, 0]
    for i, g in zip(data.indices[her], goal, strict=True):
        assert int(g) - 1000 in rec.allowed(int(i), strategy)


def test_an_episode_longer_than_the_buffer_draws_only_its_stored_steps():
    buf = _buffer(5, goal_selection_strategy="episode", n_sampled_goal=4)
    rec = Recorder(buf)
    for t in range(12):
        rec.add([t == 11])
    goals = buf.sample_goal_indices(np.repeat(np.arange(7, 12), 200))
    assert set(goals.tolist()) == set(range(7, 12))


def test_reset_without_done_and_truncate_last_trajectory_end_the_open_episode():
    buf = _buffer(goal_selection_strategy="final")
    rec = Recorder(buf)
    for _ in range(3):
        rec.add([False])
    assert set(buf.sample_goal_indices(np.zeros(20, np.int64)).tolist()) == {2}  # open: its latest step so far
    rec.add([False], reset=[0])  # SB3 reset the env (its observation is not the last next observation)
    rec.add([False])
    assert set(buf.sample_goal_indices(np.zeros(20, np.int64)).tolist()) == {2}
    assert set(buf.sample_goal_indices(np.full(20, 3)).tolist()) == {4}
    with pytest.warns(UserWarning, match="truncated"):
        buf.truncate_last_trajectory()
    rec.add([False], reset=[0])
    assert set(buf.sample_goal_indices(np.full(20, 3)).tolist()) == {4}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        buf.add({k: np.full((1, 1), 9.0) for k in GoalLine.observation_space.spaces},
                {k: np.full((1, 1), 9.0) for k in GoalLine.observation_space.spaces},
                np.zeros(1, np.int64), np.zeros(1), np.array([True]), [{}])
        buf.truncate_last_trajectory()  # nothing open: no warning


def test_copy_info_dict_passes_each_steps_info_to_compute_reward():
    seen = []

    class InfoLine(GoalLine):
        def compute_reward(self, achieved_goal, desired_goal, info):
            seen.extend(info)
            return super().compute_reward(achieved_goal, desired_goal, info)

    buf = perx.sb3.HerReplayBuffer(50, GoalLine.observation_space, GoalLine.action_space, env=DummyVecEnv([InfoLine]),
                                   device="cpu", copy_info_dict=True, seed=0)
    x = {k: np.zeros((1, 1), np.float32) for k in GoalLine.observation_space.spaces}
    for t in range(4):
        buf.add(x, x, np.zeros(1, np.int64), np.zeros(1), np.array([t == 3]), [{"t": t}])
    data = buf.sample(32)
    her = data.goal_indices >= 0
    assert [info["t"] for info in seen] == data.indices[her].tolist()


def test_bad_arguments_are_refused_naming_them():
    space, action = GoalLine.observation_space, GoalLine.action_space
    with pytest.raises(ValueError, match="goal_selection_strategy"):
        perx.sb3.HerReplayBuffer(10, space, action, goal_selection_strategy="past")
    with pytest.raises(ValueError, match="n_sampled_goal"):
        perx.sb3.HerReplayBuffer(10, space, action, n_sampled_goal=-1)
    with pytest.raises(ValueError, match="achieved_goal"):
        perx.sb3.HerReplayBuffer(10, gym.spaces.Dict({"observation": space["observation"]}), action)
    with pytest.raises(ValueError, match="optimize_memory_usage"):
        perx.sb3.HerReplayBuffer(10, space, action, optimize_memory_usage=True)
    from stable_baselines3.her.goal_selection_strategy import GoalSelectionStrategy

    assert perx.sb3.HerReplayBuffer(10, space, action, goal_selection_strategy=GoalSelectionStrategy.FINAL
                                    ).goal_selection_strategy == "final"
    env = BitFlippingEnv(n_bits=4)
    with pytest.raises(ValueError, match=r"replay_buffer_class.*perx\.sb3\.HerReplayBuffer.*got"):
        perx.sb3.DQN("MultiInputPolicy", env, replay_buffer_class=sb3.HerReplayBuffer)
    with pytest.raises(ValueError, match=r"replay_buffer_class.*DictReplayBuffer"):
        perx.sb3.DQN("MultiInputPolicy", env, replay_buffer_class=sb3.common.buffers.DictReplayBuffer)


# -- the algorithms ---------------------------------------------------------------------------------------------

def _bits(n_envs=2, continuous=False, n_bits=4):
    return make_vec_env(lambda: BitFlippingEnv(n_bits=n_bits, continuous=continuous), n_envs)


@pytest.mark.parametrize(("algo", "replay"), [("DQN", "per"), ("DQN", "uniform"), ("SAC", "per"), ("TD3", "lap"),
                                              ("SAC", "uniform")])
def test_the_perx_algorithms_take_it_as_a_drop_in(algo, replay):
    env = _bits(continuous=algo != "DQN")
    model = getattr(perx.sb3, algo)("MultiInputPolicy", env, replay=replay,
                                    replay_buffer_class=perx.sb3.HerReplayBuffer,
                                    replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"),
                                    learning_starts=40, seed=0, policy_kwargs={"net_arch": [16]})
    model.learn(200)
    buf = model.replay_buffer
    assert isinstance(buf, perx.sb3.HerReplayBuffer) and buf.env is model.env and buf.size() == 200
    assert model.replay_buffer_kwargs["sampler"] == perx.sb3.describe_sampler(buf.sampler)
    if replay != "uniform":
        assert buf.sampler.max_priority != buf.sampler.initial_priority  # |delta| was written back


def test_plain_sb3_dqn_takes_it_too():
    model = sb3.DQN("MultiInputPolicy", _bits(), replay_buffer_class=perx.sb3.HerReplayBuffer,
                    replay_buffer_kwargs=dict(n_sampled_goal=2, goal_selection_strategy="episode", copy_info_dict=True,
                                              sampler=perx.Proportional()),
                    learning_starts=40, seed=0, policy_kwargs={"net_arch": [16]})
    model.learn(120)
    assert model.replay_buffer.size() == 120


def test_per_writes_the_relabelled_batchs_abs_delta_to_the_sampled_stored_ids():
    model = perx.sb3.DQN("MultiInputPolicy", _bits(), replay="per", replay_buffer_class=perx.sb3.HerReplayBuffer,
                         replay_buffer_kwargs=dict(n_sampled_goal=4), learning_starts=40, seed=0,
                         policy_kwargs={"net_arch": [16]})
    model.learn(200)
    buf = model.replay_buffer
    seen = {}
    original_sample, original_update = buf.sample, buf.update_priorities

    def sample(*args, **kwargs):
        seen["data"] = original_sample(*args, **kwargs)
        return seen["data"]

    def update(indices, td):
        seen["indices"], seen["td"] = indices, td
        return original_update(indices, td)

    buf.sample, buf.update_priorities = sample, update
    q_net, q_target = copy.deepcopy(model.q_net), copy.deepcopy(model.q_net_target)  # the networks before the step
    model.train(gradient_steps=1, batch_size=64)
    data = seen["data"]
    assert (data.goal_indices >= 0).sum() > 32  # the batch was relabelled (4/5 of it on average)
    np.testing.assert_array_equal(seen["indices"], data.indices)
    with torch.no_grad():  # delta of the relabelled rows: their goals and recomputed rewards
        target = data.rewards + (1 - data.dones) * model.gamma * q_target(data.next_observations).max(1)[0][:, None]
        delta = torch.gather(q_net(data.observations), 1, data.actions.long()) - target
    np.testing.assert_allclose(np.asarray(seen["td"]), delta.numpy()[:, 0], rtol=1e-5, atol=1e-6)
    eps = buf.sampler.config()["eps"]
    # an id drawn twice: the last write wins
    last = {int(i): abs(float(d)) + eps for i, d in zip(data.indices, delta[:, 0], strict=True)}
    ids = np.array(sorted(last))
    np.testing.assert_allclose(buf.sampler.priorities(ids % buf.buffer.capacity), [last[i] for i in ids], rtol=1e-5)


def test_a_saved_her_model_loads_predicts_the_same_and_learns_on_with_its_saved_buffer(tmp_path):
    kw = dict(replay="per", replay_buffer_class=perx.sb3.HerReplayBuffer, learning_starts=40, seed=0,
              replay_buffer_kwargs=dict(n_sampled_goal=2, goal_selection_strategy="future"),
              policy_kwargs={"net_arch": [16]})
    model = perx.sb3.DQN("MultiInputPolicy", _bits(), **kw)
    model.learn(150)
    n = model.replay_buffer.size()
    model.save(tmp_path / "model.zip")
    model.save_replay_buffer(tmp_path / "replay.pkl")
    loaded = perx.sb3.DQN.load(tmp_path / "model.zip", env=_bits())
    assert type(loaded.replay_buffer) is perx.sb3.HerReplayBuffer and loaded.replay_buffer.env is loaded.env
    assert loaded.replay_buffer.sampler is not model.replay_buffer.sampler
    obs = _bits().reset()
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    loaded.learn(60, reset_num_timesteps=False)  # a fresh buffer of its own
    assert loaded.replay_buffer.size() == loaded.num_timesteps - model.num_timesteps >= 60
    for truncate in (True, False):
        again = perx.sb3.DQN.load(tmp_path / "model.zip", env=_bits())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            again.load_replay_buffer(tmp_path / "replay.pkl", truncate_last_traj=truncate)
        saved = again.replay_buffer
        assert saved.env is again.env and saved.size() == n
        assert any("truncated" in str(w.message) for w in caught) == (truncate and model.replay_buffer._open.any())
        np.testing.assert_array_equal(saved.buffer.priorities(np.arange(n)),
                                      model.replay_buffer.buffer.priorities(np.arange(n)))
        np.testing.assert_array_equal(saved._ep_first, model.replay_buffer._ep_first)
        again.learn(60, reset_num_timesteps=False)
        assert again.replay_buffer.size() == n + again.num_timesteps - model.num_timesteps
        data = again.replay_buffer.sample(64)
        assert (data.goal_indices >= 0).any()


# -- learning on BitFlippingEnv (SB3's test_performance_her settings) ------------------------------------------

def _learn_bits(replay, seed=0, steps=5000, n_bits=10, k=5):
    """SB3's tests/test_her.py::test_performance_her: DQN + HER (future, k=5) on 10 bits, 2 envs, 5000 steps."""
    model = perx.sb3.DQN("MultiInputPolicy", _bits(n_bits=n_bits), replay=replay,
                         replay_buffer_class=perx.sb3.HerReplayBuffer,
                         replay_buffer_kwargs=dict(n_sampled_goal=k, goal_selection_strategy="future"),
                         learning_rate=5e-4, train_freq=1, gradient_steps=2, learning_starts=100,
                         exploration_final_eps=0.02, target_update_interval=500, seed=seed, batch_size=32,
                         buffer_size=int(1e5))
    model.learn(steps)
    return float(np.mean(model.ep_success_buffer))


@pytest.mark.slow
def test_uniform_her_solves_bit_flipping_as_sb3s_her_does():
    # Success over the last 100 training episodes (model.ep_success_buffer), measured on this machine with torch on
    # one thread (ad-hoc scripts running exactly this setting through _learn_bits / SB3's DQN + its HerReplayBuffer):
    #   5000 steps (this test; SB3's own test asserts > 0.9): SB3's HerReplayBuffer 1.00 / 1.00 / 1.00 at seeds
    #   0 / 1 / 2; perx uniform 1.00 / 1.00 / 1.00; perx per 1.00 / 1.00 / 1.00 (~22 s each).
    #   3000 steps, seeds 0-5: SB3 0.81 0.79 0.98 0.77 0.87 0.50 (mean 0.79); perx uniform 0.89 0.95 0.49 0.87 0.59
    #   1.00 (mean 0.80); perx per 0.61 0.72 0.37 0.88 0.46 0.81 (mean 0.64).
    #   Without HER (n_sampled_goal=0) perx uniform reaches 0.01 at 5000 steps (seed 0).
    assert _learn_bits("uniform") > 0.9


@pytest.mark.slow
def test_prioritized_her_learns_bit_flipping():
    # perx per HER: 1.00 at seeds 0, 1, 2 after 5000 steps (numbers above); it learns more slowly early on (mean
    # 0.64 vs 0.80 at 3000 steps over seeds 0-5)
    assert _learn_bits("per") > 0.9
