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

import dataclasses
import json
import os
import pickle
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import perx
from perx.agents import stacked
from perx.agents.envs import make_env, network_input
from perx.gym import VectorRecorder

#: Per-variant settings (see the module docstring).
VARIANTS: dict[str, dict[str, Any]] = {
    "uniform": {"sampler": "uniform", "loss": "huber", "kappa": 1.0, "lr_scale": 1.0},
    "per": {"sampler": "proportional", "alpha": 0.6, "beta0": 0.4, "eps": 1e-10, "loss": "huber", "kappa": 1.0,
            "lr_scale": 0.25},
    "rank": {"sampler": "rank", "alpha": 0.7, "beta0": 0.5, "loss": "huber", "kappa": 1.0, "lr_scale": 0.25},
    "lap": {"sampler": "lap", "alpha": 0.6, "kappa": 0.01, "loss": "huber", "lr_scale": 1.0},
    "pal": {"sampler": "uniform", "alpha": 0.6, "kappa": 0.01, "loss": "pal", "lr_scale": 1.0},
}


@dataclass(frozen=True)
class DQNConfig:
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
    lr_scale: float | None = None
    """step-size factor of the variant; None: the variant's (1/4 for per and rank)"""
    device: str = "cpu"
    """torch device of the networks (cuda where one exists)"""

    def settings(self) -> dict[str, Any]:
        """The variant's settings with this config's overrides."""
        if self.variant not in VARIANTS:
            raise ValueError(f"variant: one of {sorted(VARIANTS)}, got {self.variant!r}")
        out = dict(VARIANTS[self.variant])
        for name in ("alpha", "beta0", "kappa", "lr_scale"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


#: Fields that must agree between runs trained in one lockstep group.
SHARED = ("env_id", "total_steps", "buffer_size", "batch_size", "gamma", "n_step", "optimizer", "learning_rate",
          "train_frequency", "target_update", "learning_starts", "eps_start", "eps_end", "eps_decay_steps",
          "eval_every", "eval_episodes", "eval_epsilon", "eval_max_steps", "device")


def make_sampler(cfg: DQNConfig) -> perx.Sampler:
    s = cfg.settings()
    if s["sampler"] == "uniform":
        return perx.Uniform()
    if s["sampler"] == "proportional":
        return perx.Proportional(alpha=s["alpha"], eps=s.get("eps", 1e-6))
    if s["sampler"] == "rank":
        return perx.RankBased(alpha=s["alpha"])
    return perx.LAP(alpha=s["alpha"], kappa=s["kappa"])


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


class Runs:
    """The state of R runs trained in lockstep (see :func:`train`)."""

    def __init__(self, configs: Sequence[DQNConfig], *, samplers: Sequence[perx.Sampler] | None = None) -> None:
        first = configs[0]
        for cfg in configs:
            bad = [f for f in SHARED if getattr(cfg, f) != getattr(first, f)]
            if bad:
                raise ValueError(f"configs: runs trained in lockstep must agree on {bad}")
        self.configs = list(configs)
        self.cfg = first
        R = len(configs)
        self.device = torch.device(first.device)
        self.envs = gym.vector.SyncVectorEnv([lambda: make_env(first.env_id) for _ in range(R)],
                                             autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        space = self.envs.single_observation_space
        self.obs_shape, self.n_actions = space.shape, int(self.envs.single_action_space.n)
        self.buffers = [
            perx.ReplayBuffer(first.buffer_size, samplers[r] if samplers else make_sampler(cfg), seed=cfg.seed,
                              episodes=perx.Episodes(n_step=first.n_step, gamma=first.gamma, next_obs="shared"))
            for r, cfg in enumerate(configs)]
        self.recorder = VectorRecorder(self.buffers, self.envs)
        make = network_for(first.env_id, self.obs_shape, self.n_actions)
        seeds = [cfg.seed for cfg in configs]
        self.q = stacked.StackedNet(make, seeds).to(self.device)
        self.target = stacked.StackedNet(make, seeds).to(self.device)
        self.target.load_state_dict(self.q.state_dict())
        settings = [cfg.settings() for cfg in configs]
        lr = torch.tensor([first.learning_rate * s["lr_scale"] for s in settings], device=self.device)
        opt = {"eps": 0.01, "alpha": 0.95, "centered": True} if first.optimizer == "rmsprop" else {}
        self.optimizer = stacked.StackedOptimizer(list(self.q.parameters()), lr, first.optimizer, **opt)
        self.kappa = torch.tensor([s["kappa"] for s in settings], device=self.device)
        self.alpha = torch.tensor([s.get("alpha", 0.0) for s in settings], device=self.device)
        self.is_pal = torch.tensor([s["loss"] == "pal" for s in settings], device=self.device)
        self.beta0 = [s.get("beta0", 1.0) for s in settings]
        self.writes_priorities = [s["sampler"] != "uniform" for s in settings]
        self.rngs = [np.random.default_rng(cfg.seed + 1) for cfg in configs]
        self.step = 0
        self.updates = 0
        self.episodes = np.zeros(R, np.int64)
        self.running = np.zeros(R)
        self.recent: list[list[float]] = [[] for _ in range(R)]
        self.losses: list[list[float]] = [[] for _ in range(R)]
        self.rows: list[list[dict]] = [[] for _ in range(R)]
        self.obs = None

    @property
    def R(self) -> int:
        return len(self.configs)

    def start(self) -> None:
        self.obs, _ = self.recorder.reset(seed=[cfg.seed for cfg in self.configs])

    def epsilon(self) -> float:
        c = self.cfg
        if self.step < c.learning_starts:
            return 1.0  # fill the buffer with random actions
        frac = min(1.0, (self.step - c.learning_starts) / max(1, c.eps_decay_steps))
        return c.eps_start + frac * (c.eps_end - c.eps_start)

    def beta(self, r: int) -> float:
        return self.beta0[r] + (1.0 - self.beta0[r]) * min(1.0, self.step / self.cfg.total_steps)

    def tensor(self, obs: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(network_input(obs, self.cfg.env_id)).to(self.device)

    def act(self, obs: np.ndarray, epsilon: float) -> np.ndarray:
        """Epsilon-greedy actions of the R runs for observations [R, *obs_shape]."""
        with torch.no_grad():
            greedy = self.q(self.tensor(obs)[:, None])[:, 0].argmax(-1).cpu().numpy()
        actions = greedy.copy()
        for r, rng in enumerate(self.rngs):
            if rng.random() < epsilon:
                actions[r] = rng.integers(self.n_actions)
        return actions

    def update(self) -> torch.Tensor:
        """One Double-DQN update of every run (Algorithm 1 lines 8-16); returns the per-run losses [R]."""
        B = self.cfg.batch_size
        batches = [buf.sample(B, beta=self.beta(r)) for r, buf in enumerate(self.buffers)]
        obs = self.tensor(np.stack([b["obs"] for b in batches]))
        next_obs = self.tensor(np.stack([b["next_obs"] for b in batches]))
        dev = self.device
        actions = torch.as_tensor(np.stack([b["action"] for b in batches]), device=dev).long()
        returns = torch.as_tensor(np.stack([b["return"] for b in batches]), dtype=torch.float32, device=dev)
        discounts = torch.as_tensor(np.stack([b["discount"] for b in batches]), dtype=torch.float32, device=dev)
        weights = torch.as_tensor(np.stack([b.weights for b in batches]), dtype=torch.float32, device=dev)
        y = double_dqn_target(self.q, self.target, next_obs, returns, discounts)
        q_sa = self.q(obs).gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # [R, B]
        delta = q_sa - y
        losses = variant_loss(delta, weights, self.kappa, self.alpha, self.is_pal)
        self.optimizer.zero_grad()
        losses.sum().backward()  # runs share no parameter: each gets the gradient of its own loss
        self.optimizer.step()
        td = delta.detach().cpu().numpy()
        for r, (buf, batch) in enumerate(zip(self.buffers, batches, strict=True)):
            if self.writes_priorities[r]:
                buf.update_priorities(batch.indices, td[r])  # |delta| for exactly the sampled ids
        self.updates += 1
        if self.updates % self.cfg.target_update == 0:
            self.target.load_state_dict(self.q.state_dict())
        return losses.detach()

    def evaluate(self) -> np.ndarray:
        """Mean return of each run's greedy-ish policy (epsilon 0.001) over eval_episodes episodes, on
        environments seeded with seed + 100 at every evaluation (the same start states each time)."""
        c = self.cfg
        envs = gym.vector.SyncVectorEnv([lambda: make_env(c.env_id, max_episode_steps=c.eval_max_steps)
                                         for _ in range(self.R)],
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        obs, _ = envs.reset(seed=[cfg.seed + 100 for cfg in self.configs])
        rngs = [np.random.default_rng(cfg.seed + 200) for cfg in self.configs]
        totals = [[] for _ in range(self.R)]
        running = np.zeros(self.R)
        while min(len(t) for t in totals) < c.eval_episodes:
            with torch.no_grad():
                actions = self.q(self.tensor(obs)[:, None])[:, 0].argmax(-1).cpu().numpy()
            for r, rng in enumerate(rngs):
                if rng.random() < c.eval_epsilon:
                    actions[r] = rng.integers(self.n_actions)
            obs, rewards, term, trunc, _ = envs.step(actions)
            running += rewards
            for r in np.flatnonzero(term | trunc):
                if len(totals[r]) < c.eval_episodes:
                    totals[r].append(running[r])
                running[r] = 0.0
        envs.close()
        return np.array([np.mean(t) for t in totals])

    # -- checkpoints ---------------------------------------------------------------------------------
    def save(self, dirs: Sequence[Path]) -> None:
        """Each run's complete state into its own ``dirs[r]/checkpoint``: networks, optimiser, replay
        buffer (perx's format), random generators, environment, counters and metrics rows."""
        for r, d in enumerate(dirs):
            ck = d / "checkpoint"
            ck.mkdir(parents=True, exist_ok=True)
            buffer_name = f"buffer-{self.step}.npz"
            self.buffers[r].save(ck / buffer_name)
            state = {
                "step": self.step, "updates": self.updates, "buffer": buffer_name,
                "q": self.q.run_state(r), "target": self.target.run_state(r),
                "optimizer": self.optimizer.run_state(r), "rng": self.rngs[r].bit_generator.state,
                "env": pickle.dumps(self.envs.envs[r]), "obs": self.obs[r].copy(),
                "episodes": int(self.episodes[r]), "running": float(self.running[r]),
                "recent": list(self.recent[r]), "rows": list(self.rows[r]),
                "config": dataclasses.asdict(self.configs[r]),
            }
            tmp = ck / "state.pt.tmp"
            torch.save(state, tmp)
            os.replace(tmp, ck / "state.pt")
            for old in ck.glob("buffer-*.npz"):  # only the one the state names is needed now
                if old.name != buffer_name:
                    old.unlink()

    def load(self, dirs: Sequence[Path]) -> bool:
        """Restore every run from its checkpoint; False (and nothing changed) unless all have one at the
        same step. Checkpoints are this runner's own files (they hold pickled environments)."""
        states = []
        for d in dirs:
            path = d / "checkpoint" / "state.pt"
            if not path.exists():
                return False
            states.append(torch.load(path, weights_only=False))
        if len({s["step"] for s in states}) != 1:
            return False
        envs = []
        for r, (d, st) in enumerate(zip(dirs, states, strict=True)):
            if st["config"] != dataclasses.asdict(self.configs[r]):
                raise ValueError(f"{d}: the checkpoint was made with another configuration")
            self.buffers[r] = perx.ReplayBuffer.load(d / "checkpoint" / st["buffer"])
            self.q.load_run_state(r, st["q"])
            self.target.load_run_state(r, st["target"])
            self.optimizer.load_run_state(r, st["optimizer"])
            self.rngs[r].bit_generator.state = st["rng"]
            envs.append(pickle.loads(st["env"]))
            self.episodes[r], self.running[r] = st["episodes"], st["running"]
            self.recent[r], self.rows[r] = st["recent"], st["rows"]
        self.step, self.updates = states[0]["step"], states[0]["updates"]
        self.envs.close()
        self.envs = gym.vector.SyncVectorEnv([lambda e=e: e for e in envs],
                                             autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.recorder = VectorRecorder(self.buffers, self.envs)
        self.recorder.obs = np.stack([st["obs"] for st in states])
        self.obs = self.recorder.obs.copy()
        return True


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
    with _flush_denormals():
        return _train(configs, dirs, samplers, stop_after, progress, log, on_update)


class _flush_denormals:
    """Optimiser statistics of parameters whose gradient is 0 decay into subnormal floats, which are slow
    on x86 (measured: the stacked RMSprop step took twice as long); flush them to 0 while training, and
    put the processor's mode back afterwards (it is global state)."""

    def __enter__(self):
        self.was = bool((torch.tensor([1e-40], dtype=torch.float32) * 1.0).item() == 0.0)
        torch.set_flush_denormal(True)

    def __exit__(self, *exc):
        torch.set_flush_denormal(self.was)


def _train(configs, dirs, samplers, stop_after, progress, log, on_update) -> list[list[dict]]:
    runs = Runs(configs, samplers=samplers)
    dirs = [Path(d) for d in dirs] if dirs is not None else None
    c = runs.cfg
    if dirs is None or not runs.load(dirs):
        runs.start()
        if dirs is not None:
            for d, cfg in zip(dirs, configs, strict=True):
                _write_config(d, cfg, runs)
    bar = _bar(progress, c.total_steps, runs.step, f"{c.env_id} x{runs.R}")
    start_step, start_time = runs.step, time.time()
    end = c.total_steps if stop_after is None else min(c.total_steps, stop_after)
    while runs.step < end:
        # act, step every run's environment, store the transitions (Algorithm 1 lines 5-6 and 18)
        actions = runs.act(runs.obs, runs.epsilon())
        runs.obs, rewards, terminated, truncated, _ = runs.recorder.step(actions)
        runs.step += 1
        runs.running += rewards
        for r in np.flatnonzero(terminated | truncated):
            runs.episodes[r] += 1
            runs.recent[r] = (runs.recent[r] + [float(runs.running[r])])[-10:]
            runs.running[r] = 0.0
        # learn every K steps (lines 7-17)
        if runs.step >= c.learning_starts and runs.step % c.train_frequency == 0:
            losses = runs.update().cpu().numpy()
            for r in range(runs.R):
                runs.losses[r].append(float(losses[r]))
            if on_update is not None:
                on_update(runs.step, losses)
        if runs.step % c.eval_every == 0 or runs.step == c.total_steps:
            returns = runs.evaluate()
            elapsed = time.time() - start_time
            for r in range(runs.R):
                row = {"step": runs.step, "episodes": int(runs.episodes[r]), "eval_return": float(returns[r]),
                       "train_return": float(np.mean(runs.recent[r])) if runs.recent[r] else float("nan"),
                       "loss": float(np.mean(runs.losses[r])) if runs.losses[r] else float("nan"),
                       "steps_per_second": (runs.step - start_step) / max(elapsed, 1e-9),
                       "runs_in_process": runs.R}
                runs.rows[r].append(row)
                runs.losses[r] = []
            if log:
                log(f"{c.env_id} step {runs.step:,}: eval " + " ".join(f"{x:.1f}" for x in returns))
            if dirs is not None:
                for r, d in enumerate(dirs):
                    _write_metrics(d, runs.rows[r])
                runs.save(dirs)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if dirs is not None and runs.step == c.total_steps:
        for d in dirs:
            (d / "done").write_text(json.dumps({"step": runs.step}))
    runs.envs.close()
    return runs.rows


def _bar(progress: bool, total: int, initial: int, desc: str):
    if not progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the experiments extra
        return None
    return tqdm(total=total, initial=initial, desc=desc, unit="step", mininterval=2.0, leave=False)


METRICS = ("step", "episodes", "eval_return", "train_return", "loss", "steps_per_second", "runs_in_process")


def _write_metrics(d: Path, rows: list[dict]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "metrics.csv.tmp"
    with open(tmp, "w") as f:
        f.write(",".join(METRICS) + "\n")
        for row in rows:
            f.write(",".join(f"{row[k]:.6g}" if isinstance(row[k], float) else str(row[k]) for k in METRICS) + "\n")
    os.replace(tmp, d / "metrics.csv")


def versions() -> dict[str, str]:
    """Versions of what the results depend on, and the git revision of the working tree."""
    out = {"python": platform.python_version(), "platform": platform.platform(), "perx": perx.__version__,
           "numpy": np.__version__, "torch": torch.__version__, "gymnasium": gym.__version__}
    for name in ("minatar", "ale_py", "numba"):
        try:
            import importlib.metadata as md

            out[name] = md.version(name.replace("_", "-"))
        except Exception:
            pass
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=5,
                               cwd=Path(__file__).parent)
        if rev.returncode == 0:
            out["git"] = rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _write_config(d: Path, cfg: DQNConfig, runs: Runs) -> None:
    d.mkdir(parents=True, exist_ok=True)
    payload = {"config": dataclasses.asdict(cfg), "settings": cfg.settings(), "versions": versions(),
               "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                           "device": cfg.device},
               "lockstep": [f"{c.variant}/seed={c.seed}" for c in runs.configs]}
    (d / "config.json").write_text(json.dumps(payload, indent=2) + "\n")
