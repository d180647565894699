"""Stable-Baselines3 with perx replay: PER, rank-based PER, LAP and PAL for DQN, TD3 and SAC.

Tested against stable-baselines3 2.9 (``pip install "perx[sb3]"``). Three pieces:

* :class:`PerxReplayBuffer`, usable as ``replay_buffer_class`` of any SB3 off-policy algorithm: a perx
  buffer behind SB3's buffer interface, with any perx sampler, n-step returns (``n_steps``) and one
  stream per SB3 sub-environment. Its samples carry ``weights`` and ``indices`` besides SB3's fields.
* :class:`HerReplayBuffer`: hindsight experience replay (goals relabelled at sample time, ``future``, ``final``
  or ``episode``) over any perx sampler, so prioritized HER too; a drop-in for SB3's ``HerReplayBuffer``.
* :class:`DQN`, :class:`TD3` and :class:`SAC`: SB3's algorithms whose ``train`` weights the loss by the
  IS weights, writes |delta| back as priorities (the larger of the two critics' for TD3 and SAC, 004
  Appendix D.1) and anneals beta linearly to 1 over training (000 Sec. 3.4); ``replay=`` picks the
  variant, and only sampler, priority and loss change:

  ======== ====================================== ===================================================
  replay   sampling                               loss
  ======== ====================================== ===================================================
  uniform  uniform                                SB3's own (Huber for DQN, MSE for TD3/SAC)
  per      proportional, alpha 0.6, eps 1e-6      SB3's loss weighted by (N P)^-beta / the batch's max,
                                                  beta 0.4 -> 1
  rank     rank-based, alpha 0.7                  as per, beta 0.5 -> 1 (000 Table 3)
  lap      max(|delta|, kappa)^alpha, no IS       Huber with threshold kappa (004 eq. 9/29-30)
  pal      uniform                                PAL (004 eq. 10/31)
  ======== ====================================== ===================================================

  alpha for LAP and PAL is 0.6 with DQN and 0.4 with TD3/SAC; kappa is 1 by default (004 uses 0.01 for
  Atari DQN); both can be set. A sampler instance can be passed as ``replay`` too.

  Defaults differ on purpose: ``DQN`` uses ``replay="per"`` (000's algorithm), ``TD3`` and ``SAC`` use
  ``"lap"``, because with their MSE critic loss PER is what 004 found harmful (004 Sec. 5 and Table 1: PER below
  TD3 on most MuJoCo tasks) and LAP is 004's remedy. IS weights are divided by the batch's largest weight, with
  priority floor 1e-6, as perx's samplers and agents do by default; a batch whose weights are all below 1e-3
  (possible only with a sampler passed in with ``normalize="buffer"``) raises ``perx.WeightScaleWarning``.

The switch from SB3 is three lines::

    from perx.sb3 import DQN                     # instead of: from stable_baselines3 import DQN
    model = DQN("MlpPolicy", env, replay="per")  # the rest of SB3's arguments unchanged
    model.learn(50_000)
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, NamedTuple

import numpy as np
import stable_baselines3 as sb3
import torch as th
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
from stable_baselines3.common.preprocessing import get_obs_shape
from stable_baselines3.common.utils import polyak_update
from stable_baselines3.her.goal_selection_strategy import GoalSelectionStrategy
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer as _SB3HerReplayBuffer

import perx
import perx.torch as ptorch


class PerxReplayBufferSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples`` fields, plus the IS ``weights`` ([B, 1]) and the perx ``indices``."""

    observations: th.Tensor
    actions: th.Tensor
    next_observations: th.Tensor
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    indices: np.ndarray


class PerxDictReplayBufferSamples(NamedTuple):
    """SB3's ``DictReplayBufferSamples`` fields (observations as dicts of tensors, one per key of the ``Dict``
    space), plus the IS ``weights`` ([B, 1]) and the perx ``indices``."""

    observations: dict[str, th.Tensor]
    actions: th.Tensor
    next_observations: dict[str, th.Tensor]
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    indices: np.ndarray


def describe_sampler(sampler: perx.Sampler) -> dict[str, Any]:
    """A sampler as configuration: ``{"name": ..., "config": {...}}`` (plain values, what SB3 saves in a model's
    ``replay_buffer_kwargs``), from which :func:`build_sampler` makes a new, unbound sampler."""
    return {"name": sampler.name, "config": sampler.config()}


def build_sampler(sampler: perx.Sampler | dict | None) -> perx.Sampler:
    """A new unbound sampler for a buffer: None -> ``perx.Uniform()``; a description (:func:`describe_sampler`)
    -> that sampler; an unbound sampler -> itself; a bound one (what a loaded SB3 model hands back when its
    kwargs held the live object) -> a new sampler with its configuration."""
    if sampler is None:
        return perx.Uniform()
    if isinstance(sampler, dict):
        cls = perx.Sampler.registry.get(sampler.get("name"))
        if cls is None or not isinstance(sampler.get("config", {}), dict):
            raise ValueError(f"sampler: expected a perx sampler or {{'name': <one of "
                             f"{sorted(perx.Sampler.registry)}>, 'config': {{...}}}}, got {sampler!r}")
        return cls(**sampler.get("config", {}))
    if not isinstance(sampler, perx.Sampler):
        raise TypeError(f"sampler: expected a perx sampler or its description, got {type(sampler).__name__}")
    if sampler.capacity is not None:
        return type(sampler)(**sampler.config())
    return sampler


class PerxReplayBuffer(ReplayBuffer):
    """A perx buffer with SB3's ``ReplayBuffer`` interface (``replay_buffer_class=PerxReplayBuffer``).

    Args (besides SB3's own, passed by the algorithm):
        sampler: a perx sampler or its description ``{"name": "Proportional", "config": {"alpha": 0.6}}``
            (default ``perx.Uniform()``); see :func:`build_sampler`. SB3 keeps this argument in the model and
            passes it again when a saved model is loaded, so the perx algorithms store the description.
        n_steps: n of n-step returns; the samples then hold the n-step return in ``rewards`` and
            gamma^k (0 after a termination) in ``discounts``, as SB3's own ``NStepReplayBuffer``.
        gamma: discount for the n-step return.
        seed: seed of the sampler's generator.
        optimize_memory_usage: store each next observation once (``perx.Episodes(next_obs="shared")``).

    ``handle_timeout_termination`` keeps time-limit truncations apart from terminations, as in SB3:
    a truncated step bootstraps. A ``Dict`` observation space (SB3's ``MultiInputPolicy``) is stored as a perx
    dict field, one array per key, and samples then hold dicts of tensors (:class:`PerxDictReplayBufferSamples`,
    SB3's ``DictReplayBufferSamples`` plus weights and indices); ``optimize_memory_usage`` works with it too.
    Nested ``Dict`` spaces are not supported.
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, sampler: perx.Sampler | None = None,
                 n_steps: int = 1, gamma: float = 0.99, seed: int | None = None) -> None:
        sampler = build_sampler(sampler)
        self._dict_obs = isinstance(observation_space, spaces.Dict)
        if self._dict_obs:
            nested = [k for k, sub in observation_space.spaces.items() if isinstance(sub, spaces.Dict)]
            if nested:
                raise TypeError(f"observation_space: nested Dict spaces are not supported (key {nested[0]!r}); "
                                f"flatten the inner Dict with a wrapper")
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.optimize_memory_usage = optimize_memory_usage
        self.handle_timeout_termination = handle_timeout_termination
        obs_shape = get_obs_shape(observation_space)
        if self._dict_obs:  # a dict field: key -> (shape, dtype)
            obs_spec = {k: (shape, observation_space.spaces[k].dtype) for k, shape in obs_shape.items()}
        else:
            obs_spec = (obs_shape, observation_space.dtype)
        action_dtype = self._maybe_cast_dtype(action_space.dtype)
        spec = {"obs": obs_spec, "next_obs": obs_spec,
                "action": ((self.action_dim,), action_dtype), "reward": ((), np.float32),
                "terminated": ((), np.bool_), "truncated": ((), np.bool_)}
        # Episodes only where they are needed (n-step windows, next observations stored once): one-step
        # transitions with their next observation stored are independent rows, which perx samples and copies
        # in one compiled call (in a profile of DQN the episode bookkeeping was a sizeable part of each SB3
        # step; the loop's speed: results/sb3_bench.md, docs/training_loops.md, "Speed")
        self._episodic = n_steps > 1 or optimize_memory_usage
        episodes = perx.Episodes(n_step=n_steps, gamma=gamma, streams=n_envs,
                                 next_obs="shared" if optimize_memory_usage else "stored") if self._episodic else None
        self.buffer = perx.ReplayBuffer(buffer_size, sampler, seed=seed, spec=spec, episodes=episodes)
        self.n_steps = n_steps
        self.gamma = gamma
        #: IS exponent used by ``sample`` when none is given (the perx algorithms set it every update).
        self.beta = 1.0
        self._streams = np.arange(n_envs)
        #: each stream's last next observation, and whether its episode is still open: an add whose obs is not
        #: that next observation follows a reset SB3 made (a new learn(), a loaded model) and ends the episode
        if self._dict_obs:
            self._next_obs = {k: np.zeros((n_envs, *shape), observation_space.spaces[k].dtype)
                              for k, shape in obs_shape.items()}
        else:
            self._next_obs = np.zeros((n_envs, *self.obs_shape), observation_space.dtype)
        self._open = np.zeros(n_envs, np.bool_)
        self._set_fast_path()

    def _set_fast_path(self) -> None:
        """What the lean ``add`` of plain rows needs, worked out once (also for a buffer unpickled from a
        version that did not keep it)."""
        n = self.n_envs
        self._plain = not self._episodic and not self._dict_obs
        self._obs_rows = None if self._dict_obs else (n, *self.obs_shape)
        self._action_rows = (n, self.action_dim)
        self._no_timeout = np.zeros(n, np.bool_)
        self._rows = max(self.buffer.capacity // n, 1)  # SB3's ReplayBuffer keeps buffer_size // n_envs rows

    def __setstate__(self, state: dict) -> None:
        parent = getattr(super(), "__setstate__", None)  # SB3's HerReplayBuffer has its own (it drops env)
        if parent is not None:
            parent(state)
        else:
            self.__dict__.update(state)
        if "_plain" not in state:
            self._episodic = self.n_steps > 1 or self.optimize_memory_usage
            self._set_fast_path()

    @property
    def sampler(self) -> perx.Sampler:
        return self.buffer.sampler

    def size(self) -> int:
        return len(self.buffer)

    def reset(self) -> None:
        raise NotImplementedError("PerxReplayBuffer cannot be emptied in place; create a new one")

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        n = self.n_envs
        if self._plain:  # independent rows of one array observation: the lean path of every SB3 step
            terminated, truncated = self._ends(np.asarray(done, np.bool_).reshape(n), infos)
            self.buffer.extend(obs=np.asarray(obs).reshape(self._obs_rows),
                               next_obs=np.asarray(next_obs).reshape(self._obs_rows),
                               action=np.asarray(action).reshape(self._action_rows),
                               reward=np.asarray(reward, np.float32).reshape(n),
                               terminated=terminated, truncated=truncated)
            self._sync_position()
            return
        if self._dict_obs:  # (SB3's DictReplayBuffer reshapes too: a Discrete key comes as [n] for shape (1,))
            obs = {k: np.asarray(obs[k]).reshape((n, *shape)) for k, shape in self.obs_shape.items()}
            next_obs = {k: np.asarray(next_obs[k]).reshape((n, *shape)) for k, shape in self.obs_shape.items()}
        else:
            obs = np.asarray(obs).reshape((n, *self.obs_shape))
            next_obs = np.asarray(next_obs).reshape((n, *self.obs_shape))
        action = np.asarray(action).reshape((n, self.action_dim))
        done = np.asarray(done, np.bool_).reshape(n)
        terminated, truncated = self._ends(done, infos)
        reward = np.asarray(reward, np.float32).reshape(n)
        if not self._episodic:  # independent rows (a Dict observation): no episode to end or continue
            self.buffer.extend(obs=obs, next_obs=next_obs, action=action, reward=reward, terminated=terminated,
                               truncated=truncated)
            self._sync_position()
            return
        if self._dict_obs:
            same = np.ones(n, np.bool_)
            for k, value in obs.items():
                same &= (value == self._next_obs[k]).reshape(n, -1).all(axis=1)
        else:
            same = (obs == self._next_obs).reshape(n, -1).all(axis=1)
        broken = self._open & ~same
        if broken.any():  # SB3 reset these environments mid-episode: their stored episodes end (truncated)
            self.buffer.end_episodes(self._streams[broken])
        self.buffer.extend(obs=obs, next_obs=next_obs, action=action, reward=reward, terminated=terminated,
                           truncated=truncated, stream=self._streams)
        if self._dict_obs:
            for k, value in next_obs.items():
                self._next_obs[k][...] = value
        else:
            self._next_obs[...] = next_obs
        self._open = ~done
        self._sync_position()

    def _ends(self, done: np.ndarray, infos: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """(terminated, truncated) bool [n_envs] of SB3's ``done``: a step cut by a time limit is truncated (it
        bootstraps) when ``handle_timeout_termination``, as in SB3's own buffer."""
        if not (self.handle_timeout_termination and any(info.get("TimeLimit.truncated", False) for info in infos)):
            return done, self._no_timeout  # no step of this add was cut by a time limit (the usual case)
        timeout = np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos], np.bool_)
        return done & ~timeout, done & timeout

    def _sync_position(self) -> None:
        # SB3's pos and full count rows of n_envs transitions (its ReplayBuffer keeps buffer_size // n_envs rows)
        rows, n = self._rows, self.n_envs
        self.pos = (self.buffer.next_index // n) % rows
        self.full = self.buffer.next_index >= rows * n

    def sample(self, batch_size: int, env: Any = None, beta: float | None = None
               ) -> PerxReplayBufferSamples | PerxDictReplayBufferSamples:
        batch = self.buffer.sample(batch_size, beta=self.beta if beta is None else float(beta))
        return self._samples(batch, env)

    def _samples(self, batch: perx.Batch, env: Any) -> PerxReplayBufferSamples | PerxDictReplayBufferSamples:
        """A perx batch as SB3 samples: observations and rewards normalised (``env``: a VecNormalize or None),
        everything but ``indices`` as tensors on the buffer's device."""
        tensor = self._tensor
        obs = self._normalize_obs(batch["obs"], env)
        next_obs = self._normalize_obs(batch["next_obs"], env)
        if self.n_steps == 1:
            rewards, discounts = batch["reward"].reshape(-1, 1), None
        else:
            rewards = batch["return"].astype(np.float32).reshape(-1, 1)
            discounts = tensor(batch["discount"].astype(np.float32).reshape(-1, 1))
        rewards = self._normalize_reward(rewards, env)  # VecNormalize only scales: a sum scales alike
        weights = tensor(batch.weights.astype(np.float32).reshape(-1, 1))
        dones = tensor(batch["terminated"].astype(np.float32).reshape(-1, 1))
        if self._dict_obs:
            return PerxDictReplayBufferSamples({k: tensor(v) for k, v in obs.items()}, tensor(batch["action"]),
                                               {k: tensor(v) for k, v in next_obs.items()}, dones,
                                               tensor(rewards), discounts, weights, batch.indices)
        return PerxReplayBufferSamples(tensor(obs), tensor(batch["action"]), tensor(next_obs), dones,
                                       tensor(rewards), discounts, weights, batch.indices)

    def _tensor(self, array: np.ndarray) -> th.Tensor:
        """``array`` as a tensor on the buffer's device. On the CPU without a copy: every array of a perx batch
        is allocated by that ``sample`` call and referenced by nothing else (SB3's ``to_torch`` copies each
        array, because its arrays are views of its storage: part of what perx saves on sampling, see
        docs/training_loops.md, "Speed", and results/sb3_bench.md)."""
        if self.device.type == "cpu":
            try:
                return th.from_numpy(array)
            except (TypeError, ValueError):  # a dtype torch lacks or negative strides: a copy, as SB3 makes
                pass
        return th.as_tensor(array, device=self.device)

    def update_priorities(self, indices: np.ndarray, td_errors: Any) -> int:
        """Write |delta| (any sign; a tensor with grad on any device is fine) for sampled indices."""
        return self.buffer.update_priorities(indices, td_errors)


class PerxHerReplayBufferSamples(NamedTuple):
    """:class:`PerxDictReplayBufferSamples` of a :class:`HerReplayBuffer`, plus ``goal_indices``: int64 [B], for each
    row the stored id whose next ``achieved_goal`` became its ``desired_goal`` (in ``observations`` and
    ``next_observations``, its reward recomputed), or -1 where the row kept the goal it was collected with."""

    observations: dict[str, th.Tensor]
    actions: th.Tensor
    next_observations: dict[str, th.Tensor]
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    indices: np.ndarray
    goal_indices: np.ndarray


#: HER's goal selection strategies (Andrychowicz et al. 2017), by SB3's names
_STRATEGIES = ("future", "final", "episode")


class HerReplayBuffer(PerxReplayBuffer, _SB3HerReplayBuffer):
    """Hindsight experience replay (Andrychowicz et al. 2017) over a perx buffer: goals relabelled at sample time,
    with any perx sampler, so prioritized HER too (``replay_buffer_class=HerReplayBuffer``).

    A drop-in for SB3's ``HerReplayBuffer`` (same arguments, and SB3 treats it as one: it passes ``env``, drops it
    when pickling, calls ``set_env`` and ``truncate_last_trajectory`` in ``load_replay_buffer``), usable with
    :class:`DQN`, :class:`TD3`, :class:`SAC` (any ``replay``) and with SB3's own off-policy algorithms. The
    observation space must be a ``Dict`` with ``achieved_goal`` and ``desired_goal`` keys of one shape, and
    ``env.compute_reward(achieved_goal, desired_goal, infos)`` must take batches ([n, *goal_shape] -> [n]).

    Args (besides SB3's buffer arguments, passed by the algorithm):
        env: the training VecEnv (SB3 passes it); relabelled rewards come from
            ``env.env_method("compute_reward", next_achieved_goal, new_goal, infos, indices=[0])``, one vectorised
            call per batch on the first sub-environment, as SB3 does.
        n_sampled_goal: k, relabelled transitions per original one: each sampled row is relabelled with
            probability k / (k + 1) (independently, as in the paper's reference code; 0 turns HER off).
        goal_selection_strategy: ``"future"`` (default), ``"final"`` or ``"episode"`` (or SB3's
            ``GoalSelectionStrategy``).
        copy_info_dict: keep each step's info dict and pass deep copies to ``compute_reward`` (else empty dicts).
        sampler, seed: as :class:`PerxReplayBuffer`; ``seed`` also seeds the relabelling's generator (None: one
            drawn from NumPy's global generator, which SB3 seeds with the model's seed).

    Goal selection, in SB3's convention: for the sampled step t of an episode whose stored steps are 0..T-1, draw
    a step j and use the ``achieved_goal`` of step j's *next* observation (the goal reached by its action):
    ``future``: j uniform in {t, ..., T-1} (inclusive: j = t gives the goal the step itself reached, reward as
    for success); ``final``: j = T-1; ``episode``: j uniform in {0, ..., T-1}. The reward is recomputed from the
    step's next ``achieved_goal`` and the new goal; ``dones`` (terminations) are kept as collected.

    Differences from SB3's buffer, both forced by sampling through a perx sampler that cannot skip stored
    transitions: steps of the episode still running in a sub-environment are sampled too, and relabelled with
    goals from the steps stored so far (T-1 = its latest step; SB3 samples finished episodes only); and an
    episode whose oldest steps were overwritten in the ring keeps its surviving steps, ``episode`` then drawing j
    among those (``future`` and ``final`` only look later, at steps that are always still stored; SB3 drops such
    an episode). No goal ever comes from another episode or from overwritten data.

    Priorities are kept per stored transition: the sampler draws stored ids, and the |delta| of the (possibly
    relabelled) row is written back to the id it was drawn from, so a transition's priority is its |delta| under
    the goal it was last replayed with. IS weights are those of the stored ids, as without HER.

    Steps are stored one row per sub-environment per ``add`` (every stream steps in lockstep, as SB3's
    collection does), with their next observation; ``n_steps`` and ``optimize_memory_usage`` are not supported.
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Dict, action_space: spaces.Space,
                 env: Any = None, device: th.device | str = "auto", n_envs: int = 1,
                 optimize_memory_usage: bool = False, handle_timeout_termination: bool = True,
                 n_sampled_goal: int = 4, goal_selection_strategy: Any = "future", copy_info_dict: bool = False, *,
                 sampler: perx.Sampler | dict | None = None, seed: int | None = None) -> None:
        if not isinstance(observation_space, spaces.Dict) or not {"achieved_goal", "desired_goal"} <= set(
                observation_space.spaces):
            raise ValueError(f"observation_space: HER needs a Dict space with 'achieved_goal' and 'desired_goal' "
                             f"keys, got {observation_space}")
        goal_shapes = {k: get_obs_shape(observation_space.spaces[k]) for k in ("achieved_goal", "desired_goal")}
        if goal_shapes["achieved_goal"] != goal_shapes["desired_goal"]:
            raise ValueError(f"observation_space: 'achieved_goal' and 'desired_goal' must have one shape, got "
                             f"{goal_shapes}")
        if optimize_memory_usage:
            raise ValueError("optimize_memory_usage: not supported by HerReplayBuffer (nor by SB3's); pass False")
        if isinstance(goal_selection_strategy, GoalSelectionStrategy):
            goal_selection_strategy = goal_selection_strategy.name
        strategy = goal_selection_strategy.lower() if isinstance(goal_selection_strategy, str) else None
        if strategy not in _STRATEGIES:
            raise ValueError(f"goal_selection_strategy: one of {list(_STRATEGIES)} (or SB3's GoalSelectionStrategy), "
                             f"got {goal_selection_strategy!r}")
        if isinstance(n_sampled_goal, bool) or not isinstance(n_sampled_goal, int | np.integer) or n_sampled_goal < 0:
            raise ValueError(f"n_sampled_goal: a non-negative int, got {n_sampled_goal!r}")
        super().__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs,
                         optimize_memory_usage=False, handle_timeout_termination=handle_timeout_termination,
                         sampler=sampler, n_steps=1, seed=seed)
        self.env = env
        self.n_sampled_goal = int(n_sampled_goal)
        self.goal_selection_strategy = strategy
        self.copy_info_dict = bool(copy_info_dict)
        #: probability that a sampled row gets a new goal: k / (k + 1)
        self.her_ratio = self.n_sampled_goal / (self.n_sampled_goal + 1)
        # without a seed, one drawn from NumPy's global generator: the one SB3's set_random_seed seeds
        entropy = [seed, 0x484552] if seed is not None else np.random.randint(2**31)  # noqa: NPY002
        self._rng = np.random.default_rng(entropy)
        cap = self.buffer.capacity
        # Episode bookkeeping per slot (slot = id % capacity), for the transition stored there: the id of its
        # episode's first step, of its last step (-1 while the episode is open: then the stream's latest id),
        # and its stream. Steps of one episode are n_envs ids apart (one row per stream per add).
        self._ep_first = np.zeros(cap, np.int64)
        self._ep_last = np.full(cap, -1, np.int64)
        self._ep_stream = np.zeros(cap, np.int32)
        #: per stream: first and latest id of its open episode (valid where self._open)
        self._cur_first = np.zeros(n_envs, np.int64)
        self._cur_last = np.zeros(n_envs, np.int64)
        self._infos = np.array([{} for _ in range(cap)], dtype=object) if self.copy_info_dict else None

    def add(self, obs: dict[str, np.ndarray], next_obs: dict[str, np.ndarray], action: np.ndarray,
            reward: np.ndarray, done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Store one step of every sub-environment (each value [n_envs, ...]) and link it to its episode: a step
        continues its stream's open episode unless that episode ended (``done``) or SB3 reset the environment
        in between (the observation is not the last next observation: that episode ends at its last step)."""
        n, cap, open_ = self.n_envs, self.buffer.capacity, self._open
        if open_.any():
            same = np.ones(n, np.bool_)
            for k, shape in self.obs_shape.items():
                same &= (np.asarray(obs[k]).reshape((n, *shape)) == self._next_obs[k]).reshape(n, -1).all(axis=1)
            broken = open_ & ~same
            if broken.any():
                self._close(np.flatnonzero(broken))
        first = self.buffer.next_index
        super().add(obs, next_obs, action, reward, done, infos)
        ids = np.arange(first, first + n, dtype=np.int64)
        start = first % cap
        slots = slice(start, start + n) if start + n <= cap else ids % cap  # (a slice: the common case, faster)
        self._cur_first[~open_] = ids[~open_]
        self._ep_first[slots] = self._cur_first
        self._ep_last[slots] = -1
        self._ep_stream[slots] = self._streams
        self._cur_last[:] = ids
        open_[:] = True
        for k, shape in self.obs_shape.items():
            self._next_obs[k][...] = np.asarray(next_obs[k]).reshape((n, *shape))
        if self._infos is not None:
            for slot, info in zip(ids % cap, infos, strict=True):
                self._infos[slot] = info
        done = np.asarray(done, np.bool_).reshape(n)
        if done.any():
            self._close(np.flatnonzero(done))

    def _close(self, streams: np.ndarray) -> None:
        """End the open episodes of these streams at their latest step: every live step of each learns its end."""
        n, cap = self.n_envs, self.buffer.capacity
        oldest = max(0, self.buffer.next_index - cap)  # the oldest live id
        for e in streams:
            first, last = int(self._cur_first[e]), int(self._cur_last[e])
            lo = max(0, -((first - oldest) // n))  # the episode's first step still stored
            steps = np.arange(lo, (last - first) // n + 1, dtype=np.int64)
            self._ep_last[(first + n * steps) % cap] = last
            self._open[e] = False

    def truncate_last_trajectory(self) -> None:
        """End every open episode at its latest stored step (SB3's ``load_replay_buffer(truncate_last_traj=True)``
        calls it: the environment is not where the saved buffer left it). The stored rows are unchanged."""
        if self._open.any():
            warnings.warn("The last trajectory in the replay buffer will be truncated: its episode ends at its "
                          "latest stored step (pass truncate_last_traj=False to continue it)", stacklevel=2)
            self._close(np.flatnonzero(self._open))

    def sample_goal_indices(self, indices: np.ndarray) -> np.ndarray:
        """For stored ids (int64 [m], live), the ids (int64 [m]) whose next ``achieved_goal`` the strategy picks as
        their new goals; each drawn from the id's own episode, among its steps still stored, up to its latest."""
        indices = np.asarray(indices, np.int64)
        n, cap = self.n_envs, self.buffer.capacity
        slots = indices % cap
        first = self._ep_first[slots]
        last = self._ep_last[slots]
        last = np.where(last < 0, self._cur_last[self._ep_stream[slots]], last)  # open: its latest step
        length = (last - first) // n + 1  # T
        if self.goal_selection_strategy == "final":
            step = length - 1
        elif self.goal_selection_strategy == "future":
            step = self._rng.integers((indices - first) // n, length)
        else:  # "episode": any step still stored
            oldest = max(0, self.buffer.next_index - cap)
            step = self._rng.integers(np.maximum(0, -((first - oldest) // n)), length)
        return first + n * step

    def sample(self, batch_size: int, env: Any = None, beta: float | None = None) -> PerxHerReplayBufferSamples:
        """B stored transitions drawn by the sampler, each relabelled with probability k / (k + 1) (see the class
        docstring); ``env``: SB3's VecNormalize or None (goals and rewards are computed before normalising)."""
        batch = self.buffer.sample(batch_size, beta=self.beta if beta is None else float(beta))
        goal_ids = self._relabel(batch)
        return PerxHerReplayBufferSamples(*self._samples(batch, env), goal_ids)

    def _relabel(self, batch: perx.Batch) -> np.ndarray:
        """Give rows of a sampled batch new goals and rewards in place; returns the goal ids (-1: kept)."""
        goal_ids = np.full(len(batch.indices), -1, np.int64)
        rows = np.flatnonzero(self._rng.random(len(batch.indices)) < self.her_ratio)
        if len(rows) == 0:
            return goal_ids
        if self.env is None:
            raise RuntimeError("HerReplayBuffer: no env to compute rewards with; pass env= or call set_env(env) "
                               "(SB3 does both for a model's buffer)")
        goal_ids[rows] = self.sample_goal_indices(batch.indices[rows])
        goals = self.buffer.get(goal_ids[rows])["next_obs"]["achieved_goal"]
        obs, next_obs = batch["obs"], batch["next_obs"]
        obs["desired_goal"][rows] = goals
        next_obs["desired_goal"][rows] = goals
        if self._infos is not None:
            infos = copy.deepcopy(list(self._infos[batch.indices[rows] % self.buffer.capacity]))
        else:
            infos = [{} for _ in rows]
        # r_t = r(s_{t+1}, g): the goal reached is the next observation's (as SB3 and the paper)
        rewards = self.env.env_method("compute_reward", next_obs["achieved_goal"][rows], goals, infos, indices=[0])[0]
        batch["reward"][rows] = np.asarray(rewards, np.float32).reshape(len(rows))
        return goal_ids


#: beta annealed from start to end over training: 000 Sec. 3.4 / Table 3 (rank-based starts at 0.5).
_BETA = {"per": (0.4, 1.0), "rank": (0.5, 1.0)}


class _PerxAlgorithm:
    """The replay configuration shared by the perx versions of SB3's algorithms."""

    _lap_alpha = 0.4

    def _configure(self, replay: Any, alpha: float | None, beta: tuple[float, float] | None, kappa: float,
                   kwargs: dict) -> dict:
        buffer_class = kwargs.get("replay_buffer_class")
        if buffer_class is None:
            buffer_class = PerxReplayBuffer
        elif buffer_class not in (PerxReplayBuffer, HerReplayBuffer):
            hint = " (for HER, perx.sb3.HerReplayBuffer)" if buffer_class is _SB3HerReplayBuffer else ""
            raise ValueError(f"replay_buffer_class: the perx algorithms take perx.sb3.PerxReplayBuffer (the default) "
                             f"or perx.sb3.HerReplayBuffer{hint}, got {buffer_class!r}")
        if isinstance(replay, perx.Sampler):
            name, sampler = "custom", replay
            if isinstance(replay, perx.Proportional) and not replay.importance_sampling:
                name = "lap"
        else:
            name = replay
            if name == "uniform" or name == "pal":
                sampler = perx.Uniform()
            elif name == "per":
                # perx's defaults: eps 1e-6, weights divided by the batch's largest (docs/dqn.md, "Why PER
                # collapsed": 1e-10 and the buffer-wide maximum shrank every weight to ~1e-3..1e-6)
                sampler = perx.Proportional(alpha=alpha or 0.6)
            elif name == "rank":
                sampler = perx.RankBased(alpha=alpha or 0.7)
            elif name == "lap":
                sampler = perx.LAP(alpha=alpha or self._lap_alpha, kappa=kappa)
            else:
                raise ValueError(f"replay: one of 'uniform', 'per', 'rank', 'lap', 'pal' or a perx sampler, "
                                 f"got {replay!r}")
        self.replay = name
        self.replay_alpha = alpha or self._lap_alpha
        self.kappa = kappa
        self.beta_schedule = tuple(beta) if beta is not None else _BETA.get(name, (0.4, 1.0))
        buffer_kwargs = dict(kwargs.pop("replay_buffer_kwargs", None) or {})
        # configuration, not the live object: SB3 saves these kwargs and passes them again to the buffer of a
        # loaded model, which must get a sampler of its own
        buffer_kwargs["sampler"] = describe_sampler(sampler)
        if kwargs.get("seed") is not None:  # the sampler's own generator follows the algorithm's seed
            buffer_kwargs.setdefault("seed", kwargs["seed"])
        kwargs["replay_buffer_class"] = buffer_class
        kwargs["replay_buffer_kwargs"] = buffer_kwargs
        return kwargs

    def _beta(self) -> float:
        start, end = self.beta_schedule
        done = 1.0 - self._current_progress_remaining  # 0 -> 1 over learn()
        return float(start + (end - start) * min(max(done, 0.0), 1.0))

    def _sample(self, batch_size: int) -> PerxReplayBufferSamples | PerxDictReplayBufferSamples:
        data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env, beta=self._beta())
        if self.replay in ("per", "rank", "custom"):
            perx.check_weight_scale(data.weights, where=f"perx.sb3.{type(self).__name__}")
        return data

    def _loss(self, current: th.Tensor, target: th.Tensor, weights: th.Tensor, default) -> th.Tensor:
        """One critic's loss for the configured variant; ``default`` is SB3's elementwise loss."""
        if self.replay == "lap":  # Huber, threshold kappa (004 eq. 9): torch's fused kernel, as ptorch.huber
            return F.huber_loss(current, target, delta=self.kappa)
        if self.replay == "pal":
            return ptorch.pal(current - target, alpha=self.replay_alpha, kappa=self.kappa)
        if self.replay == "uniform":
            return default(current, target)
        return (weights * default(current, target, reduction="none")).mean()

    def _write_priorities(self, replay_data: PerxReplayBufferSamples | PerxDictReplayBufferSamples,
                          current: th.Tensor | tuple[th.Tensor, ...], target: th.Tensor) -> None:
        """New priorities |delta| of the sampled rows, for the variants that keep them: ``current`` is the Q-value
        [B, 1] (DQN) or each critic's (TD3, SAC: the largest |delta| of the critics, 004 D.1). Computed here,
        without a graph, so that uniform and PAL pay nothing for it."""
        if self.replay in ("uniform", "pal"):
            return
        with th.no_grad():
            if isinstance(current, th.Tensor):
                td = (current - target).reshape(-1)
            else:
                td = th.max(th.cat([(q - target).abs() for q in current], dim=1), dim=1).values
        # (a CPU tensor's numpy view: what perx's own conversion would make, minus its generic checks)
        self.replay_buffer.update_priorities(replay_data.indices, td.numpy() if td.device.type == "cpu" else td)


class DQN(_PerxAlgorithm, sb3.DQN):
    """SB3's DQN with perx replay (see the module docstring). ``replay``, ``alpha``, ``beta`` (start,
    end) and ``kappa`` choose the variant; every other argument is SB3's."""

    _lap_alpha = 0.6

    def __init__(self, policy: Any, env: Any, *, replay: Any = "per", alpha: float | None = None,
                 beta: tuple[float, float] | None = None, kappa: float = 1.0, **kwargs: Any) -> None:
        kwargs = self._configure(replay, alpha, beta, kappa, kwargs)
        super().__init__(policy, env, **kwargs)

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        losses = []
        for _ in range(gradient_steps):
            replay_data = self._sample(batch_size)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma
            with th.no_grad():
                next_q_values, _ = self.q_net_target(replay_data.next_observations).max(dim=1)
                target = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q_values.reshape(-1, 1)
            current = th.gather(self.q_net(replay_data.observations), dim=1, index=replay_data.actions.long())
            loss = self._loss(current, target, replay_data.weights, F.smooth_l1_loss)
            self._write_priorities(replay_data, current, target)
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))
        self.logger.record("train/beta", self._beta())


class TD3(_PerxAlgorithm, sb3.TD3):
    """SB3's TD3 with perx replay; the priority is max(|delta_1|, |delta_2|) over the two critics."""

    def __init__(self, policy: Any, env: Any, *, replay: Any = "lap", alpha: float | None = None,
                 beta: tuple[float, float] | None = None, kappa: float = 1.0, **kwargs: Any) -> None:
        kwargs = self._configure(replay, alpha, beta, kappa, kwargs)
        super().__init__(policy, env, **kwargs)

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate([self.actor.optimizer, self.critic.optimizer])
        actor_losses, critic_losses = [], []
        for _ in range(gradient_steps):
            self._n_updates += 1
            replay_data = self._sample(batch_size)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma
            with th.no_grad():
                noise = replay_data.actions.clone().data.normal_(0, self.target_policy_noise)
                noise = noise.clamp(-self.target_noise_clip, self.target_noise_clip)
                next_actions = (self.actor_target(replay_data.next_observations) + noise).clamp(-1, 1)
                next_q = th.cat(self.critic_target(replay_data.next_observations, next_actions), dim=1)
                next_q, _ = th.min(next_q, dim=1, keepdim=True)
                target = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q
            current = self.critic(replay_data.observations, replay_data.actions)
            critic_loss = sum(self._loss(q, target, replay_data.weights, F.mse_loss) for q in current)
            self._write_priorities(replay_data, current, target)
            critic_losses.append(critic_loss.item())
            self.critic.optimizer.zero_grad()
            critic_loss.backward()
            self.critic.optimizer.step()
            if self._n_updates % self.policy_delay == 0:
                actor_loss = -self.critic.q1_forward(replay_data.observations,
                                                     self.actor(replay_data.observations)).mean()
                actor_losses.append(actor_loss.item())
                self.actor.optimizer.zero_grad()
                actor_loss.backward()
                self.actor.optimizer.step()
                polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
                polyak_update(self.actor.parameters(), self.actor_target.parameters(), self.tau)
                polyak_update(self.critic_batch_norm_stats,
                                               self.critic_batch_norm_stats_target, 1.0)
                polyak_update(self.actor_batch_norm_stats, self.actor_batch_norm_stats_target, 1.0)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if actor_losses:
            self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        self.logger.record("train/beta", self._beta())


class SAC(_PerxAlgorithm, sb3.SAC):
    """SB3's SAC with perx replay; the priority is max(|delta_1|, |delta_2|) over the two critics."""

    def __init__(self, policy: Any, env: Any, *, replay: Any = "lap", alpha: float | None = None,
                 beta: tuple[float, float] | None = None, kappa: float = 1.0, **kwargs: Any) -> None:
        kwargs = self._configure(replay, alpha, beta, kappa, kwargs)
        super().__init__(policy, env, **kwargs)

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        self.policy.set_training_mode(True)
        optimizers = [self.actor.optimizer, self.critic.optimizer]
        if self.ent_coef_optimizer is not None:
            optimizers += [self.ent_coef_optimizer]
        self._update_learning_rate(optimizers)
        ent_coef_losses, ent_coefs, actor_losses, critic_losses = [], [], [], []
        for gradient_step in range(gradient_steps):
            replay_data = self._sample(batch_size)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma
            if self.use_sde:
                self.actor.reset_noise()
            actions_pi, log_prob = self.actor.action_log_prob(replay_data.observations)
            log_prob = log_prob.reshape(-1, 1)
            ent_coef_loss = None
            if self.ent_coef_optimizer is not None and self.log_ent_coef is not None:
                ent_coef = th.exp(self.log_ent_coef.detach())
                ent_coef_loss = -(self.log_ent_coef * (log_prob + self.target_entropy).detach()).mean()
                ent_coef_losses.append(ent_coef_loss.item())
            else:
                ent_coef = self.ent_coef_tensor
            ent_coefs.append(ent_coef.item())
            if ent_coef_loss is not None and self.ent_coef_optimizer is not None:
                self.ent_coef_optimizer.zero_grad()
                ent_coef_loss.backward()
                self.ent_coef_optimizer.step()
            with th.no_grad():
                next_actions, next_log_prob = self.actor.action_log_prob(replay_data.next_observations)
                next_q = th.cat(self.critic_target(replay_data.next_observations, next_actions), dim=1)
                next_q, _ = th.min(next_q, dim=1, keepdim=True)
                next_q = next_q - ent_coef * next_log_prob.reshape(-1, 1)
                target = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q
            current = self.critic(replay_data.observations, replay_data.actions)
            critic_loss = 0.5 * sum(self._loss(q, target, replay_data.weights, F.mse_loss) for q in current)
            self._write_priorities(replay_data, current, target)
            critic_losses.append(critic_loss.item())
            self.critic.optimizer.zero_grad()
            critic_loss.backward()
            self.critic.optimizer.step()
            q_pi = th.cat(self.critic(replay_data.observations, actions_pi), dim=1)
            min_q_pi, _ = th.min(q_pi, dim=1, keepdim=True)
            actor_loss = (ent_coef * log_prob - min_q_pi).mean()
            actor_losses.append(actor_loss.item())
            self.actor.optimizer.zero_grad()
            actor_loss.backward()
            self.actor.optimizer.step()
            if gradient_step % self.target_update_interval == 0:
                polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
                polyak_update(self.batch_norm_stats, self.batch_norm_stats_target, 1.0)
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/ent_coef", np.mean(ent_coefs))
        self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        if ent_coef_losses:
            self.logger.record("train/ent_coef_loss", np.mean(ent_coef_losses))
        self.logger.record("train/beta", self._beta())
