"""Stable-Baselines3 with perx replay: PER, rank-based PER, LAP and PAL for DQN, TD3 and SAC.

Tested against stable-baselines3 2.9 (``pip install "perx[sb3]"``). Two pieces:

* :class:`PerxReplayBuffer`, usable as ``replay_buffer_class`` of any SB3 off-policy algorithm: a perx
  buffer behind SB3's buffer interface, with any perx sampler, n-step returns (``n_steps``) and one
  stream per SB3 sub-environment. Its samples carry ``weights`` and ``indices`` besides SB3's fields.
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

from typing import Any, NamedTuple

import numpy as np
import stable_baselines3 as sb3
import torch as th
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
from stable_baselines3.common.preprocessing import get_obs_shape
from stable_baselines3.common.utils import polyak_update

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
        # in one compiled call (the episode bookkeeping cost 0.3 ms per SB3 step in a profile of DQN)
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
        if self._dict_obs:  # (SB3's DictReplayBuffer reshapes too: a Discrete key comes as [n] for shape (1,))
            obs = {k: np.asarray(obs[k]).reshape((n, *shape)) for k, shape in self.obs_shape.items()}
            next_obs = {k: np.asarray(next_obs[k]).reshape((n, *shape)) for k, shape in self.obs_shape.items()}
        else:
            obs = np.asarray(obs).reshape((n, *self.obs_shape))
            next_obs = np.asarray(next_obs).reshape((n, *self.obs_shape))
        action = np.asarray(action).reshape((n, self.action_dim))
        done = np.asarray(done, np.bool_).reshape(n)
        if self.handle_timeout_termination:
            timeout = np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos], np.bool_)
        else:
            timeout = np.zeros(n, np.bool_)
        reward = np.asarray(reward, np.float32).reshape(n)
        if not getattr(self, "_episodic", True):  # independent rows: no episode to end or continue
            self.buffer.extend(obs=obs, next_obs=next_obs, action=action, reward=reward, terminated=done & ~timeout,
                               truncated=done & timeout)
            self.pos = self.buffer.next_index % self.buffer_size
            self.full = len(self.buffer) == self.buffer_size
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
        self.buffer.extend(obs=obs, next_obs=next_obs, action=action, reward=reward, terminated=done & ~timeout,
                           truncated=done & timeout, stream=self._streams)
        if self._dict_obs:
            for k, value in next_obs.items():
                self._next_obs[k][...] = value
        else:
            self._next_obs[...] = next_obs
        self._open = ~done
        self.pos = self.buffer.next_index % self.buffer_size
        self.full = len(self.buffer) == self.buffer_size

    def sample(self, batch_size: int, env: Any = None, beta: float | None = None
               ) -> PerxReplayBufferSamples | PerxDictReplayBufferSamples:
        batch = self.buffer.sample(batch_size, beta=self.beta if beta is None else float(beta))
        obs = self._normalize_obs(batch["obs"], env)
        next_obs = self._normalize_obs(batch["next_obs"], env)
        if self.n_steps == 1:
            rewards, discounts = batch["reward"].reshape(-1, 1), None
        else:
            rewards = batch["return"].astype(np.float32).reshape(-1, 1)
            discounts = self.to_torch(batch["discount"].astype(np.float32).reshape(-1, 1))
        rewards = self._normalize_reward(rewards, env)  # VecNormalize only scales: a sum scales alike
        weights = self.to_torch(batch.weights.astype(np.float32).reshape(-1, 1))
        dones = self.to_torch(batch["terminated"].astype(np.float32).reshape(-1, 1))
        if self._dict_obs:
            return PerxDictReplayBufferSamples({k: self.to_torch(v) for k, v in obs.items()},
                                               self.to_torch(batch["action"]),
                                               {k: self.to_torch(v) for k, v in next_obs.items()}, dones,
                                               self.to_torch(rewards), discounts, weights, batch.indices)
        data = (obs, batch["action"], next_obs)
        return PerxReplayBufferSamples(*map(self.to_torch, data), dones, self.to_torch(rewards), discounts, weights,
                                       batch.indices)

    def update_priorities(self, indices: np.ndarray, td_errors: Any) -> int:
        """Write |delta| (any sign; a tensor with grad on any device is fine) for sampled indices."""
        return self.buffer.update_priorities(indices, td_errors)


#: beta annealed from start to end over training: 000 Sec. 3.4 / Table 3 (rank-based starts at 0.5).
_BETA = {"per": (0.4, 1.0), "rank": (0.5, 1.0)}


class _PerxAlgorithm:
    """The replay configuration shared by the perx versions of SB3's algorithms."""

    _lap_alpha = 0.4

    def _configure(self, replay: Any, alpha: float | None, beta: tuple[float, float] | None, kappa: float,
                   kwargs: dict) -> dict:
        if kwargs.get("replay_buffer_class") not in (None, PerxReplayBuffer):
            raise ValueError("replay_buffer_class: the perx algorithms use perx.sb3.PerxReplayBuffer")
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
        kwargs["replay_buffer_class"] = PerxReplayBuffer
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
        if self.replay == "lap":
            return ptorch.huber(current - target, kappa=self.kappa)
        if self.replay == "pal":
            return ptorch.pal(current - target, alpha=self.replay_alpha, kappa=self.kappa)
        elementwise = default(current, target, reduction="none")
        if self.replay == "uniform":
            return elementwise.mean()
        return (weights * elementwise).mean()

    def _write_priorities(self, replay_data: PerxReplayBufferSamples | PerxDictReplayBufferSamples, td: th.Tensor
                          ) -> None:
        if self.replay not in ("uniform", "pal"):
            self.replay_buffer.update_priorities(replay_data.indices, td.detach().reshape(-1))


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
            self._write_priorities(replay_data, current - target)
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
            td = th.max(th.cat([(q - target).abs() for q in current], dim=1), dim=1).values  # 004 D.1
            self._write_priorities(replay_data, td)
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
            td = th.max(th.cat([(q - target).abs() for q in current], dim=1), dim=1).values
            self._write_priorities(replay_data, td)
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
