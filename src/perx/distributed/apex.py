"""Ape-X Double DQN (Horgan et al. 2018) on Ray: actors with local priorities, a sharded replay, one learner.

The pieces, each a Ray Core actor or the driver process:

* N **actors** (:class:`ApexActor`) step their own environment with epsilon_i = 0.4^(1 + 7 i / (N - 1)),
  build n-step transitions, compute their initial priorities |delta| with their copy of the network, and
  push them to the replay's shards in batches of ``push_size`` (one call per batch, never per step; push j
  of actor i to shard (i + j N) mod K, :func:`push_shard`).
* K **shards** (:class:`perx.distributed.ShardedReplay`): ordinary perx buffers, sampled as one
  (the union's exact P(i) and IS weights), checkpointed, restarted by Ray when they die.
* The **learner** (:func:`train`, in the driver): keeps ``prefetch`` sample calls in flight, applies
  Double-DQN updates with IS-weighted Huber loss (000 Algorithm 1 lines 9-14), sends the new priorities
  without waiting, copies the target network every ``target_update`` updates and broadcasts its
  parameters to the actors every ``broadcast_every`` updates.

``replay_ratio`` (sampled transitions per environment step) keeps the learner and the actors in step on
any machine, so a run does not depend on how fast each side happens to be; 0 lets both run freely, as
Ape-X does on a cluster. Evaluation, metrics.csv and config.json follow the other studies.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import numbers
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
import torch.nn.functional as F

import perx
from perx.agents.dqn import network_for
from perx.agents.envs import make_env, network_input
from perx.agents.runner import METRICS, progress_bar, versions, write_metrics
from perx.distributed.rate import RateLimiter
from perx.distributed.replay import MAX_SHARDS, ShardedReplay, _node_id, _restarted
from perx.validation import check_positive_int

#: variant -> (sampler factory, Huber threshold kappa, initial beta); 000 Sec. 3-4 and 004 Sec. 5
VARIANTS = {
    "uniform": (lambda c: perx.Uniform(), 1.0, 1.0),
    # buffer-wide IS normalisation over the union of the shards (docs/distributed.md), as before the samplers'
    # default became the batch's maximum
    "per": (lambda c: perx.Proportional(alpha=c.alpha, eps=1e-6, normalize="buffer"), 1.0, None),
    "lap": (lambda c: perx.LAP(alpha=c.alpha, kappa=c.kappa), None, 1.0),
}


@dataclass(frozen=True)
class ApexConfig:
    """Hyperparameters of one Ape-X Double DQN run (defaults: CartPole on a laptop)."""

    env_id: str = "CartPole-v1"
    """Gymnasium id (``MinAtar/...`` for MinAtar, which uses the MinAtar network)."""
    variant: str = "per"
    """uniform, per (proportional, IS weights) or lap (LAP, Huber with kappa)."""
    seed: int = 0
    """Seeds networks, actors' environments and exploration, and the replay's sampling."""
    total_steps: int = 20_000
    """Environment steps summed over all actors."""
    num_actors: int = 2
    """N actors, each with its own environment and epsilon_i = eps_base^(1 + eps_alpha i / (N - 1))."""
    num_shards: int = 2
    """K replay shards (Ray actors)."""
    capacity: int = 100_000
    """Transitions kept over all shards."""
    alpha: float = 0.6
    """Priority exponent (Ape-X 0.6)."""
    beta0: float = 0.4
    """Initial IS exponent, annealed linearly to 1 over ``total_steps`` (Ape-X 0.4, per only)."""
    kappa: float = 0.01
    """LAP's Huber threshold and priority floor (004 D.2)."""
    n_step: int = 3
    """n-step returns (Ape-X: 3)."""
    gamma: float = 0.99
    batch_size: int = 64
    learning_rate: float = 1e-3
    """Adam step size."""
    target_update: int = 500
    """Learner updates between target-network copies (Ape-X: 2500)."""
    broadcast_every: int = 25
    """Learner updates between parameter broadcasts to the actors (Ape-X: actors fetch every 400 frames)."""
    push_size: int = 256
    """Transitions an actor sends per call to a shard."""
    collect_steps: int = 256
    """Environment steps an actor takes per ``collect`` call (between the learner's checks on it)."""
    prefetch: int = 2
    """Sample calls the learner keeps in flight."""
    replay_ratio: float = 32.0
    """Sampled transitions per environment step the learner aims for (0: no throttling). CartPole learns
    erratically at 8 and steadily at 32 (one update of 64 every 2 steps), measured in docs/distributed.md."""
    single_shard_batches: bool = False
    """Draw each batch from one shard chosen by its share of the mass: one sample and one update call per
    batch instead of one per shard (exact P(i) per draw; see :class:`ShardedReplay`)."""
    rate_limit: float = 0.0
    """> 0: pace with the replay's samples-per-insert rate limiter instead (:class:`RateLimiter` at
    ``replay_ratio`` samples per inserted transition after ``learning_starts``, this error buffer in sampled
    transitions; at least (batch_size + replay_ratio x collect_steps) / 2): the learner waits for data and
    no actor starts a collect the band cannot take. 0: the learner's own pacing (below)."""
    learning_starts: int = 1_000
    """Transitions stored before learning starts."""
    eps_base: float = 0.4
    eps_alpha: float = 7.0
    eval_every: int = 2_000
    """Environment steps between evaluations; each runs in an evaluation actor, off the learner's path."""
    eval_episodes: int = 10
    eval_epsilon: float = 0.001
    eval_max_steps: int | None = None
    """Cut evaluation episodes here; None: the environment's own time limit (CartPole-v1: 500), and
    ``DEFAULT_EVAL_LIMIT`` steps for one without a limit (MinAtar)."""
    eval_cpus: float = 0.0
    """CPUs Ray reserves for the evaluation actor."""
    actor_restart_timeout: float = 300.0
    """Seconds an actor may stay unreachable after it died (Ray restarting it) before the run gives up."""
    max_episode_steps: int | None = None
    """Time limit of the actors' environments (None: the environment's own)."""
    checkpoint_every: int = 0
    """A shard saves itself after this many added transitions (0: only at the learner's checkpoints, if any;
    with neither, a restarted shard is empty)."""
    learner_checkpoint_every: int = 2_000
    """Learner updates between checkpoints of the whole run (with an output folder): every shard saves its
    buffer, then the learner its networks, optimiser, counters and metrics (``learner.pt``); ``train(...,
    resume=True)`` (``perx apex --resume``) continues from there. 0: never."""
    actor_cpus: float = 0.5
    shard_cpus: float = 0.0
    shard_checkpoints: str | None = None
    """Where shards checkpoint: a local folder, or an fsspec URL every node can reach (``s3://bucket/run``;
    needed on a cluster without a shared file system, where a shard restarted on another node would not find a
    local file). None: ``<out>/shards``."""
    spread: bool = True
    """Place the shards, and the actors, with Ray's SPREAD strategy (over the nodes); False: Ray's default
    (which packs a node before using the next). The same on one node."""
    shard_memory: int | None = None
    """Bytes of Ray's ``memory`` resource each shard reserves; None: estimated from one transition's size x
    the shard's capacity (plus its priority trees); 0: none."""
    local_push: bool = True
    """Actors push to the shards on their own node when there are any (round-robin among those), else to all
    shards round-robin; sampling stays exact over the union either way (see docs/distributed.md)."""
    hidden: int = 128
    device: str = "cpu"
    extra: dict = field(default_factory=dict)
    """Free-form notes saved with the config."""

    def __post_init__(self) -> None:
        # every field, so that a value no run can use fails here, naming it, and not minutes into a run (or
        # never: learning_starts=0 with replay_ratio=0 sampled the empty replay, a NaN replay_ratio stopped
        # the pacing)
        if self.variant not in VARIANTS:
            raise ValueError(f"variant: one of {sorted(VARIANTS)}, got {self.variant!r}")
        for name in ("env_id", "device"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}: a str, got {getattr(self, name)!r}")
        for name in ("total_steps", "num_actors", "num_shards", "capacity", "n_step", "batch_size", "target_update",
                     "broadcast_every", "push_size", "collect_steps", "prefetch", "learning_starts", "eval_every",
                     "eval_episodes", "hidden"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise ValueError(f"{name}: an int >= 1, got {v!r}")
        for name in ("seed", "checkpoint_every", "learner_checkpoint_every"):
            v = getattr(self, name)
            if type(v) is not int or v < 0:
                raise ValueError(f"{name}: an int >= 0, got {v!r}")
        for name in ("max_episode_steps", "eval_max_steps"):
            v = getattr(self, name)
            if v is not None and (type(v) is not int or v < 1):
                raise ValueError(f"{name}: None or an int >= 1, got {v!r}")
        if self.shard_memory is not None and (type(self.shard_memory) is not int or self.shard_memory < 0):
            raise ValueError(f"shard_memory: None or an int >= 0 (bytes), got {self.shard_memory!r}")
        if self.shard_checkpoints is not None and (not isinstance(self.shard_checkpoints, str)
                                                   or not self.shard_checkpoints):
            raise ValueError(f"shard_checkpoints: None, a folder or a URL, got {self.shard_checkpoints!r}")
        for name in ("spread", "local_push"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: a bool, got {getattr(self, name)!r}")
        for names, ok, what in ((("beta0", "gamma", "eps_base", "eval_epsilon"), lambda v: 0 <= v <= 1, "in [0, 1]"),
                                (("kappa", "learning_rate", "actor_restart_timeout"), lambda v: v > 0, "> 0"),
                                (("alpha", "replay_ratio", "eps_alpha", "actor_cpus", "shard_cpus", "eval_cpus",
                                  "rate_limit"),
                                 lambda v: v >= 0, ">= 0")):
            for name in names:
                v = getattr(self, name)
                if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not ok(v):
                    raise ValueError(f"{name}: a finite number {what}, got {v!r}")
        if self.num_shards > MAX_SHARDS:
            raise ValueError(f"num_shards: at most {MAX_SHARDS}, got {self.num_shards!r}")
        if self.capacity < self.num_shards:
            raise ValueError(f"capacity: at least num_shards ({self.num_shards}), got {self.capacity!r}")
        if not isinstance(self.single_shard_batches, bool):
            raise ValueError(f"single_shard_batches: a bool, got {self.single_shard_batches!r}")
        if not isinstance(self.extra, dict):
            raise ValueError(f"extra: a dict, got {self.extra!r}")
        if self.rate_limit > 0 and not self.replay_ratio > 0:
            raise ValueError(f"rate_limit: needs replay_ratio > 0 (the samples per insert it holds), got "
                             f"replay_ratio={self.replay_ratio!r}")
        if self.rate_limit > 0 and 2 * self.rate_limit < self.batch_size + self.replay_ratio * self.collect_steps:
            raise ValueError(f"rate_limit: at least (batch_size + replay_ratio x collect_steps) / 2 = "
                             f"{(self.batch_size + self.replay_ratio * self.collect_steps) / 2:g}, got "
                             f"{self.rate_limit!r}; a narrower band could hold the learner and the actors at once")
        if self.learning_starts > self.capacity:
            raise ValueError(f"learning_starts: at most capacity ({self.capacity}), got {self.learning_starts!r}; "
                             f"learning would never start")


def actor_epsilon(i: int, n: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X's exploration schedule: epsilon_i = base^(1 + alpha i / (N - 1)) (Horgan et al. 2018, Sec. 4.1)."""
    return base if n == 1 else base ** (1.0 + alpha * i / (n - 1))


def push_shard(actor: int, push: int, num_actors: int, num_shards: int) -> int:
    """The shard of actor ``actor``'s ``push``-th push: (actor + push * num_actors) mod num_shards.

    Round j (every actor's j-th push) covers the num_actors shards after round j - 1's, so the actors
    together cycle through all the shards and, pushing at the same rate, give each the same share, even
    with fewer actors than shards (a fixed shard per actor would leave shards empty). With num_actors a
    multiple of num_shards it is actor mod num_shards at every push: each actor keeps one shard.
    """
    return (actor + push * num_actors) % num_shards


def build_network(cfg: ApexConfig, obs_shape: tuple[int, ...], actions: int) -> torch.nn.Module:
    torch.manual_seed(cfg.seed)
    return network_for(cfg.env_id, obs_shape, actions)()


def td_errors(q: torch.nn.Module, target: torch.nn.Module, batch: dict[str, np.ndarray], env_id: str,
              device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(Q(s, a) [B], Double-DQN target y [B]): y = G + discount * Q_target(s', argmax_a Q(s', a))."""
    obs = torch.as_tensor(network_input(batch["obs"], env_id), device=device)
    next_obs = torch.as_tensor(network_input(batch["next_obs"], env_id), device=device)
    actions = torch.as_tensor(batch["action"], dtype=torch.long, device=device)
    with torch.no_grad():
        best = q(next_obs).argmax(-1, keepdim=True)
        next_value = target(next_obs).gather(-1, best).squeeze(-1)
        y = (torch.as_tensor(batch["reward"], dtype=torch.float32, device=device)
             + torch.as_tensor(batch["discount"], dtype=torch.float32, device=device) * next_value)
    q_sa = q(obs).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    return q_sa, y


class NStep:
    """n-step transitions of one environment, (obs, action, G, discount, next_obs), from the core's n-step windows.

    G = sum_{j<k} gamma^j r_j over the window's k <= n steps; discount = gamma^k, or 0 when the episode terminated
    inside the window (no bootstrap); next_obs is the observation after the window's last step, so a truncated
    episode bootstraps from its last observation (Gymnasium's terminated/truncated split). Windows are shorter at
    an episode's end. A step's transition is ready once its window is complete: n steps taken, or the episode
    ended. :meth:`add` takes a step, :meth:`take` returns the ready transitions (oldest first), :meth:`step` both.

    The windows are computed by ``perx.Episodes`` (the compiled walk that gives a replay buffer its n-step
    ``return`` and ``discount``), not here: the steps' rewards and ends go into a small actor-local
    ``perx.ReplayBuffer(..., episodes=perx.Episodes(n, gamma))``, written with one ``extend`` and read with one
    ``get`` per :meth:`take`. Simplest: the core's n-step logic is used as it is, with nothing added to the core (a
    public window helper in ``perx.episodes`` would skip the buffer's linking of steps, but be a second entry point
    to maintain). Cheap enough: a step is a deque append, and the buffer works once per push, a small share of an
    actor's step, which runs its network's forward pass; the first :meth:`take` of a process loads the compiled
    kernel, once. Observations and actions stay in the deque, as the objects given, and never enter the buffer, so
    any observation works (MinAtar's bool grids, dicts) and nothing is copied twice. The field the buffer
    bootstraps from (``next_step``, as ``Episodes(obs="step")`` names it) holds each step's own id: the buffer
    returns it for the window's last step, whose next observation is the one to bootstrap from.

    Args:
        n: n of the n-step return (>= 1).
        gamma: discount factor in [0, 1].
        capacity: the most steps held before :meth:`take` (ready, or in open windows); at least n (the default).
    """

    def __init__(self, n: int, gamma: float, capacity: int | None = None) -> None:
        episodes = perx.Episodes(n, gamma, obs="step", check=False)  # validates n and gamma
        self.n, self.gamma = episodes.n_step, episodes.gamma
        self.capacity = self.n if capacity is None else check_positive_int(capacity, "capacity")
        if self.capacity < self.n:
            raise ValueError(f"capacity: at least n = {self.n}, to hold a full window, got {capacity!r}")
        self._buffer = perx.ReplayBuffer(self.capacity, episodes=episodes, spec={
            "reward": ((), np.float64), "terminated": ((), np.bool_), "truncated": ((), np.bool_),
            "next_step": ((), np.int64)})
        #: The steps not taken yet, oldest first: (obs, action, reward, next_obs, terminated, truncated).
        self.window: deque = deque()
        self._first = 0  # the id of window[0] (ids count the steps added, from 0)
        self._stored = 0  # the steps below this id are in the buffer
        self._ready = 0  # the steps below this id have complete windows

    @property
    def ready(self) -> int:
        """How many transitions :meth:`take` would return now."""
        return self._ready - self._first

    def add(self, obs: Any, action: Any, reward: float, next_obs: Any, terminated: bool, truncated: bool) -> None:
        """Take one environment step (RuntimeError if ``capacity`` steps already wait for :meth:`take`)."""
        window = self.window
        if len(window) == self.capacity:
            raise RuntimeError(f"NStep: {self.capacity} steps wait to be taken; call take() before adding more")
        window.append((obs, action, reward, next_obs, terminated, truncated))  # converted in take, per push
        end = self._first + len(window)  # one past the newest id
        if terminated or truncated:  # every window of the episode is complete
            self._ready = end
        elif end - self.n >= self._ready:  # the window that now holds n steps
            self._ready = end - self.n + 1

    def take(self) -> list[tuple]:
        """The ready transitions not taken yet, oldest first: [(obs, action, G, discount, next_obs), ...]."""
        count = self.ready
        if count == 0:
            return []
        steps = list(self.window)
        new = steps[self._stored - self._first:]
        if new:
            _, _, reward, _, terminated, truncated = zip(*new, strict=True)
            start = self._stored
            self._buffer.extend(reward=np.array(reward, np.float64), terminated=np.array(terminated, np.bool_),
                                truncated=np.array(truncated, np.bool_),
                                next_step=np.arange(start, start + len(new), dtype=np.int64))
            self._stored += len(new)
        windows = self._buffer.get(np.arange(self._first, self._ready, dtype=np.int64))
        first = self._first
        out = [(obs, action, g, discount, steps[last - first][3])
               for (obs, action, *_), g, discount, last in zip(
                   steps[:count], windows["return"].tolist(), windows["discount"].tolist(),
                   windows["next_step"].tolist(), strict=True)]
        for _ in range(count):
            self.window.popleft()
        self._first = self._ready
        return out

    def step(self, obs: Any, action: Any, reward: float, next_obs: Any, terminated: bool,
             truncated: bool) -> list[tuple]:
        """:meth:`add` one step, then :meth:`take`: the transitions this step completed."""
        self.add(obs, action, reward, next_obs, terminated, truncated)
        return self.take()


class ApexActor:
    """One Ape-X actor: its environment, epsilon, network copy and n-step builder (a Ray actor)."""

    def __init__(self, cfg: ApexConfig, index: int, shards: list[Any],
                 weights: dict[str, np.ndarray] | None = None) -> None:
        torch.set_num_threads(1)
        self.cfg, self.index, self.shards = cfg, index, list(shards)
        self.epsilon = actor_epsilon(index, cfg.num_actors, cfg.eps_base, cfg.eps_alpha)
        self.env = make_env(cfg.env_id, max_episode_steps=cfg.max_episode_steps)
        self.actions = int(self.env.action_space.n)
        restarted = self.restarted = _restarted()
        salt = int(time.time_ns() % 1_000_003) if restarted else 0  # a restarted actor explores afresh
        self.rng = np.random.default_rng([cfg.seed, index, salt])
        self.obs, _ = self.env.reset(seed=cfg.seed * 10_000 + index + salt)
        self.net = build_network(cfg, self.obs.shape, self.actions)
        if weights is not None:  # the learner sends them right after creation (and after a restart)
            self.set_weights(weights)
        # holds every step not pushed yet: fewer than push_size ready windows, n - 1 open ones, and the new step
        self.nstep = NStep(cfg.n_step, cfg.gamma, capacity=cfg.push_size + cfg.n_step)
        self.pending = None
        self.episode_return = 0.0
        self.pushed = 0
        self.pushes = 0
        #: this actor's Ray node, and the shards on it (None: push to every shard, :func:`push_shard`)
        self.node = _node_id()
        self.local: list[int] | None = None

    def set_weights(self, weights: dict[str, np.ndarray], shard_nodes: list[str | None] | None = None) -> None:
        """Load the learner's parameters; ``shard_nodes`` (each shard's Ray node, as the learner last saw it)
        tells which shards are on this actor's node."""
        self.net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
        if shard_nodes is not None:
            local = [k for k, node in enumerate(shard_nodes) if node is not None and node == self.node]
            # all local (one node) or none: the cluster-wide round-robin, which balances the shards
            self.local = local if self.cfg.local_push and 0 < len(local) < len(shard_nodes) else None

    def _act(self) -> int:
        if self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.actions))
        with torch.no_grad():
            x = torch.as_tensor(network_input(self.obs[None], self.cfg.env_id))
            return int(self.net(x).argmax(-1)[0])

    def collect(self, steps: int) -> dict[str, Any]:
        """Take ``steps`` environment steps, pushing full batches to the shard; returns what happened."""
        returns = []
        for _ in range(steps):
            action = self._act()
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            self.nstep.add(self.obs, action, reward, next_obs, terminated, truncated)
            self.episode_return += float(reward)
            if terminated or truncated:
                returns.append(self.episode_return)
                self.episode_return = 0.0
                next_obs, _ = self.env.reset()
            self.obs = next_obs
            if self.nstep.ready >= self.cfg.push_size:
                self._push()
        restarted, self.restarted = self.restarted, False
        return {"actor": self.index, "steps": steps, "returns": returns, "pushed": self.pushed, "node": self.node,
                "restarted": restarted}

    def _push(self) -> None:
        rows = self.nstep.take()
        obs, action, g, discount, next_obs = zip(*rows, strict=True)
        data = {"obs": np.stack(obs), "action": np.asarray(action, np.int64),
                "reward": np.asarray(g, np.float32), "discount": np.asarray(discount, np.float32),
                "next_obs": np.stack(next_obs)}
        td = None
        if self.cfg.variant != "uniform":  # Ape-X: initial priorities from the actor's own network
            q_sa, y = td_errors(self.net, self.net, data, self.cfg.env_id)
            td = (q_sa - y).detach().numpy().astype(np.float64)
        if self.pending is not None:
            ray.get(self.pending)  # back-pressure: one push in flight per actor
        if self.local is not None:  # node-local: this actor cycles through the shards on its node
            shard = self.shards[self.local[(self.index + self.pushes) % len(self.local)]]
        else:
            shard = self.shards[push_shard(self.index, self.pushes, self.cfg.num_actors, len(self.shards))]
        self.pending = shard.add.remote(data, td)
        self.pushes += 1
        self.pushed += len(rows)


def _weights(net: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in net.state_dict().items()}


#: Evaluation episodes of an environment without a time limit of its own stop here (as ``perx dqn``'s).
DEFAULT_EVAL_LIMIT = 10_000


def eval_env(cfg: ApexConfig) -> Any:
    """The evaluation environment: ``eval_max_steps`` if set, else the environment's own time limit, else
    :data:`DEFAULT_EVAL_LIMIT`."""
    import gymnasium as gym

    env = make_env(cfg.env_id, max_episode_steps=cfg.eval_max_steps)
    if cfg.eval_max_steps is None and (env.spec is None or env.spec.max_episode_steps is None):
        env = gym.wrappers.TimeLimit(env, DEFAULT_EVAL_LIMIT)
    return env


def evaluate(cfg: ApexConfig, net: torch.nn.Module) -> float:
    """Mean return of ``eval_episodes`` episodes of the epsilon-greedy (``eval_epsilon``) policy, on an
    environment seeded with seed + 100 (the same start states at every evaluation), cut as :func:`eval_env`."""
    env = eval_env(cfg)
    rng = np.random.default_rng(cfg.seed + 200)
    totals = []
    obs, _ = env.reset(seed=cfg.seed + 100)
    total = 0.0
    while len(totals) < cfg.eval_episodes:
        if rng.random() < cfg.eval_epsilon:
            action = int(rng.integers(env.action_space.n))
        else:
            with torch.no_grad():
                x = torch.as_tensor(network_input(obs[None], cfg.env_id), device=cfg.device)
                action = int(net(x).argmax(-1)[0])
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        if terminated or truncated:
            totals.append(total)
            total = 0.0
            obs, _ = env.reset()
    env.close()
    return float(np.mean(totals))


class ApexEvaluator:
    """Evaluates the learner's weights away from the learner (a Ray actor): the learner sends weights and
    collects the return when it is ready, never waiting for it until the run's end."""

    def __init__(self, cfg: ApexConfig, obs_shape: tuple[int, ...], actions: int) -> None:
        torch.set_num_threads(1)
        self.cfg = dataclasses.replace(cfg, device="cpu")
        self.net = build_network(self.cfg, obs_shape, actions)

    def evaluate(self, weights: dict[str, np.ndarray]) -> tuple[float, float]:
        """(mean return, seconds taken) of :func:`evaluate` with ``weights``."""
        t0 = time.perf_counter()
        self.net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
        return evaluate(self.cfg, self.net), time.perf_counter() - t0


EXTRA_METRICS = ("updates", "sampled", "ingested", "stale_skipped", "shard_restarts", "actor_restarts",
                 "learner_updates_per_second", "eval_lag_steps", "eval_seconds")

#: Seconds between a failed call to a dead actor and the next try (Ray is restarting it meanwhile).
RETRY_SECONDS = 0.5


def train(cfg: ApexConfig, out: str | os.PathLike | None = None, *, progress: bool = True,
          log=print, kill_shard_at: int | None = None, kill_actor_at: int | None = None,
          resume: bool = False) -> list[dict[str, Any]]:
    """Run Ape-X Double DQN on the Ray cluster this process is connected to (``ray.init`` first).

    Writes ``out/metrics.csv`` (as evaluations come back) and ``out/config.json``; returns the metric rows.
    Evaluations run in an evaluation actor: a row holds the counters at the step its weights were taken and
    the return when it arrives (``eval_lag_steps`` later); the learner waits only for the last one.

    ``kill_shard_at`` / ``kill_actor_at``: fault drills, killing shard 0 / actor 0 once this many environment
    steps are done. Ray restarts the shard from its checkpoint and the actor afresh, and the run carries on;
    the metrics count shard_restarts and actor_restarts, and config.json's ``drills`` and ``restarts`` say
    what happened and what was lost. With checkpoints on, the shard drill waits for shard 0's first
    checkpoint (and says so), so that the drill exercises a restore rather than an empty restart.
    An actor that died is counted once, however many calls fail while Ray restarts it; the run gives up on
    it after ``actor_restart_timeout`` seconds unreachable.

    Every ``learner_checkpoint_every`` updates the run checkpoints (shards, then ``out/learner.pt``).
    ``resume=True`` continues a run whose driver died from its last checkpoint: networks, optimiser,
    counters, metrics and shards as they were then; the actors start afresh (their unfinished n-step windows
    and anything not yet pushed are lost). config.json's ``resumes`` records each resume: the step it went
    back to and, per shard, the next id the learner had seen against the one restored. A config that differs
    from the checkpoint's in anything but ``total_steps`` is refused.
    """
    if not ray.is_initialized():
        raise RuntimeError("apex.train: call ray.init(...) first")
    torch.set_num_threads(1)
    out = None if out is None else Path(out)
    probe = make_env(cfg.env_id)
    obs0, _ = probe.reset(seed=cfg.seed)
    n_actions = int(probe.action_space.n)
    probe.close()
    q = build_network(cfg, obs0.shape, n_actions).to(cfg.device)
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=cfg.learning_rate)
    make_sampler, huber_kappa, beta_fixed = VARIANTS[cfg.variant]
    kappa = cfg.kappa if huber_kappa is None else huber_kappa
    saved = _load_learner(cfg, out) if resume else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if not resume and (out / "learner.pt").exists():
            (out / "learner.pt").unlink()  # a fresh run: an old checkpoint must not be resumed later by mistake
    checkpoint_dir = None
    if cfg.checkpoint_every or cfg.learner_checkpoint_every:
        checkpoint_dir = cfg.shard_checkpoints if cfg.shard_checkpoints is not None else (
            None if out is None else out / "shards")
    strategy = "SPREAD" if cfg.spread else "DEFAULT"
    shard_capacity = -(-cfg.capacity // cfg.num_shards)
    # obs and next_obs, action, return, discount, and the sum and min trees (2 x 8 bytes per slot each)
    memory = cfg.shard_memory if cfg.shard_memory is not None else shard_capacity * (2 * obs0.nbytes + 16 + 32)
    limiter = RateLimiter(cfg.replay_ratio, cfg.learning_starts, cfg.rate_limit) if cfg.rate_limit > 0 else None
    replay = ShardedReplay(cfg.num_shards, cfg.capacity, make_sampler(cfg), seed=cfg.seed,
                           checkpoint_dir=checkpoint_dir, checkpoint_every=cfg.checkpoint_every,
                           num_cpus=cfg.shard_cpus, resume=resume, rate_limiter=limiter,
                           sample_timeout=cfg.actor_restart_timeout, single_shard_batches=cfg.single_shard_batches,
                           scheduling_strategy=strategy, memory=memory)
    Actor = ray.remote(ApexActor).options(max_restarts=-1, num_cpus=cfg.actor_cpus, scheduling_strategy=strategy)
    # weights go by a call, not as constructor arguments: a restarted actor must not depend on an object
    # that may have left the store (ray-project/ray#53727); it gets the latest weights when it rejoins
    actors = [Actor.remote(cfg, i, replay.shards) for i in range(cfg.num_actors)]
    evaluator = ray.remote(ApexEvaluator).options(num_cpus=cfg.eval_cpus, max_restarts=-1, max_task_retries=-1
                                                  ).remote(cfg, tuple(obs0.shape), n_actions)
    idle: list[int] = []
    outage: list[dict[str, Any] | None] = [None] * cfg.num_actors  # actor i's current outage, if it is down
    retry_at = [0.0] * cfg.num_actors
    restarts: list[dict[str, Any]] = []  # one record per actor death seen
    actor_nodes: list[str | None] = [None] * cfg.num_actors  # each actor's Ray node, from its latest collect
    drills: dict[str, Any] = {}
    in_flight: deque = deque()
    evaluations: deque = deque()  # (reference, row waiting for its return), oldest first
    env_steps = updates = sampled = actor_restarts = 0
    episodes, recent, losses, rows = 0, deque(maxlen=20), [], []
    started = time.time()
    learn_started = None
    updates_before = 0  # updates done before this process started learning (a resumed run's)
    next_eval = cfg.eval_every
    next_look = 0.0
    killed_actor = False
    resumes: list[dict[str, Any]] = []
    if saved is not None:
        q.load_state_dict(saved["q"])
        target.load_state_dict(saved["target"])
        optimizer.load_state_dict(saved["optimizer"])
        c = saved["counters"]
        env_steps, updates, sampled, actor_restarts = c["env_steps"], c["updates"], c["sampled"], c["actor_restarts"]
        episodes, next_eval = c["episodes"], c["next_eval"]
        recent.extend(saved["recent"])
        rows, restarts, drills, resumes = saved["rows"], saved["restarts"], saved["drills"], saved["resumes"]
        killed_actor = "actor" in drills
        stats = replay.refresh()
        resumes.append({"step": env_steps, "updates": updates, "time": time.time(),
                        "shards": [{"shard": k, "seen_next_id": seen, "restored_next_id": st["next_id"]}
                                   for k, (seen, st) in enumerate(zip(saved["shard_next_ids"], stats, strict=True))]})
        replay.restarts.extend(saved["shard_restarts"])
        started -= c["elapsed"]
        if log:
            log(f"apex: resumed at step {env_steps:,} ({updates:,} updates); shards restored to "
                f"{[st['next_id'] for st in stats]} (next ids; the learner had seen {saved['shard_next_ids']})")
        if limiter is not None:
            limiter.sampled = sampled
    weights = ray.put(_weights(q))
    for a in actors:
        a.set_weights.remote(weights, replay.shard_nodes)
    running = {actors[i].collect.remote(cfg.collect_steps): i for i in range(cfg.num_actors)}
    bar = progress_bar(progress, cfg.total_steps, env_steps, f"apex {cfg.env_id} {cfg.variant}")

    def save_learner() -> None:
        """Checkpoint the run: every shard's buffer, then the learner (atomic rename), so a learner
        checkpoint never refers to shard files older than itself."""
        replay.flush()
        # what the learner has seen, read before the shards save: actors keep adding meanwhile, so a read
        # after the save could name transitions the shard files do not hold
        seen = [st["next_id"] for st in replay.refresh()]
        replay.checkpoint()
        state = {"config": dataclasses.asdict(cfg), "q": q.state_dict(), "target": target.state_dict(),
                 "optimizer": optimizer.state_dict(),
                 "counters": {"env_steps": env_steps, "updates": updates, "sampled": sampled,
                              "actor_restarts": actor_restarts, "episodes": episodes, "next_eval": next_eval,
                              "elapsed": time.time() - started},
                 "recent": list(recent), "rows": rows, "restarts": restarts, "drills": drills, "resumes": resumes,
                 "shard_restarts": replay.restarts, "shard_next_ids": seen}
        tmp = out / "learner.pt.tmp"
        torch.save(state, tmp)
        os.replace(tmp, out / "learner.pt")

    def submit_evaluation() -> None:
        elapsed = time.time() - started
        learn_time = time.time() - learn_started if learn_started else 0.0
        row = {"step": env_steps, "episodes": episodes, "eval_return": float("nan"),
               "train_return": float(np.mean(recent)) if recent else float("nan"),
               "loss": float(np.mean(losses)) if losses else float("nan"),
               "steps_per_second": env_steps / max(elapsed, 1e-9), "runs_in_process": 1,
               "updates": updates, "sampled": sampled, "ingested": len(replay),
               "stale_skipped": replay.skipped, "shard_restarts": len(replay.restarts),
               "actor_restarts": actor_restarts,
               "learner_updates_per_second": (updates - updates_before) / max(learn_time, 1e-9)}
        losses.clear()
        evaluations.append((evaluator.evaluate.remote(_weights(q)), row))

    def collect_evaluations(wait: bool) -> None:
        while evaluations:
            ref, row = evaluations[0]
            if not wait and not ray.wait([ref], timeout=0)[0]:
                return
            evaluations.popleft()
            row["eval_return"], row["eval_seconds"] = ray.get(ref)
            row["eval_lag_steps"] = env_steps - row["step"]
            rows.append(row)
            if log:
                log(f"apex {cfg.env_id} {cfg.variant} step {row['step']:,}: eval {row['eval_return']:.1f} "
                    f"(updates {row['updates']:,})")
            if out is not None:
                _write(out, cfg, rows, replay, restarts, drills, resumes, actor_nodes)

    def shard_drill() -> None:
        """Kill shard 0 once the drill's step has come, after its first checkpoint when it makes any."""
        nonlocal next_look
        if kill_shard_at is None or "shard" in drills or env_steps < kill_shard_at:
            return
        stats = None
        if checkpoint_dir is not None:
            if time.monotonic() < next_look:
                return
            next_look = time.monotonic() + RETRY_SECONDS
            stats = replay.refresh()[0]
            if stats["checkpoints"] < 1:
                if "shard waiting" not in drills and log:
                    every = (f"every {cfg.checkpoint_every:,} of its transitions" if cfg.checkpoint_every else
                             f"at the learner's checkpoints, every {cfg.learner_checkpoint_every:,} updates")
                    log(f"apex drill: step {env_steps:,} reached; waiting for shard 0's first checkpoint ({every}) "
                        f"before killing it")
                drills["shard waiting"] = True
                return
        ray.kill(replay.shards[0], no_restart=False)
        drills["shard"] = {"requested_at": kill_shard_at, "killed_at": env_steps,
                           "waited_for_checkpoint": bool(drills.pop("shard waiting", False)),
                           "checkpoints_before": None if stats is None else stats["checkpoints"],
                           "next_id_before": None if stats is None else stats["next_id"]}
        if log:
            log(f"apex drill: killed shard 0 at step {env_steps:,}")

    try:
        while env_steps < cfg.total_steps:
            learning = len(replay) >= cfg.learning_starts
            behind = cfg.replay_ratio > 0 and sampled >= cfg.replay_ratio * env_steps
            if limiter is not None:  # the replay's rate limiter decides (by the latest shard replies)
                want_learn = bool(in_flight) or replay.can_sample(cfg.batch_size)  # in flight: charged
            else:
                want_learn = learning and not behind
            # harvest the actors (block for one when there is nothing to learn from yet)
            if running:
                waiting_to_retry = any(t > time.monotonic() for t in retry_at)
                ready, _ = ray.wait(list(running), num_returns=len(running) if want_learn else 1,
                                    timeout=0 if want_learn else (RETRY_SECONDS if waiting_to_retry else None))
            else:  # every actor is down, waiting to be tried again
                ready = []
                if not want_learn:
                    time.sleep(RETRY_SECONDS / 10)
            for ref in ready:
                i = running.pop(ref)
                now = time.monotonic()
                try:
                    res = ray.get(ref)
                except ray.exceptions.RayActorError as err:
                    if getattr(err, "actor_init_failed", False):
                        raise RuntimeError(f"apex: actor {i} cannot run (its constructor failed): {err}") from err
                    if outage[i] is None:  # a new death: one restart, however many calls fail during it
                        outage[i] = {"actor": i, "step": env_steps, "time": time.time(), "since": now,
                                     "failed_calls": 0}
                        restarts.append(outage[i])
                        actor_restarts += 1
                    down = outage[i]
                    down["failed_calls"] += 1
                    if now - down["since"] > cfg.actor_restart_timeout:
                        raise RuntimeError(f"apex: actor {i} has been unreachable for {now - down['since']:.0f} s "
                                           f"since it died (actor_restart_timeout={cfg.actor_restart_timeout:g} s): "
                                           f"{err}") from err
                    retry_at[i] = now + RETRY_SECONDS  # Ray is restarting it: try again shortly
                    # calls on one actor run in order: the retried collect will run with the current weights
                    actors[i].set_weights.remote(ray.put(_weights(q)), replay.shard_nodes)
                    idle.append(i)
                    continue
                if outage[i] is not None:  # back after an outage: it gets the latest weights
                    down = outage[i]
                    down["down_seconds"] = now - down.pop("since")
                    outage[i] = None
                    actors[i].set_weights.remote(ray.put(_weights(q)), replay.shard_nodes)
                elif res["restarted"]:  # it died while idle and was restarted before this collect
                    actor_restarts += 1
                    restarts.append({"actor": i, "step": env_steps, "time": time.time(), "while_idle": True})
                    actors[i].set_weights.remote(ray.put(_weights(q)), replay.shard_nodes)
                env_steps += res["steps"]
                actor_nodes[i] = res["node"]
                episodes += len(res["returns"])
                recent.extend(res["returns"])
                if bar is not None:
                    bar.update(res["steps"])
                idle.append(i)
            # actors run ahead of the learner by at most one collect each
            ahead = limiter is None and cfg.replay_ratio > 0 and learning and (
                sampled + cfg.batch_size < cfg.replay_ratio * (env_steps - cfg.num_actors * cfg.collect_steps))
            if not ahead:
                now = time.monotonic()
                for i in [i for i in idle if retry_at[i] <= now]:
                    # with the rate limiter, a collect starts only if the band can take it and those running
                    # (each counted whole: conservative, as some of it may be in the shards already)
                    if limiter is not None and not replay.can_insert(cfg.collect_steps,
                                                                     pending=cfg.collect_steps * len(running)):
                        break
                    running[actors[i].collect.remote(cfg.collect_steps)] = i
                    idle.remove(i)
            if not learning or (limiter is not None and not want_learn):
                replay.refresh()
            shard_drill()
            if kill_actor_at is not None and not killed_actor and env_steps >= kill_actor_at:
                ray.kill(actors[0], no_restart=False)
                killed_actor = True
                drills["actor"] = {"requested_at": kill_actor_at, "killed_at": env_steps}
            if want_learn:
                if learn_started is None:
                    learn_started, updates_before = time.time(), updates
                beta = beta_fixed if beta_fixed is not None else cfg.beta0 + (1 - cfg.beta0) * min(
                    1.0, env_steps / cfg.total_steps)
                # fill the pipeline without blocking: with the rate limiter, only batches the band allows now
                while len(in_flight) < cfg.prefetch and replay.can_sample(cfg.batch_size):
                    in_flight.append(replay.sample_async(cfg.batch_size, beta))
                batch = in_flight.popleft().result()
                q_sa, y = td_errors(q, target, batch.data, cfg.env_id, cfg.device)
                delta = q_sa - y
                w = torch.as_tensor(batch.weights, dtype=torch.float32, device=cfg.device)
                loss = (w * F.huber_loss(q_sa, y, reduction="none", delta=kappa)).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                if cfg.variant != "uniform":
                    replay.update_priorities(batch.indices, delta.detach().cpu().numpy().astype(np.float64))
                updates += 1
                sampled += len(batch)
                if updates % cfg.target_update == 0:
                    target.load_state_dict(q.state_dict())
                if updates % cfg.broadcast_every == 0:
                    ref = ray.put(_weights(q))
                    for a in actors:
                        a.set_weights.remote(ref, replay.shard_nodes)  # queued behind the actor's running collect
                if out is not None and cfg.learner_checkpoint_every and updates % cfg.learner_checkpoint_every == 0:
                    save_learner()
            if env_steps >= next_eval:
                submit_evaluation()
                next_eval += cfg.eval_every
            if evaluations:
                collect_evaluations(wait=False)
        last = evaluations[-1][1]["step"] if evaluations else rows[-1]["step"] if rows else None
        if last != env_steps:
            submit_evaluation()
        if kill_shard_at is not None and "shard" not in drills:
            drills["shard"] = {"requested_at": kill_shard_at, "killed_at": None,
                               "why": "the run ended before shard 0 made its first checkpoint"
                               if drills.pop("shard waiting", False) else "the run ended before the step came"}
            if log:
                log(f"apex drill: shard 0 was not killed: {drills['shard']['why']}")
        collect_evaluations(wait=True)
    finally:
        if bar is not None:
            bar.close()
        for a in [*actors, evaluator]:
            ray.kill(a, no_restart=True)
        replay.flush()
        replay.close()
    return rows


def _load_learner(cfg: ApexConfig, out: Path | None) -> dict[str, Any]:
    """The learner checkpoint of ``out``, refused (ValueError) when missing or made with another config."""
    if out is None or not (out / "learner.pt").exists():
        raise ValueError(f"resume: no learner checkpoint (learner.pt) in {out}; a run checkpoints every "
                         f"learner_checkpoint_every updates when it has an output folder")
    saved = torch.load(out / "learner.pt", weights_only=False)
    # a field added since the checkpoint was made counts as its default
    now, then = dataclasses.asdict(cfg), {**dataclasses.asdict(ApexConfig()), **saved["config"]}
    differ = sorted(k for k in now.keys() | then.keys() if k != "total_steps" and now.get(k) != then.get(k))
    if differ:
        raise ValueError(f"resume: the checkpoint in {out} was made with other settings: "
                         + ", ".join(f"{k}={then.get(k)!r} (now {now.get(k)!r})" for k in differ))
    return saved


def _write(out: Path, cfg: ApexConfig, rows: list[dict], replay: ShardedReplay, restarts: list[dict],
           drills: dict, resumes: list[dict], actor_nodes: list[str | None]) -> None:
    write_metrics(out, rows, (*METRICS, *EXTRA_METRICS))
    v = versions()
    v["ray"] = ray.__version__
    payload = {"config": dataclasses.asdict(cfg), "versions": v,
               "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": cfg.device,
                           "ray_resources": {k: float(x) for k, x in ray.cluster_resources().items()
                                             if k in ("CPU", "GPU", "memory")},
                           "ray_nodes": len(ray.nodes())},
               # Ray node ids as last seen (a restarted shard or actor may have moved)
               "placement": {"shards": replay.shard_nodes, "actors": actor_nodes},
               "shard_restarts": replay.restarts, "actor_restarts": restarts,
               "drills": {k: v for k, v in drills.items() if k != "shard waiting"}, "resumes": resumes}
    (out / "config.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
