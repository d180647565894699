"""Double DQN with uniform, PER, rank-based PER, LAP or PAL replay (Schaul et al. 2016, Algorithm 1;
Fujimoto et al. 2020, Sec. 6 and Appendix D.2), in PyTorch, through perx's public API.

CleanRL's layout: a frozen dataclass of hyperparameters, then one loop (:func:`train`). The loop trains
R runs at once ("lockstep"): every network has a leading run axis (:mod:`perx.agents.stacked`), each run
has its own environment, replay buffer, random generators and step size, and nothing of one run reaches
another, so R = 1 is an ordinary single run. What the variants change, and nothing else:

========= ============================================ ===================== ==================== ====
variant   sampler (perx), under the defaults           loss on delta          priority written     step
========= ============================================ ===================== ==================== ====
uniform   ``Uniform()``                                Huber (kappa 1)        -                    eta
per       ``Proportional(0.6, eps=1e-6)``, beta         IS-weighted Huber      abs(delta) + 1e-6    eta
          0.4 -> 1, weights / the batch's largest
rank      ``RankBased(0.7)``, beta 0.5 -> 1, the same   IS-weighted Huber      abs(delta) (its rank) eta
lap       ``LAP(0.6, kappa=0.01)``                     Huber, kappa 0.01      max(abs(delta), .01) eta
pal       ``Uniform()``                                PAL (alpha 0.6, 0.01)  -                    eta
hybrid    half ``Proportional(0.6)``, half uniform     IS-weighted Huber      abs(delta) + 1e-6    eta
========= ============================================ ===================== ==================== ====

(000 Table 3 for alpha and beta; 004 Appendix D.2 / Table 7 and eq. 29-31 for lap/pal: kappa = 0.01 with the
priority floor shifted to match; RMSprop eps 1e-5 and one step size for every variant as 004.) The published
settings are presets (``PRESETS``: ``minatar``, ``000`` with eta/4 and buffer-wide IS normalisation, ``004``);
docs/dqn.md says which setting made PER collapse under the old defaults. Algorithm 1 semantics: every
transition enters at maximal priority; every K = ``train_frequency`` environment steps a minibatch is
sampled with its IS weights; Double-DQN targets (online argmax, target-network value); the new |delta|
written back for exactly the sampled ids; the target network copied every C = ``target_update``
updates; beta annealed linearly to 1 over ``beta_steps`` (the run, unless a preset says otherwise);
``terminated`` stops bootstrapping, ``truncated`` does not.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import perx
from perx.agents import stacked
from perx.agents.runner import (
    LockstepRuns,
    VariantConfig,
    _take_old_name,
    flush_denormals,
    keeps_priorities,
    progress_bar,
    renamed,
)
from perx.torch import losses as tlosses

#: The rows of the variants under perx's defaults (preset "perx"): one step size, IS weights normalised by the
#: batch's largest weight, RMSprop eps 1e-5 (in the base below). Chosen by the attribution experiment
#: (docs/dqn.md, "Why PER collapsed"): with buffer-wide normalisation and 1e-10 priorities PER's loss shrinks
#: by 1e3-1e6 and its updates with it.
VARIANTS: dict[str, dict[str, Any]] = {
    "uniform": {"sampler": "uniform", "loss": "huber", "kappa": 1.0, "lr_scale": 1.0},
    "per": {"sampler": "proportional", "alpha": 0.6, "beta0": 0.4, "priority_eps": 1e-6, "loss": "huber",
            "kappa": 1.0, "lr_scale": 1.0, "normalize": "batch"},
    "rank": {"sampler": "rank", "alpha": 0.7, "beta0": 0.5, "loss": "huber", "kappa": 1.0, "lr_scale": 1.0,
             "normalize": "batch"},
    "lap": {"sampler": "lap", "alpha": 0.6, "kappa": 0.01, "loss": "huber", "lr_scale": 1.0},
    "pal": {"sampler": "uniform", "alpha": 0.6, "kappa": 0.01, "loss": "pal", "lr_scale": 1.0},
    # 000 App. A hybrid minibatches: half of each batch proportional, half uniform, IS weights of the mixture
    "hybrid": {"sampler": "hybrid", "alpha": 0.6, "beta0": 0.4, "priority_eps": 1e-6, "loss": "huber",
               "kappa": 1.0, "lr_scale": 1.0, "normalize": "batch"},
}


def _rows(lr_scale: float, normalize: str, priority_eps: float, priority_clip: float | None = None
          ) -> dict[str, dict[str, Any]]:
    """The variant rows of a published setting: PER, rank and hybrid with the given step-size factor, IS
    normalisation, priority floor and TD-error clip; LAP and PAL as 004 D.2 (alpha 0.6, kappa 0.01, eta)."""
    prioritized = {"lr_scale": lr_scale, "normalize": normalize}
    clip = {} if priority_clip is None else {"priority_clip": priority_clip}
    return {
        "uniform": VARIANTS["uniform"],
        "per": {**VARIANTS["per"], **prioritized, "priority_eps": priority_eps, **clip},
        "rank": {**VARIANTS["rank"], **prioritized, **clip},
        "lap": VARIANTS["lap"],
        "pal": VARIANTS["pal"],
        # perx.Hybrid normalises its mixture weights per batch only
        "hybrid": {**VARIANTS["hybrid"], "lr_scale": lr_scale, "priority_eps": priority_eps, **clip},
    }


#: Fields a preset sets (a config leaves them None to take the preset's value).
PRESET_FIELDS = ("capacity", "optimizer", "optimizer_eps", "learning_rate", "train_frequency", "target_update",
                 "learning_starts", "eps_end", "eps_decay_steps", "eval_every", "beta_steps")

#: MinAtar's DQN (Young & Tian 2019, their examples/dqn.py as published): centered RMSprop (alpha 0.95,
#: eps 0.01, no momentum), eta 2.5e-4, replay 100k, one update per step, target copy every 1000 updates,
#: replay start 5000, epsilon 1 -> 0.1 over 100k steps.
_MINATAR = {"capacity": 100_000, "optimizer": "rmsprop", "optimizer_eps": 0.01, "learning_rate": 2.5e-4,
            "train_frequency": 1, "target_update": 1000, "learning_starts": 5_000, "eps_end": 0.1,
            "eps_decay_steps": 100_000, "eval_every": 25_000, "beta_steps": None}

#: Named settings. ``base``: values of PRESET_FIELDS (beta_steps None: the run's total_steps); ``variants``:
#: the variant rows. Sources in docs/dqn.md, "Presets".
PRESETS: dict[str, dict[str, Any]] = {
    # perx's defaults: MinAtar's network and schedule, K = 4, RMSprop eps 1e-5 (004 Table 7), the rows above
    "perx": {"base": {**_MINATAR, "optimizer_eps": 1e-5, "train_frequency": 4}, "variants": VARIANTS},
    # MinAtar's DQN hyperparameters; the variants as perx ran them before (000 for PER and rank: eta/4,
    # buffer-wide normalisation; 004's PER floor 1e-10; 004 for LAP and PAL)
    "minatar": {"base": _MINATAR, "variants": _rows(0.25, "buffer", 1e-10)},
    # Schaul et al. 2016 Sec. 4, B.2.2: one update per 4 steps, a 1e6 memory, eta/4 for the prioritized
    # variants, TD errors clipped to [-1, 1], IS weights normalised by the largest in the memory (Sec. 3.4);
    # 000 gives no priority floor (perx's 1e-6); network and the rest as MinAtar's DQN (000's tuned Double DQN
    # kept Nature DQN's RMSprop, eps 0.01, as MinAtar does)
    "000": {"base": {**_MINATAR, "train_frequency": 4, "capacity": 1_000_000},
            "variants": _rows(0.25, "buffer", 1e-6, priority_clip=1.0)},
    # Fujimoto et al. 2020, Appendix D.2 / Table 7 and its code: RMSprop eps 1e-5, eta 6.25e-5 for every
    # variant, target copy every 8k updates, 20k random steps, epsilon 1 -> 0.01 over 1M steps, a 1e6 memory,
    # evaluations every 50k steps; PER: floor 1e-10, IS weights normalised per batch, beta 0.4 -> 1 over 50M
    # steps (12.5M updates)
    "004": {"base": {"capacity": 1_000_000, "optimizer": "rmsprop", "optimizer_eps": 1e-5,
                     "learning_rate": 6.25e-5, "train_frequency": 4, "target_update": 8_000,
                     "learning_starts": 20_000, "eps_end": 0.01, "eps_decay_steps": 1_000_000,
                     "eval_every": 50_000, "beta_steps": 50_000_000},
            "variants": _rows(1.0, "batch", 1e-10)},
}

PRESET_HELP = ("named settings: perx (defaults that learn with every variant), minatar (Young & Tian 2019), 000 "
               "(Schaul et al. 2016), 004 (Fujimoto et al. 2020); docs/dqn.md")

#: The optimisers' own eps, used when a config picks another optimiser than its preset's.
OPTIMIZER_EPS = {"rmsprop": 0.01, "adam": 1e-8}


@dataclass(frozen=True)
class DQNConfig(VariantConfig):
    """Hyperparameters of one Double-DQN run. Fields left None take the value of ``preset`` (``PRESETS``);
    after construction every field holds its resolved value (what ``config.json`` records).

    Defaults (preset "perx") learn with every variant: RMSprop eps 1e-5, one step size for all variants and
    IS weights normalised per batch. With MinAtar's eps 0.01 and buffer-wide normalisation (the "minatar" and
    "000" presets) PER's gradients are 1e-3..1e-6 of uniform's and it barely learns (docs/dqn.md, "Why PER
    collapsed").
    """

    VARIANTS = VARIANTS
    OVERRIDES = ("alpha", "beta0", "kappa", "lr_scale", "normalize", "priority_eps", "priority_clip")

    env_id: str = "MinAtar/Breakout-v0"
    """MinAtar/<Game>-v0, ALE/<Game>-v5, or any Gymnasium id (CartPole-v1 for a smoke test)"""
    variant: str = "per"
    """uniform, per, rank, lap, pal or hybrid (the table in the module docstring)"""
    seed: int = 0
    """seed of the networks, the environments (training: seed; evaluation: seed + 100) and the replay"""
    preset: str = "perx"
    """named settings for the fields left None: perx (defaults that learn with every variant), minatar (Young &
    Tian 2019), 000 (Schaul et al. 2016), 004 (Fujimoto et al. 2020, Table 7); docs/dqn.md, section Presets"""
    total_steps: int = 500_000
    """environment steps of training"""
    capacity: int | None = None
    """replay capacity (MinAtar paper: 100k; 000 and 004: 1M); ``buffer_size`` is its deprecated old name"""
    batch_size: int = 32
    """transitions per update"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 1
    """n-step returns (1: Algorithm 1's one-step target)"""
    optimizer: str | None = None
    """rmsprop (centered, alpha 0.95, as MinAtar and 004) or adam"""
    optimizer_eps: float | None = None
    """the optimiser's eps (perx: 1e-5 as 004 Table 7; minatar: 0.01). With RMSprop it is the gradient scale
    below which steps shrink with the gradient: a loss of smaller scale (IS weights below 1, LAP's and PAL's
    kappa = 0.01) then takes smaller steps"""
    learning_rate: float | None = None
    """baseline step size eta (MinAtar paper: 2.5e-4; 004: 6.25e-5); the variant scales it (lr_scale)"""
    train_frequency: int | None = None
    """K: environment steps per update (perx, 000, 004: 4; the MinAtar paper: 1)"""
    target_update: int | None = None
    """C: updates between copies of the online network into the target network"""
    learning_starts: int | None = None
    """environment steps with random actions before the first update (MinAtar paper: replay start 5000)"""
    eps_start: float = 1.0
    """exploration epsilon at the start"""
    eps_end: float | None = None
    """exploration epsilon after eps_decay_steps (MinAtar paper: 0.1; 004: 0.01)"""
    eps_decay_steps: int | None = None
    """environment steps of the linear epsilon decay, after learning_starts (MinAtar paper: 100k)"""
    eval_every: int | None = None
    """environment steps between evaluations (and checkpoints)"""
    eval_episodes: int = 10
    """episodes per evaluation (004 D.2)"""
    eval_epsilon: float = 0.001
    """epsilon of the evaluation policy (004 D.2)"""
    eval_max_steps: int = 10_000
    """steps after which an evaluation episode is cut (MinAtar games have no time limit of their own)"""
    beta_steps: int | None = None
    """environment steps over which beta is annealed linearly to 1 (None: total_steps; 004's code: 50M)"""
    alpha: float | None = None
    """priority exponent; None: the variant's"""
    beta0: float | None = None
    """initial IS exponent, annealed to 1; None: the variant's"""
    kappa: float | None = None
    """Huber threshold and LAP/PAL floor; None: the variant's"""
    normalize: str | None = None
    """IS weights divided by the batch's largest weight ("batch", as the 004 and Dopamine code do; perx's
    default) or the buffer-wide largest ("buffer", 000 Sec. 3.4); None: the variant's"""
    lr_scale: float | None = None
    """step-size factor of the variant; None: the variant's (1; 1/4 for per and rank in the 000 and minatar
    presets)"""
    priority_eps: float | None = None
    """PER's priority floor: p = |delta| + priority_eps (000 eq. 1); None: the variant's"""
    priority_clip: float | None = None
    """clip |delta| at this value before it becomes a priority (000 Sec. 4 clips TD errors to [-1, 1]); None:
    the variant's (no clip except in the 000 preset)"""
    priority_rule: str | None = None
    """a 000 App. A priority variant between the TD errors and the buffer (perx.priorities): learning-progress,
    rprop-sign, asymmetric, predecessor, return-boost, or staleness (with the rank variant); None: |delta| as
    Algorithm 1"""
    device: str = "cpu"
    """torch device of the networks (cuda where one exists)"""

    buffer_size: InitVar[int | None] = None
    """deprecated: the old name of ``capacity`` (perx names a buffer's size capacity in every layer)"""

    def __post_init__(self, buffer_size: int | None) -> None:
        _take_old_name(self, buffer_size)
        if self.preset not in PRESETS:
            raise ValueError(f"preset: one of {sorted(PRESETS)}, got {self.preset!r}")
        base = PRESETS[self.preset]["base"]
        for name in PRESET_FIELDS:
            if getattr(self, name) is None:
                value = base[name]
                if name == "optimizer_eps" and self.optimizer != base["optimizer"]:
                    if self.optimizer not in OPTIMIZER_EPS:
                        raise ValueError(f"optimizer: one of {sorted(OPTIMIZER_EPS)}, got {self.optimizer!r}")
                    value = OPTIMIZER_EPS[self.optimizer]
                if name == "beta_steps" and value is None:
                    value = self.total_steps
                object.__setattr__(self, name, value)

    def settings(self) -> dict[str, Any]:
        """The variant's row under this config's preset, with this config's overrides."""
        table = PRESETS[self.preset]["variants"]
        if self.variant not in table:
            raise ValueError(f"variant: one of {sorted(table)}, got {self.variant!r}")
        out = dict(table[self.variant])
        for name in self.OVERRIDES:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


def config_from_record(fields: dict[str, Any]) -> DQNConfig:
    """The DQNConfig a ``config.json`` records (its "config" entry). Records written before presets existed
    have no ``preset`` and None where the old code filled in its defaults, which are the minatar preset's."""
    return DQNConfig(**({"preset": "minatar"} if "preset" not in fields else {}), **renamed(fields))


#: Fields that must agree between runs trained in one lockstep group.
SHARED = ("env_id", "total_steps", "capacity", "batch_size", "gamma", "n_step", "optimizer", "optimizer_eps",
          "learning_rate",
          "train_frequency", "target_update", "learning_starts", "eps_start", "eps_end", "eps_decay_steps",
          "eval_every", "eval_episodes", "eval_epsilon", "eval_max_steps", "device")


def make_sampler(cfg: DQNConfig) -> perx.Sampler:
    s = cfg.settings()
    if s["sampler"] == "uniform":
        return perx.Uniform()
    if s["sampler"] == "proportional":
        return perx.Proportional(alpha=s["alpha"], eps=s.get("priority_eps", 1e-6),
                                 normalize=s.get("normalize", "buffer"))
    if s["sampler"] == "rank":
        return perx.RankBased(alpha=s["alpha"], normalize=s.get("normalize", "buffer"))
    if s["sampler"] == "hybrid":
        prop = perx.Proportional(alpha=s["alpha"], eps=s.get("priority_eps", 1e-6))
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
    # every transition's priority grows by 1 per capacity updates unreplayed (order-based samplers only:
    # use it with the rank variant); the clock also gains the updates since the last target copy at each copy
    "staleness": lambda cfg: [perx.priorities.Staleness(1.0 / cfg.capacity,
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
    k, al = kappa.unsqueeze(1), alpha.unsqueeze(1)
    huber = tlosses.huber_elementwise(delta, k)
    pal = tlosses.pal_elementwise(delta, al, k, dim=1)
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
        eps = first.optimizer_eps
        opt = {"eps": eps, "alpha": 0.95, "centered": True} if rmsprop else {"eps": eps}
        self.optimizer = stacked.StackedOptimizer(list(self.q.parameters()), lr, first.optimizer, **opt)
        self.nets = {"q": self.q, "target": self.target}
        self.optimizers = {"q": self.optimizer}
        self.kappa = torch.tensor([s["kappa"] for s in settings], device=self.device)
        self.alpha = torch.tensor([s.get("alpha", 0.0) for s in settings], device=self.device)
        self.is_pal = torch.tensor([s["loss"] == "pal" for s in settings], device=self.device)
        self.beta0 = [s.get("beta0", 1.0) for s in settings]
        self.beta_steps = [cfg.beta_steps for cfg in configs]
        self.priority_clip = [s.get("priority_clip") for s in settings]
        # priorities go back to every sampler that uses them (a sampler passed in replaces the variant's)
        self.writes_priorities = [keeps_priorities(buf) for buf in self.buffers]
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
        """beta0 annealed linearly to 1 over beta_steps environment steps (000 Sec. 3.4)."""
        return self.beta0[r] + (1.0 - self.beta0[r]) * min(1.0, self.step / self.beta_steps[r])

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
        if self.updates % 1000 == 0:  # now and then (a pass over the weights): warn if they all collapsed
            for r, b in enumerate(batches):
                perx.check_weight_scale(b.weights, where=f"{self.configs[r].variant} seed {self.configs[r].seed}")
        weights = torch.as_tensor(np.stack([b.weights for b in batches]), dtype=torch.float32, device=self.device)
        q_sa = self.q(obs).gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # [R, B]
        delta = q_sa - y
        losses = variant_loss(delta, weights, self.kappa, self.alpha, self.is_pal)
        self.optimizer.zero_grad()
        losses.sum().backward()  # runs share no parameter: each gets the gradient of its own loss
        self.optimizer.step()
        td = delta.detach().cpu().numpy()
        for r, (buf, batch) in enumerate(zip(self.buffers, batches, strict=True)):
            clip = self.priority_clip[r]
            td_r = td[r] if clip is None else np.clip(td[r], -clip, clip)  # 000 Sec. 4: TD errors in [-1, 1]
            if self.prioritizers[r] is not None:
                self.prioritizers[r].update(batch.indices, td_r)  # an App. A variant of |delta|
            elif self.writes_priorities[r]:
                buf.update_priorities(batch.indices, td_r)  # |delta| for exactly the sampled ids
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
        self.writes_priorities = [keeps_priorities(buf) for buf in self.buffers]
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
