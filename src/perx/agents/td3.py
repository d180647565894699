"""TD3 with uniform, PER, LAP or PAL replay (Fujimoto et al. 2020, Sec. 6, Appendix D.1, Table 6), in
PyTorch, through perx's public API; R runs in lockstep as :mod:`perx.agents.dqn`.

========= ============================================ ================================== ==============
variant   sampler (perx)                               critic loss, each of the two        priority
========= ============================================ ================================== ==============
uniform   ``Uniform()``                                MSE (TD3)                          -
per       ``Proportional(0.6, eps=1e-10)``, beta       IS-weighted MSE                    max_c abs(d_c)
          0.4 -> 1
lap       ``LAP(0.4, kappa=1)``                        Huber, kappa 1 (004 eq. 9)          max_c abs(d_c)
pal       ``Uniform()``                                PAL, alpha 0.4, kappa 1 (eq. 10)    -
                                                       (one lambda for both critics)
========= ============================================ ================================== ==============

With two critics the priority is the larger of their |delta| (004 Appendix D.1). Table 6: Adam 3e-4,
batch 256, gamma 0.99, tau 0.005, 25k initial random steps, exploration noise 0.1, target policy noise 0.2
clipped to 0.5, the actor updated every 2 critic updates, two 256-256 critics and a 256-256 actor.
Bootstrapping stops only on ``terminated``, never on a time limit (D.1). One update per environment step.
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
)
from perx.torch import losses as tlosses

VARIANTS: dict[str, dict[str, Any]] = {
    "uniform": {"sampler": "uniform", "loss": "mse"},
    "per": {"sampler": "proportional", "alpha": 0.6, "beta0": 0.4, "eps": 1e-10, "loss": "mse"},
    "lap": {"sampler": "lap", "alpha": 0.4, "kappa": 1.0, "loss": "huber"},
    "pal": {"sampler": "uniform", "alpha": 0.4, "kappa": 1.0, "loss": "pal"},
}
_LOSS_CODES = {"mse": 0, "huber": 1, "pal": 2}

#: Named settings (``TD3Config.preset``) of how the prioritized variants sample; the variants' rows above
#: (alpha, beta0, eps, kappa, losses: 004 Table 6) are the same under both. ``beta_steps``: updates over which
#: beta goes from beta0 to 1 (None: the whole run).
PRESETS: dict[str, dict[str, Any]] = {
    # the committed MuJoCo study's setting (results/mujoco): per's IS weights divided by the buffer-wide largest
    # (000 Sec. 3.4), stratified draws, beta reaching 1 at the end of the run
    "perx": {"normalize": "buffer", "stratified": True, "beta_steps": None},
    # 004's code (LAP-PAL, continuous/utils.py): weights divided by the batch's largest, one uniform draw per
    # sample over the whole sum (not stratified; LAP too), beta + 2e-7 per update from 0.4: 1 after 3M updates
    # (0.415 at 100k steps with 25k random ones)
    "004": {"normalize": "batch", "stratified": False, "beta_steps": 3_000_000},
}
PRESET_HELP = ("named settings of the prioritized variants: perx (the committed MuJoCo study's: buffer-wide IS "
               "normalisation, beta to 1 over the run), 004 (Fujimoto et al.'s code: per-batch normalisation, "
               "unstratified draws, beta to 1 over 3M updates); docs/td3.md")


@dataclass(frozen=True)
class TD3Config(VariantConfig):
    VARIANTS = VARIANTS
    env_id: str = "Hopper-v5"
    """Gymnasium MuJoCo v5 (Hopper, HalfCheetah, Walker2d, Ant, Humanoid) or Pendulum-v1"""
    variant: str = "lap"
    """uniform, per, lap or pal (the table in the module docstring)"""
    seed: int = 0
    """seed of the networks, the environments (training: seed; evaluation: seed + 100) and the replay"""
    preset: str = "perx"
    """how per and lap sample: perx or 004 (:data:`PRESETS`; docs/td3.md)"""
    total_steps: int = 100_000
    """environment steps of training (004 Table 1: 3M in its code, 1M in most TD3 reports)"""
    capacity: int = 1_000_000
    """replay capacity; ``buffer_size`` is its deprecated old name"""
    batch_size: int = 256
    """transitions per update (Table 6)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target networks' Polyak step"""
    learning_rate: float = 3e-4
    """Adam's step size, actor and critics"""
    start_steps: int = 25_000
    """initial steps with uniformly random actions (Table 6)"""
    exploration_noise: float = 0.1
    """std of the Gaussian exploration noise, in units of the largest action (half the range)"""
    policy_noise: float = 0.2
    """std of the target policy smoothing noise, in units of the largest action"""
    noise_clip: float = 0.5
    """clip of the target policy noise, in units of the largest action"""
    policy_freq: int = 2
    """critic updates per actor update"""
    hidden: int = 256
    """units per hidden layer (two layers)"""
    eval_every: int = 5_000
    """environment steps between evaluations (D.1)"""
    eval_episodes: int = 10
    """episodes per evaluation (D.1)"""
    eval_max_steps: int | None = None
    """cut evaluation episodes here (None: the environment's own limit)"""
    alpha: float | None = None
    """priority exponent; None: the variant's"""
    beta0: float | None = None
    """initial IS exponent, annealed to 1; None: the variant's"""
    beta_steps: int | None = None
    """updates over which beta reaches 1 (linear from beta0); None: the preset's (perx: the whole run, 004: 3M)"""
    kappa: float | None = None
    """Huber threshold and LAP/PAL floor; None: the variant's"""
    device: str = "cpu"
    """torch device of the networks"""
    buffer_size: InitVar[int | None] = None
    """deprecated: the old name of ``capacity`` (perx names a buffer's size capacity in every layer)"""

    def __post_init__(self, buffer_size: int | None) -> None:
        _take_old_name(self, buffer_size)
        if self.preset not in PRESETS:
            raise ValueError(f"preset: one of {sorted(PRESETS)}, got {self.preset!r}")
        if self.beta_steps is not None and (isinstance(self.beta_steps, bool) or self.beta_steps < 1):
            raise ValueError(f"beta_steps: a number of updates >= 1, got {self.beta_steps!r}")

    def beta_horizon(self) -> int:
        """Updates over which beta goes from beta0 to 1: ``beta_steps``, else the preset's, else the run's."""
        steps = self.beta_steps or PRESETS[self.preset]["beta_steps"]
        return steps if steps is not None else max(1, self.total_steps - self.start_steps)



SHARED = ("env_id", "total_steps", "capacity", "batch_size", "gamma", "tau", "learning_rate", "start_steps",
          "exploration_noise", "policy_noise", "noise_clip", "policy_freq", "hidden", "eval_every",
          "eval_episodes", "eval_max_steps", "device")


def make_sampler(cfg: TD3Config) -> perx.Sampler:
    s, preset = cfg.settings(), PRESETS[cfg.preset]
    if s["sampler"] == "uniform":
        return perx.Uniform()
    if s["sampler"] == "proportional":
        return perx.Proportional(alpha=s["alpha"], eps=s.get("eps", 1e-6), normalize=preset["normalize"],
                                 stratified=preset["stratified"])
    return perx.LAP(alpha=s["alpha"], kappa=s["kappa"], stratified=preset["stratified"])


def critic_loss(delta: torch.Tensor, weights: torch.Tensor, code: torch.Tensor, kappa: torch.Tensor,
                alpha: torch.Tensor, priority: torch.Tensor | None = None) -> torch.Tensor:
    """Per-run loss [R] of one critic's TD errors [R, B]: MSE delta^2 (TD3's ``F.mse_loss``, weighted by IS
    weights), Huber with threshold kappa (004 eq. 2), or PAL (004 eq. 10), as ``code`` says per run (0, 1,
    2). PAL's lambda = mean_j max(|priority_j|, kappa)^alpha over the batch, held constant; ``priority`` is
    the larger |delta| of the two critics (one lambda for both, as the 004 code does), default |delta|."""
    k, al = kappa.unsqueeze(1), alpha.unsqueeze(1)
    mse = weights * delta * delta
    huber = tlosses.huber_elementwise(delta, k)
    pal = tlosses.pal_elementwise(delta, al, k, priority=priority, dim=1)
    c = code.unsqueeze(1)
    return torch.where(c == 0, mse, torch.where(c == 1, huber, pal)).mean(dim=1)


class Runs(LockstepRuns):
    """The state of R TD3 runs trained in lockstep (see :func:`train`)."""

    shared_fields = SHARED

    def __init__(self, configs: Sequence[TD3Config], *, samplers: Sequence[perx.Sampler] | None = None,
                 buffers: Sequence[Any] | None = None) -> None:
        super().__init__(configs, samplers or [make_sampler(c) for c in configs], buffers)
        c = self.cfg
        space = self.envs.single_action_space
        self.low, self.high = space.low.astype(np.float32), space.high.astype(np.float32)
        self.act_dim = int(np.prod(space.shape))
        obs_dim = int(np.prod(self.obs_shape))
        seeds = [cfg.seed for cfg in configs]

        def actor():
            return stacked.mlp(obs_dim, self.act_dim, c.hidden, tanh=True)

        def critic():
            return stacked.mlp(obs_dim + self.act_dim, 1, c.hidden)

        dev = self.device
        self.actor = stacked.StackedNet(actor, seeds).to(dev)
        self.q1 = stacked.StackedNet(critic, [s + 10_000 for s in seeds]).to(dev)
        self.q2 = stacked.StackedNet(critic, [s + 20_000 for s in seeds]).to(dev)
        self.actor_t = stacked.StackedNet(actor, seeds).to(dev)
        self.q1_t = stacked.StackedNet(critic, [s + 10_000 for s in seeds]).to(dev)
        self.q2_t = stacked.StackedNet(critic, [s + 20_000 for s in seeds]).to(dev)
        lr = torch.full((self.R,), c.learning_rate, device=dev)
        self.actor_opt = stacked.StackedOptimizer(list(self.actor.parameters()), lr, "adam")
        self.critic_opt = stacked.StackedOptimizer(list(self.q1.parameters()) + list(self.q2.parameters()), lr, "adam")
        self.nets = {"actor": self.actor, "q1": self.q1, "q2": self.q2, "actor_t": self.actor_t, "q1_t": self.q1_t,
                     "q2_t": self.q2_t}
        self.optimizers = {"actor": self.actor_opt, "critic": self.critic_opt}
        settings = [cfg.settings() for cfg in configs]
        self.code = torch.tensor([_LOSS_CODES[s["loss"]] for s in settings], device=dev)
        self.kappa = torch.tensor([s.get("kappa", 1.0) for s in settings], device=dev)
        self.alpha = torch.tensor([s.get("alpha", 0.0) for s in settings], device=dev)
        self.beta0 = [s.get("beta0", 1.0) for s in settings]
        self.writes_priorities = [keeps_priorities(buf) for buf in self.buffers]
        # target policy noise from one generator per run, so that a run's draws do not depend on its group
        self.noise = [torch.Generator().manual_seed(cfg.seed + 3) for cfg in configs]
        self.scale = torch.as_tensor((self.high - self.low) / 2, device=dev)
        self.centre = torch.as_tensor((self.high + self.low) / 2, device=dev)

    def beta(self, r: int) -> float:
        """beta0 at the first update (after the random start steps), 1 after the run's beta horizon."""
        cfg = self.configs[r]
        done = (self.step - cfg.start_steps) / cfg.beta_horizon()
        return self.beta0[r] + (1.0 - self.beta0[r]) * min(1.0, max(0.0, done))

    def pi(self, net: stacked.StackedNet, obs: torch.Tensor) -> torch.Tensor:
        """Actions of the actor ``net`` for observations [R, B, obs_dim], in the action space's range."""
        return self.centre + self.scale * net(obs)

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Random actions for the first ``start_steps`` steps, then the actor plus Gaussian noise."""
        c = self.cfg
        if self.step < c.start_steps:
            return np.stack([rng.uniform(self.low, self.high).astype(np.float32) for rng in self.rngs])
        with torch.no_grad():
            a = self.pi(self.actor, self.tensor(obs)[:, None])[:, 0].cpu().numpy()
        noise = np.stack([rng.normal(0.0, 1.0, self.act_dim) for rng in self.rngs]).astype(np.float32)
        return np.clip(a + noise * c.exploration_noise * (self.high - self.low) / 2, self.low, self.high)

    def policy(self, obs: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray:
        return self.pi(self.actor, self.tensor(obs)[:, None])[:, 0].cpu().numpy()  # deterministic (D.1)

    def update(self) -> torch.Tensor:
        """One TD3 update of every run; returns the per-run critic losses [R]."""
        c = self.cfg
        batches = [buf.sample(c.batch_size, beta=self.beta(r)) for r, buf in enumerate(self.buffers)]
        obs, next_obs = self.stack(batches, "obs"), self.stack(batches, "next_obs")
        actions = self.stack(batches, "action")
        weights = torch.as_tensor(np.stack([b.weights for b in batches]), dtype=torch.float32, device=self.device)
        with torch.no_grad():
            noise = torch.stack([torch.randn(c.batch_size, self.act_dim, generator=g) for g in self.noise])
            noise = (noise.to(self.device) * c.policy_noise).clamp(-c.noise_clip, c.noise_clip) * self.scale
            next_a = torch.max(torch.min(self.pi(self.actor_t, next_obs) + noise, self.centre + self.scale),
                               self.centre - self.scale)
            sa2 = torch.cat([next_obs, next_a], dim=-1)
            next_q = torch.min(self.q1_t(sa2), self.q2_t(sa2)).squeeze(-1)
            y = self.stack(batches, "return") + self.stack(batches, "discount") * next_q  # 0 only if terminated
        sa = torch.cat([obs, actions], dim=-1)
        d1, d2 = self.q1(sa).squeeze(-1) - y, self.q2(sa).squeeze(-1) - y
        top = torch.max(d1.detach().abs(), d2.detach().abs())  # 004 D.1: the larger |delta| of the critics
        losses = (critic_loss(d1, weights, self.code, self.kappa, self.alpha, top)
                  + critic_loss(d2, weights, self.code, self.kappa, self.alpha, top))
        self.critic_opt.zero_grad()
        losses.sum().backward()
        self.critic_opt.step()
        td = top.cpu().numpy()
        for r, (buf, batch) in enumerate(zip(self.buffers, batches, strict=True)):
            if self.writes_priorities[r]:
                buf.update_priorities(batch.indices, td[r])
        self.updates += 1
        if self.updates % c.policy_freq == 0:
            actor_loss = -self.q1(torch.cat([obs, self.pi(self.actor, obs)], dim=-1)).mean(dim=(1, 2))
            self.actor_opt.zero_grad()
            actor_loss.sum().backward()
            self.actor_opt.step()
            with torch.no_grad():
                for net, tgt in ((self.actor, self.actor_t), (self.q1, self.q1_t), (self.q2, self.q2_t)):
                    for p, pt in zip(net.parameters(), tgt.parameters(), strict=True):
                        pt.lerp_(p, c.tau)
        return losses.detach()

    def load(self, dirs: Sequence[Path]) -> bool:
        if not super().load(dirs):
            return False
        self.writes_priorities = [keeps_priorities(buf) for buf in self.buffers]
        return True

    def extra_state(self, r: int) -> dict:
        return {"noise": self.noise[r].get_state()}

    def load_extra_state(self, r: int, state: dict) -> None:
        self.noise[r].set_state(state["noise"])


def train(configs: TD3Config | Sequence[TD3Config], dirs: Sequence[str | os.PathLike] | None = None, *,
          samplers: Sequence[perx.Sampler] | None = None, buffers: Sequence[Any] | None = None,
          stop_after: int | None = None, progress: bool = False, log: Callable[[str], None] | None = None,
          on_update: Callable[[int, np.ndarray], None] | None = None) -> list[list[dict]]:
    """Train TD3 runs in lockstep; the same contract as :func:`perx.agents.dqn.train`, and ``buffers``:
    each run's replay in place of the default perx buffer, any object with the interface
    :class:`perx.agents.runner.LockstepRuns` documents (the TD3 overhead benchmark passes cpprb's and
    Tianshou's buffers here); such runs cannot checkpoint, so ``dirs`` must be None."""
    if buffers is not None and dirs is not None:
        raise ValueError("buffers: runs with buffers passed in cannot checkpoint; pass dirs=None")
    configs = [configs] if isinstance(configs, TD3Config) else list(configs)
    torch.set_num_threads(1)
    dirs = [Path(d) for d in dirs] if dirs is not None else None
    with flush_denormals():
        runs = Runs(configs, samplers=samplers, buffers=buffers)
        runs.begin(dirs)
        c = runs.cfg
        bar = progress_bar(progress, c.total_steps, runs.step, f"{c.env_id} x{runs.R}")
        end = c.total_steps if stop_after is None else min(c.total_steps, stop_after)
        while runs.step < end:
            runs.env_step(runs.act(runs.obs))
            if runs.step >= c.start_steps:  # one update per environment step after the random phase
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
