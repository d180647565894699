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
from perx.distributed.replay import MAX_SHARDS, ShardedReplay, _restarted
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
    learning_starts: int = 1_000
    """Transitions stored before learning starts."""
    eps_base: float = 0.4
    eps_alpha: float = 7.0
    eval_every: int = 2_000
    eval_episodes: int = 10
    eval_epsilon: float = 0.001
    eval_max_steps: int = 5_000
    max_episode_steps: int | None = None
    """Time limit of the actors' environments (None: the environment's own)."""
    checkpoint_every: int = 0
    """A shard saves itself after this many added transitions (0: never; then a restarted shard is empty)."""
    actor_cpus: float = 0.5
    shard_cpus: float = 0.0
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
                     "eval_episodes", "eval_max_steps", "hidden"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise ValueError(f"{name}: an int >= 1, got {v!r}")
        for name in ("seed", "checkpoint_every"):
            v = getattr(self, name)
            if type(v) is not int or v < 0:
                raise ValueError(f"{name}: an int >= 0, got {v!r}")
        if self.max_episode_steps is not None and (type(self.max_episode_steps) is not int
                                                   or self.max_episode_steps < 1):
            raise ValueError(f"max_episode_steps: None or an int >= 1, got {self.max_episode_steps!r}")
        for names, ok, what in ((("beta0", "gamma", "eps_base", "eval_epsilon"), lambda v: 0 <= v <= 1, "in [0, 1]"),
                                (("kappa", "learning_rate"), lambda v: v > 0, "> 0"),  # kappa: a Huber threshold
                                (("alpha", "replay_ratio", "eps_alpha", "actor_cpus", "shard_cpus"),
                                 lambda v: v >= 0, ">= 0")):
            for name in names:
                v = getattr(self, name)
                if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not ok(v):
                    raise ValueError(f"{name}: a finite number {what}, got {v!r}")
        if self.num_shards > MAX_SHARDS:
            raise ValueError(f"num_shards: at most {MAX_SHARDS}, got {self.num_shards!r}")
        if self.capacity < self.num_shards:
            raise ValueError(f"capacity: at least num_shards ({self.num_shards}), got {self.capacity!r}")
        if not isinstance(self.extra, dict):
            raise ValueError(f"extra: a dict, got {self.extra!r}")
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

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        self.net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})

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
        return {"actor": self.index, "steps": steps, "returns": returns, "pushed": self.pushed,
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
        shard = self.shards[push_shard(self.index, self.pushes, self.cfg.num_actors, len(self.shards))]
        self.pending = shard.add.remote(data, td)
        self.pushes += 1
        self.pushed += len(rows)


def _weights(net: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in net.state_dict().items()}


def evaluate(cfg: ApexConfig, net: torch.nn.Module) -> float:
    """Mean return of ``eval_episodes`` episodes of the epsilon-greedy (``eval_epsilon``) policy, on an
    environment seeded with seed + 100 (the same start states at every evaluation)."""
    env = make_env(cfg.env_id, max_episode_steps=cfg.eval_max_steps)
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


EXTRA_METRICS = ("updates", "sampled", "ingested", "stale_skipped", "shard_restarts", "actor_restarts",
                 "learner_updates_per_second")


def train(cfg: ApexConfig, out: str | os.PathLike | None = None, *, progress: bool = True,
          log=print, kill_shard_at: int | None = None, kill_actor_at: int | None = None) -> list[dict[str, Any]]:
    """Run Ape-X Double DQN on the Ray cluster this process is connected to (``ray.init`` first).

    Writes ``out/metrics.csv`` (after every evaluation) and ``out/config.json``; returns the metric rows.
    ``kill_shard_at`` / ``kill_actor_at``: kill shard 0 / actor 0 once this many environment steps are done
    (fault-tolerance drills: Ray restarts the shard from its checkpoint and the actor afresh, and the run
    carries on; counted in the metrics as shard_restarts and actor_restarts).
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
    checkpoint_dir = None
    if cfg.checkpoint_every and out is not None:
        checkpoint_dir = out / "shards"
    replay = ShardedReplay(cfg.num_shards, cfg.capacity, make_sampler(cfg), seed=cfg.seed,
                           checkpoint_dir=checkpoint_dir, checkpoint_every=cfg.checkpoint_every,
                           num_cpus=cfg.shard_cpus)
    Actor = ray.remote(ApexActor).options(max_restarts=-1, num_cpus=cfg.actor_cpus)
    # weights go by a call, not as constructor arguments: a restarted actor must not depend on an object
    # that may have left the store (ray-project/ray#53727); it gets the latest weights when it rejoins
    actors = [Actor.remote(cfg, i, replay.shards) for i in range(cfg.num_actors)]
    weights = ray.put(_weights(q))
    for a in actors:
        a.set_weights.remote(weights)
    running = {actors[i].collect.remote(cfg.collect_steps): i for i in range(cfg.num_actors)}
    idle: list[int] = []
    failures = [0] * cfg.num_actors
    seen_dead = [False] * cfg.num_actors
    in_flight: deque = deque()
    env_steps = updates = sampled = actor_restarts = 0
    episodes, recent, losses, rows = 0, deque(maxlen=20), [], []
    started = time.time()
    learn_started = None
    next_eval = cfg.eval_every
    killed = killed_actor = False
    bar = progress_bar(progress, cfg.total_steps, 0, f"apex {cfg.env_id} {cfg.variant}")

    def record() -> None:
        ret = evaluate(cfg, q)
        elapsed = time.time() - started
        learn_time = time.time() - learn_started if learn_started else 0.0
        rows.append({"step": env_steps, "episodes": episodes, "eval_return": ret,
                     "train_return": float(np.mean(recent)) if recent else float("nan"),
                     "loss": float(np.mean(losses)) if losses else float("nan"),
                     "steps_per_second": env_steps / max(elapsed, 1e-9), "runs_in_process": 1,
                     "updates": updates, "sampled": sampled, "ingested": len(replay),
                     "stale_skipped": replay.skipped, "shard_restarts": len(replay.restarts),
                     "actor_restarts": actor_restarts,
                     "learner_updates_per_second": updates / max(learn_time, 1e-9)})
        losses.clear()
        if log:
            log(f"apex {cfg.env_id} {cfg.variant} step {env_steps:,}: eval {ret:.1f} (updates {updates:,})")
        if out is not None:
            _write(out, cfg, rows, replay)

    try:
        while env_steps < cfg.total_steps:
            learning = len(replay) >= cfg.learning_starts
            behind = cfg.replay_ratio > 0 and sampled >= cfg.replay_ratio * env_steps
            want_learn = learning and not behind
            # harvest the actors (block for one when there is nothing to learn from yet)
            ready, _ = ray.wait(list(running), num_returns=len(running) if want_learn else 1,
                                timeout=0 if want_learn else None)
            for ref in ready:
                i = running.pop(ref)
                try:
                    res = ray.get(ref)
                    failures[i] = 0
                except ray.exceptions.RayActorError as err:
                    failures[i] += 1
                    if getattr(err, "actor_init_failed", False) or failures[i] > 20:
                        raise RuntimeError(f"apex: actor {i} cannot run (its constructor failed, or it died "
                                           f"{failures[i]} times in a row): {err}") from err
                    # Ray restarts it; it is sent again, gets the latest weights and rejoins
                    actor_restarts += 1
                    seen_dead[i] = True
                    actors[i].set_weights.remote(ray.put(_weights(q)))
                    idle.append(i)
                    continue
                if res["restarted"] and not seen_dead[i]:  # it died while idle: restarted before this collect
                    actor_restarts += 1
                    actors[i].set_weights.remote(ray.put(_weights(q)))
                seen_dead[i] = False
                env_steps += res["steps"]
                episodes += len(res["returns"])
                recent.extend(res["returns"])
                if bar is not None:
                    bar.update(res["steps"])
                idle.append(i)
            # actors run ahead of the learner by at most one collect each
            ahead = cfg.replay_ratio > 0 and learning and sampled + cfg.batch_size < cfg.replay_ratio * (
                env_steps - cfg.num_actors * cfg.collect_steps)
            if not ahead:
                for i in idle:
                    running[actors[i].collect.remote(cfg.collect_steps)] = i
                idle.clear()
            if not learning:
                replay.refresh()
            if kill_shard_at is not None and not killed and env_steps >= kill_shard_at:
                ray.kill(replay.shards[0], no_restart=False)
                killed = True
            if kill_actor_at is not None and not killed_actor and env_steps >= kill_actor_at:
                ray.kill(actors[0], no_restart=False)
                killed_actor = True
            if want_learn:
                if learn_started is None:
                    learn_started = time.time()
                beta = beta_fixed if beta_fixed is not None else cfg.beta0 + (1 - cfg.beta0) * min(
                    1.0, env_steps / cfg.total_steps)
                while len(in_flight) < cfg.prefetch:
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
                        a.set_weights.remote(ref)  # queued behind the actor's running collect
            if env_steps >= next_eval:
                record()
                next_eval += cfg.eval_every
        if not rows or rows[-1]["step"] != env_steps:
            record()
    finally:
        if bar is not None:
            bar.close()
        for a in actors:
            ray.kill(a, no_restart=True)
        replay.flush()
        replay.close()
    return rows


def _write(out: Path, cfg: ApexConfig, rows: list[dict], replay: ShardedReplay) -> None:
    write_metrics(out, rows, (*METRICS, *EXTRA_METRICS))
    v = versions()
    v["ray"] = ray.__version__
    payload = {"config": dataclasses.asdict(cfg), "versions": v,
               "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": cfg.device,
                           "ray_resources": {k: float(x) for k, x in ray.cluster_resources().items()
                                             if k in ("CPU", "GPU", "memory")},
                           "ray_nodes": len(ray.nodes())},
               "shard_restarts": replay.restarts}
    (out / "config.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
