"""Double DQN with uniform, PER, rank-based PER, LAP or PAL replay (Schaul et al. 2016, Algorithm 1;
Fujimoto et al. 2020, Sec. 6 and Appendix D.2), in PyTorch, through perx's public API.

CleanRL's layout: a frozen dataclass of hyperparameters, then one loop (:func:`train`). The loop trains
R runs at once ("lockstep"): every network has a leading run axis (:mod:`perx.agents.stacked`), each run
has its own environment, replay buffer, random generators and step size, and nothing of one run reaches
another, so R = 1 is an ordinary single run. What the variants change, and nothing else:

========= ========================================= ===================== ==================== =========
variant   sampler (perx)                            loss on delta          priority written     step size
========= ========================================= ===================== ==================== =========
uniform   ``Uniform()``                             Huber (kappa 1)        -                    eta
per       ``Proportional(0.6, eps=1e-10)``, beta    IS-weighted Huber      abs(delta) (+eps)    eta / 4
          0.4 -> 1
rank      ``RankBased(0.7)``, beta 0.5 -> 1         IS-weighted Huber      abs(delta)           eta / 4
lap       ``LAP(0.6, kappa=0.01)``                  Huber, kappa 0.01      max(abs(delta), .01) eta
pal       ``Uniform()``                             PAL (alpha 0.6, 0.01)  -                    eta
========= ========================================= ===================== ==================== =========

(000 Table 3 and Sec. 4 for per/rank: step size divided by 4; 004 Appendix D.2 / Table 7 and eq. 29-31
for lap/pal: kappa = 0.01 with the priority floor shifted to match.) Algorithm 1 semantics: every
transition enters at maximal priority; every K = ``train_frequency`` environment steps a minibatch is
sampled with its IS weights; Double-DQN targets (online argmax, target-network value); the new |delta|
written back for exactly the sampled ids; the target network copied every C = ``target_update``
updates; beta annealed linearly to 1 at the end of training; ``terminated`` stops bootstrapping,
``truncated`` does not.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import perx
from perx.agents import stacked
from perx.agents.runner import LockstepRuns, VariantConfig, flush_denormals, progress_bar

#: Per-variant settings (see the module docstring).
VARIANTS: dict[str, dict[str, Any]] = {
    "uniform": {"sampler": "uniform", "loss": "huber", "kappa": 1.0, "lr_scale": 1.0},
    "per": {"sampler": "proportional", "alpha": 0.6, "beta0": 0.4, "eps": 1e-10, "loss": "huber", "kappa": 1.0,
            "lr_scale": 0.25},
    "rank": {"sampler": "rank", "alpha": 0.7, "beta0": 0.5, "loss": "huber", "kappa": 1.0, "lr_scale": 0.25},
    "lap": {"sampler": "lap", "alpha": 0.6, "kappa": 0.01, "loss": "huber", "lr_scale": 1.0},
    "pal": {"sampler": "uniform", "alpha": 0.6, "kappa": 0.01, "loss": "pal", "lr_scale": 1.0},
    # 000 App. A hybrid minibatches: half of each batch proportional, half uniform, IS weights of the mixture
    "hybrid": {"sampler": "hybrid", "alpha": 0.6, "beta0": 0.4, "eps": 1e-10, "loss": "huber", "kappa": 1.0,
               "lr_scale": 0.25},
}


@dataclass(frozen=True)
class DQNConfig(VariantConfig):
    VARIANTS = VARIANTS
    OVERRIDES = ("alpha", "beta0", "kappa", "lr_scale", "normalize")

    env_id: str = "MinAtar/Breakout-v0"
    """MinAtar/<Game>-v0, ALE/<Game>-v5, or any Gymnasium id (CartPole-v1 for a smoke test)"""
    variant: str = "per"
    """uniform, per, rank, lap or pal (the table in the module docstring)"""
    seed: int = 0
    """seed of the networks, the environments (training: seed; evaluation: seed + 100) and the replay"""
    total_steps: int = 500_000
    """environment steps of training"""
    buffer_size: int = 100_000
    """replay capacity (MinAtar paper: 100k)"""
    batch_size: int = 32
    """transitions per update"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 1
    """n-step returns (1: Algorithm 1's one-step target)"""
    optimizer: str = "rmsprop"
    """rmsprop (MinAtar paper: centered, alpha 0.95, eps 0.01) or adam"""
    optimizer_eps: float | None = None
    """the optimiser's eps; None: 0.01 for rmsprop (MinAtar paper), 1e-8 for adam. 004 Table 7 uses 1e-5. With
    RMSprop it sets the gradient scale below which steps shrink with the gradient: a loss of smaller scale
    (IS weights below 1, LAP's and PAL's kappa = 0.01) then takes smaller steps"""
    learning_rate: float = 2.5e-4
    """baseline step size eta (MinAtar paper); the variant scales it (lr_scale)"""
    train_frequency: int = 4
    """K: environment steps per update (004 D.2; the MinAtar paper uses 1)"""
    target_update: int = 1000
    """C: updates between copies of the online network into the target network"""
    learning_starts: int = 5_000
    """environment steps with random actions before the first update (MinAtar paper: replay start 5000)"""
    eps_start: float = 1.0
    """exploration epsilon at the start"""
    eps_end: float = 0.1
    """exploration epsilon after eps_decay_steps (MinAtar paper: 0.1)"""
    eps_decay_steps: int = 100_000
    """environment steps of the linear epsilon decay (MinAtar paper: 100k)"""
    eval_every: int = 25_000
    """environment steps between evaluations (and checkpoints)"""
    eval_episodes: int = 10
    """episodes per evaluation (004 D.2)"""
    eval_epsilon: float = 0.001
    """epsilon of the evaluation policy (004 D.2)"""
    eval_max_steps: int = 10_000
    """steps after which an evaluation episode is cut (MinAtar games have no time limit of their own)"""
    alpha: float | None = None
    """priority exponent; None: the variant's"""
    beta0: float | None = None
    """initial IS exponent, annealed to 1; None: the variant's"""
    kappa: float | None = None
    """Huber threshold and LAP/PAL floor; None: the variant's"""
    normalize: str | None = None
    """IS weights divided by the buffer-wide largest weight ("buffer", 000 Sec. 3.4; the default) or the
    batch's ("batch", as the 004 and Dopamine code do)"""
    lr_scale: float | None = None
    """step-size factor of the variant; None: the variant's (1/4 for per and rank)"""
    priority_rule: str | None = None
    """a 000 App. A priority variant between the TD errors and the buffer (perx.priorities): learning-progress,
    rprop-sign, asymmetric, predecessor, return-boost, or staleness (with the rank variant); None: |delta| as
    Algorithm 1"""
    device: str = "cpu"
    """torch device of the networks (cuda where one exists)"""



#: Fields that must agree between runs trained in one lockstep group.
SHARED = ("env_id", "total_steps", "buffer_size", "batch_size", "gamma", "n_step", "optimizer", "optimizer_eps",
          "learning_rate",
          "train_frequency", "target_update", "learning_starts", "eps_start", "eps_end", "eps_decay_steps",
          "eval_every", "eval_episodes", "eval_epsilon", "eval_max_steps", "device")


def make_sampler(cfg: DQNConfig) -> perx.Sampler:
    s = cfg.settings()
    if s["sampler"] == "uniform":
        return perx.Uniform()
    if s["sampler"] == "proportional":
        return perx.Proportional(alpha=s["alpha"], eps=s.get("eps", 1e-6), normalize=s.get("normalize", "buffer"))
    if s["sampler"] == "rank":
        return perx.RankBased(alpha=s["alpha"], normalize=s.get("normalize", "buffer"))
    if s["sampler"] == "hybrid":
        prop = perx.Proportional(alpha=s["alpha"], eps=s.get("eps", 1e-6))
        return perx.Hybrid([prop, perx.Uniform()], [0.5, 0.5], mixing="random",
                           normalize=s.get("normalize") or "batch")
    return perx.LAP(alpha=s["alpha"], kappa=s["kappa"])


#: DQNConfig.priority_rule -> the perx.priorities rules it stands for (000 App. A).
PRIORITY_RULES = {
    "learning-progress": lambda: [perx.priorities.LearningProgress()],
    "rprop-sign": lambda: [perx.priorities.LearningProgress(sign_rule=True)],
    "asymmetric": lambda: [perx.priorities.Asymmetric(positive=2.0)],
    "predecessor": lambda: [perx.priorities.PredecessorBoost(1.0)],
    # + 0.1 x the discounted return-to-go, recorded when the episode ends (MinAtar rewards are 0/1, so a
    # return of a few units is worth a few tenths, the size of a large |delta|)
    "return-boost": lambda: [perx.priorities.ReturnBoost(0.1)],
}

#: Rules built from the config (their constants depend on the buffer size or the run length).
SIZED_RULES = {
    # every transition's priority grows by 1 per buffer_size updates unreplayed (order-based samplers only:
    # use it with the rank variant); the clock also gains the updates since the last target copy at each copy
    "staleness": lambda cfg: [perx.priorities.Staleness(1.0 / cfg.buffer_size,
                                                        horizon=float(4 * cfg.total_steps + 1))],
}


def make_prioritizer(cfg: DQNConfig, buf: perx.ReplayBuffer) -> perx.Prioritizer | None:
    if cfg.priority_rule is None:
        return None
    if cfg.priority_rule in SIZED_RULES:
        return perx.Prioritizer(buf, *SIZED_RULES[cfg.priority_rule](cfg))
    if cfg.priority_rule not in PRIORITY_RULES:
        raise ValueError(f"priority_rule: one of {sorted([*PRIORITY_RULES, *SIZED_RULES])} or None, got "
                         f"{cfg.priority_rule!r}")
    return perx.Prioritizer(buf, *PRIORITY_RULES[cfg.priority_rule]())


def network_for(env_id: str, obs_shape: tuple[int, ...], actions: int) -> Callable[[], torch.nn.Module]:
    if env_id.startswith("MinAtar/"):
        return lambda: stacked.minatar_net(obs_shape[-1], actions)
    if env_id.startswith("ALE/"):
        return lambda: stacked.nature_cnn(obs_shape[0], actions)
    return lambda: stacked.mlp(int(np.prod(obs_shape)), actions)


def double_dqn_target(q_net: torch.nn.Module, target_net: torch.nn.Module, next_obs: torch.Tensor,
                      returns: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
    """y = G + discount * Q_target(s', argmax_a Q(s', a)) for [R, B] returns and discounts (discount is
    gamma^k, or 0 after a termination: a truncation still bootstraps)."""
    with torch.no_grad():
        next_actions = q_net(next_obs).argmax(dim=-1, keepdim=True)  # the online network picks
        next_values = target_net(next_obs).gather(-1, next_actions).squeeze(-1)  # the target values
        return returns + discounts * next_values


def variant_loss(delta: torch.Tensor, weights: torch.Tensor, kappa: torch.Tensor, alpha: torch.Tensor,
                 is_pal: torch.Tensor) -> torch.Tensor:
    """Per-run loss [R] of TD errors delta [R, B]: IS-weighted Huber with threshold kappa (004 eq. 29), or
    PAL (004 eq. 31, lambda from the batch, held constant) for the runs flagged ``is_pal``."""
    k = kappa.unsqueeze(1)
    a = delta.abs()
    huber = torch.where(a <= k, 0.5 * delta * delta, k * (a - 0.5 * k))
    al = alpha.unsqueeze(1)
    lam = a.detach().clamp(min=k).pow(al).mean(dim=1, keepdim=True)
    pal = torch.where(a <= k, 0.5 * k.pow(al) * delta * delta, k * a.clamp(min=k).pow(1 + al) / (1 + al)) / lam
    return torch.where(is_pal.unsqueeze(1), pal, weights * huber).mean(dim=1)


class Runs(LockstepRuns):
    """The state of R Double-DQN runs trained in lockstep (see :func:`train`)."""

    shared_fields = SHARED

    def __init__(self, configs: Sequence[DQNConfig], *, samplers: Sequence[perx.Sampler] | None = None) -> None:
        super().__init__(configs, samplers or [make_sampler(c) for c in configs])
        first = self.cfg
        self.n_actions = int(self.envs.single_action_space.n)
        make = network_for(first.env_id, self.obs_shape, self.n_actions)
        seeds = [cfg.seed for cfg in configs]
        self.q = stacked.StackedNet(make, seeds).to(self.device)
        self.target = stacked.StackedNet(make, seeds).to(self.device)
        self.target.load_state_dict(self.q.state_dict())
        settings = [cfg.settings() for cfg in configs]
        lr = torch.tensor([first.learning_rate * s["lr_scale"] for s in settings], device=self.device)
        rmsprop = first.optimizer == "rmsprop"
        eps = first.optimizer_eps if first.optimizer_eps is not None else (0.01 if rmsprop else 1e-8)
        opt = {"eps": eps, "alpha": 0.95, "centered": True} if rmsprop else {"eps": eps}
        self.optimizer = stacked.StackedOptimizer(list(self.q.parameters()), lr, first.optimizer, **opt)
        self.nets = {"q": self.q, "target": self.target}
        self.optimizers = {"q": self.optimizer}
        self.kappa = torch.tensor([s["kappa"] for s in settings], device=self.device)
        self.alpha = torch.tensor([s.get("alpha", 0.0) for s in settings], device=self.device)
        self.is_pal = torch.tensor([s["loss"] == "pal" for s in settings], device=self.device)
        self.beta0 = [s.get("beta0", 1.0) for s in settings]
        # priorities go back to every sampler that uses them (a sampler passed in replaces the variant's)
        self.writes_priorities = [not isinstance(buf.sampler, perx.Uniform) for buf in self.buffers]
        self.prioritizers = [make_prioritizer(cfg, buf) for cfg, buf in zip(configs, self.buffers, strict=True)]
        # the steps of each run's current episode, for return boosts (recorded when it ends)
        self.episode_ids: list[list[int]] = [[] for _ in configs]
        self.episode_rewards: list[list[float]] = [[] for _ in configs]

    def epsilon(self) -> float:
        c = self.cfg
        if self.step < c.learning_starts:
            return 1.0  # fill the buffer with random actions
        frac = min(1.0, (self.step - c.learning_starts) / max(1, c.eps_decay_steps))
        return c.eps_start + frac * (c.eps_end - c.eps_start)

    def beta(self, r: int) -> float:
        return self.beta0[r] + (1.0 - self.beta0[r]) * min(1.0, self.step / self.cfg.total_steps)

    def act(self, obs: np.ndarray, epsilon: float, rngs: Sequence[np.random.Generator] | None = None) -> np.ndarray:
        """Epsilon-greedy actions of the R runs for observations [R, *obs_shape]."""
        with torch.no_grad():
            greedy = self.q(self.tensor(obs)[:, None])[:, 0].argmax(-1).cpu().numpy()
        actions = greedy.copy()
        for r, rng in enumerate(self.rngs if rngs is None else rngs):
            if rng.random() < epsilon:
                actions[r] = rng.integers(self.n_actions)
        return actions

    def policy(self, obs: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray:
        return self.act(obs, self.cfg.eval_epsilon, rngs)  # 004 D.2: epsilon 0.001

    def update(self) -> torch.Tensor:
        """One Double-DQN update of every run (Algorithm 1 lines 8-16); returns the per-run losses [R]."""
        B = self.cfg.batch_size
        batches = [buf.sample(B, beta=self.beta(r)) for r, buf in enumerate(self.buffers)]
        obs = self.tensor(np.stack([b["obs"] for b in batches]))
        next_obs = self.tensor(np.stack([b["next_obs"] for b in batches]))
        actions = self.stack(batches, "action", torch.long)
        y = double_dqn_target(self.q, self.target, next_obs, self.stack(batches, "return"),
                              self.stack(batches, "discount"))
        weights = torch.as_tensor(np.stack([b.weights for b in batches]), dtype=torch.float32, device=self.device)
        q_sa = self.q(obs).gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # [R, B]
        delta = q_sa - y
        losses = variant_loss(delta, weights, self.kappa, self.alpha, self.is_pal)
        self.optimizer.zero_grad()
        losses.sum().backward()  # runs share no parameter: each gets the gradient of its own loss
        self.optimizer.step()
        td = delta.detach().cpu().numpy()
        for r, (buf, batch) in enumerate(zip(self.buffers, batches, strict=True)):
            if self.prioritizers[r] is not None:
                self.prioritizers[r].update(batch.indices, td[r])  # an App. A variant of |delta|
            elif self.writes_priorities[r]:
                buf.update_priorities(batch.indices, td[r])  # |delta| for exactly the sampled ids
        self.updates += 1
        if self.updates % self.cfg.target_update == 0:
            self.target.load_state_dict(self.q.state_dict())
            for prio in self.prioritizers:
                if prio is not None:
                    prio.target_updated()
        return losses.detach()

    def on_step(self, ids: np.ndarray, rewards: np.ndarray, ended: np.ndarray) -> None:
        for r, prio in enumerate(self.prioritizers):
            if prio is None or self.configs[r].priority_rule != "return-boost":
                continue
            self.episode_ids[r].append(int(ids[r]))
            self.episode_rewards[r].append(float(rewards[r]))
            if ended[r]:
                prio.record_episode(self.episode_ids[r], self.episode_rewards[r], gamma=self.configs[r].gamma)
                self.episode_ids[r], self.episode_rewards[r] = [], []

    def extra_state(self, r: int) -> dict:
        prio = self.prioritizers[r]
        if prio is None:
            return {}
        return {"prioritizer": prio.state_dict(), "episode_ids": list(self.episode_ids[r]),
                "episode_rewards": list(self.episode_rewards[r])}

    def load_extra_state(self, r: int, state: dict) -> None:
        # the buffer was replaced by the loaded one: the rules are rebuilt on it, then restored
        self.prioritizers[r] = make_prioritizer(self.configs[r], self.buffers[r])
        if self.prioritizers[r] is not None:
            self.prioritizers[r].load_state_dict(state["prioritizer"])
            self.episode_ids[r] = list(state.get("episode_ids", []))
            self.episode_rewards[r] = list(state.get("episode_rewards", []))

    def load(self, dirs: Sequence[Path]) -> bool:
        for d in dirs:  # checkpoints written before the runner was shared name the networks differently
            _upgrade(d / "checkpoint" / "state.pt")
        if not super().load(dirs):
            return False
        self.writes_priorities = [not isinstance(buf.sampler, perx.Uniform) for buf in self.buffers]
        return True


def _upgrade(path: Path) -> None:
    if not path.exists():
        return
    st = torch.load(path, weights_only=False)
    if "nets" in st:
        return
    st["nets"] = {"q": st.pop("q"), "target": st.pop("target")}
    st["optimizers"] = {"q": st.pop("optimizer")}
    if isinstance(st["env"], bytes):
        st["env"] = {"pickle": st["env"]}
    tmp = path.with_suffix(".tmp")
    torch.save(st, tmp)
    os.replace(tmp, path)


def train(configs: DQNConfig | Sequence[DQNConfig], dirs: Sequence[str | os.PathLike] | None = None, *,
          samplers: Sequence[perx.Sampler] | None = None, stop_after: int | None = None, progress: bool = False,
          log: Callable[[str], None] | None = None,
          on_update: Callable[[int, np.ndarray], None] | None = None) -> list[list[dict]]:
    """Train the runs ``configs`` in lockstep (one process, networks stacked along a run axis).

    Args:
        configs: one config, or several that agree on every field of ``SHARED`` (they may differ in
            ``seed``, ``variant`` and the variant overrides).
        dirs: one output folder per run: ``metrics.csv``, ``config.json`` and ``checkpoint/`` are written
            there at every evaluation; an existing checkpoint is resumed, and the runs continue exactly as
            if never interrupted. None: nothing written.
        samplers: replace the variants' samplers (any perx sampler; the variant's loss is kept).
        stop_after: stop once this many environment steps are done (as an interruption would).
        progress: show a progress bar (tqdm).
        on_update: called with (step, per-run losses [R]) after every update (for tests and logging).

    Returns:
        each run's metrics rows (one per evaluation).
    """
    configs = [configs] if isinstance(configs, DQNConfig) else list(configs)
    torch.set_num_threads(1)  # measured here: one thread per process beats two on small networks
    dirs = [Path(d) for d in dirs] if dirs is not None else None
    with flush_denormals():
        runs = Runs(configs, samplers=samplers)
        runs.begin(dirs)
        c = runs.cfg
        bar = progress_bar(progress, c.total_steps, runs.step, f"{c.env_id} x{runs.R}")
        end = c.total_steps if stop_after is None else min(c.total_steps, stop_after)
        while runs.step < end:
            # act and store the transitions (Algorithm 1 lines 5-6 and 18)
            runs.env_step(runs.act(runs.obs, runs.epsilon()))
            # learn every K steps (lines 7-17)
            if runs.step >= c.learning_starts and runs.step % c.train_frequency == 0:
                losses = runs.update().cpu().numpy()
                for r in range(runs.R):
                    runs.losses[r].append(float(losses[r]))
                if on_update is not None:
                    on_update(runs.step, losses)
            if runs.step % c.eval_every == 0 or runs.step == c.total_steps:
                runs.record(dirs, log)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        runs.finish(dirs)
    return runs.rows
