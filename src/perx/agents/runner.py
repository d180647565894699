"""What every agent's lockstep runs share: environments, one perx buffer per run, the episode bookkeeping,
evaluation, metrics, config files and exact checkpoints. The agents (:mod:`perx.agents.dqn`,
:mod:`perx.agents.td3`) add their networks, their update and their loop.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import platform
import subprocess
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

import perx
import perx.host
from perx.agents import stacked
from perx.agents.envs import make_env, network_input
from perx.gym import VectorRecorder

METRICS = ("step", "episodes", "eval_return", "train_return", "loss", "steps_per_second", "runs_in_process")


#: Config fields renamed since runs were recorded: old name -> new name (records are read with the new names).
RENAMED = {"buffer_size": "capacity"}


def renamed(fields: dict[str, Any]) -> dict[str, Any]:
    """A recorded config (config.json, study.json, overrides) with old field names replaced by today's."""
    return {RENAMED.get(k, k): v for k, v in fields.items()}


def _take_old_name(cfg: Any, buffer_size: int | None) -> None:
    """``buffer_size=`` given to a config: the deprecated name of ``capacity`` (one word per idea in every layer:
    ``perx.ReplayBuffer(capacity)``). Refused when it disagrees with a ``capacity`` also given."""
    if buffer_size is None:
        return
    warnings.warn("buffer_size: renamed capacity (as perx.ReplayBuffer's); the old name will go", DeprecationWarning,
                  stacklevel=4)
    default = next(f.default for f in dataclasses.fields(cfg) if f.name == "capacity")
    if cfg.capacity not in (default, buffer_size):
        raise ValueError(f"buffer_size: the old name of capacity; got both, {buffer_size!r} and {cfg.capacity!r}")
    object.__setattr__(cfg, "capacity", buffer_size)


class VariantConfig:
    """Base of the agents' config dataclasses: a ``variant`` picks a row of ``VARIANTS`` (sampler, loss and
    their parameters), and fields named in ``OVERRIDES`` replace the row's values unless None."""

    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {}
    OVERRIDES: ClassVar[tuple[str, ...]] = ("alpha", "beta0", "kappa")

    def settings(self) -> dict[str, Any]:
        """The variant's settings with this config's overrides."""
        if self.variant not in self.VARIANTS:
            raise ValueError(f"variant: one of {sorted(self.VARIANTS)}, got {self.variant!r}")
        out = dict(self.VARIANTS[self.variant])
        for name in self.OVERRIDES:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


class LockstepRuns:
    """R runs that step together: run r has its own environment (sub-env r of a same-step-autoreset vector
    env), its own perx buffer, random generator and metrics. Subclasses set ``self.nets`` and
    ``self.optimizers`` (dicts of stacked modules / optimisers, saved and restored by name) and implement
    :meth:`policy` (the evaluation policy).

    ``buffers`` replaces the default buffers (one ``perx.ReplayBuffer`` with ``perx.Episodes`` per run) with
    objects that offer what the runs call: ``extend(obs=, action=, reward=, next_obs=, terminated=,
    truncated=)`` returning ids, ``sample(batch_size, beta=)`` returning a batch with fields ``obs``,
    ``action``, ``next_obs``, ``return``, ``discount`` and attributes ``weights``, ``indices``, and
    ``update_priorities(indices, priorities)``. The TD3 overhead benchmark uses it to put cpprb's and Tianshou's
    buffers behind the same agent; checkpoints (:meth:`save`) need perx buffers."""

    #: Config fields every run of a group must share.
    shared_fields: tuple[str, ...] = ()

    def __init__(self, configs: Sequence[Any], samplers: Sequence[perx.Sampler],
                 buffers: Sequence[Any] | None = None) -> None:
        first = configs[0]
        for cfg in configs:
            bad = [f for f in self.shared_fields if getattr(cfg, f) != getattr(first, f)]
            if bad:
                raise ValueError(f"configs: runs trained in lockstep must agree on {bad}")
        self.configs, self.cfg = list(configs), first
        R = len(configs)
        self.device = torch.device(first.device)
        self.envs = gym.vector.SyncVectorEnv([lambda: make_env(first.env_id) for _ in range(R)],
                                             autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.obs_shape = self.envs.single_observation_space.shape
        if buffers is not None:  # another library's buffer behind perx's interface (benchmarks/_peers.py)
            if len(buffers) != R:
                raise ValueError(f"buffers: one per run, got {len(buffers)} for {R} runs")
            self.buffers = list(buffers)
        else:
            self.buffers = [perx.ReplayBuffer(first.capacity, samplers[r], seed=cfg.seed,
                                              episodes=perx.Episodes(n_step=getattr(first, "n_step", 1),
                                                                     gamma=first.gamma, next_obs="shared"))
                            for r, cfg in enumerate(configs)]
        self.recorder = VectorRecorder(self.buffers, self.envs)
        self.rngs = [np.random.default_rng(cfg.seed + 1) for cfg in configs]
        self.nets: dict[str, stacked.StackedNet] = {}
        self.optimizers: dict[str, stacked.StackedOptimizer] = {}
        self.step = 0
        self.updates = 0
        self.episodes = np.zeros(R, np.int64)
        self.running = np.zeros(R)
        self.recent: list[list[float]] = [[] for _ in range(R)]
        self.losses: list[list[float]] = [[] for _ in range(R)]
        self.rows: list[list[dict]] = [[] for _ in range(R)]
        self.obs: np.ndarray | None = None
        self.started = time.time()
        self.start_step = 0

    @property
    def R(self) -> int:
        return len(self.configs)

    def start(self) -> None:
        self.obs, _ = self.recorder.reset(seed=[cfg.seed for cfg in self.configs])

    def tensor(self, obs: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(network_input(obs, self.cfg.env_id)).to(self.device)

    def env_step(self, actions: np.ndarray) -> None:
        """Step every run's environment, store the transitions, keep the episode statistics."""
        result = self.envs.step(actions)
        ids = self.recorder.record(actions, *result)  # same-step autoreset: one id per run, in run order
        self.obs, rewards, terminated, truncated, _ = result
        self.on_step(ids, rewards, terminated | truncated)
        self.step += 1
        self.running += rewards
        for r in np.flatnonzero(terminated | truncated):
            self.episodes[r] += 1
            self.recent[r] = (self.recent[r] + [float(self.running[r])])[-10:]
            self.running[r] = 0.0

    def on_step(self, ids: np.ndarray, rewards: np.ndarray, ended: np.ndarray) -> None:
        """Called after every environment step with each run's new transition id, reward and whether its
        episode ended (for priority rules that need whole episodes); does nothing by default."""

    def stack(self, batches: Sequence[perx.Batch], key: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """One field of R batches as a tensor [R, B, ...] on the device."""
        return torch.as_tensor(np.stack([b[key] for b in batches]), dtype=dtype, device=self.device)

    # -- evaluation ----------------------------------------------------------------------------------
    def policy(self, obs: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray:
        raise NotImplementedError

    def evaluate(self) -> np.ndarray:
        """Each run's mean return over ``eval_episodes`` episodes of :meth:`policy`, on environments seeded
        with seed + 100 at every evaluation (the same start states each time; 004 Appendix D)."""
        c = self.cfg
        envs = gym.vector.SyncVectorEnv([lambda: make_env(c.env_id, max_episode_steps=c.eval_max_steps)
                                         for _ in range(self.R)],
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        obs, _ = envs.reset(seed=[cfg.seed + 100 for cfg in self.configs])
        rngs = [np.random.default_rng(cfg.seed + 200) for cfg in self.configs]
        totals: list[list[float]] = [[] for _ in range(self.R)]
        running = np.zeros(self.R)
        while min(len(t) for t in totals) < c.eval_episodes:
            with torch.no_grad():
                actions = self.policy(obs, rngs)
            obs, rewards, term, trunc, _ = envs.step(actions)
            running += rewards
            for r in np.flatnonzero(term | trunc):
                if len(totals[r]) < c.eval_episodes:
                    totals[r].append(float(running[r]))
                running[r] = 0.0
        envs.close()
        return np.array([np.mean(t) for t in totals])

    def record(self, dirs: Sequence[Path] | None, log: Callable[[str], None] | None) -> None:
        """Evaluate, append a metrics row per run, write metrics and a checkpoint (when ``dirs``)."""
        returns = self.evaluate()
        elapsed = time.time() - self.started
        for r in range(self.R):
            self.rows[r].append({
                "step": self.step, "episodes": int(self.episodes[r]), "eval_return": float(returns[r]),
                "train_return": float(np.mean(self.recent[r])) if self.recent[r] else float("nan"),
                "loss": float(np.mean(self.losses[r])) if self.losses[r] else float("nan"),
                "steps_per_second": (self.step - self.start_step) / max(elapsed, 1e-9), "runs_in_process": self.R})
            self.losses[r] = []
        if log:
            log(f"{self.cfg.env_id} step {self.step:,}: eval " + " ".join(f"{x:.1f}" for x in returns))
        if dirs is not None:
            self.save(dirs)  # first: metrics.csv never runs ahead of the checkpoint a resume starts from
            for r, d in enumerate(dirs):
                write_metrics(d, self.rows[r])

    # -- checkpoints ---------------------------------------------------------------------------------
    def save(self, dirs: Sequence[Path]) -> None:
        """Each run's complete state into ``dirs[r]/checkpoint``: networks, optimisers, replay buffer
        (perx's format), random generator, environment, counters and metrics rows.

        Atomic for the group: a generation is ``buffer-<step>.npz`` + ``state-<step>.pt`` (written to a
        temporary name, then renamed). Every run's new generation is written before any old one is
        removed, so a process killed at any instant leaves every run with the old generation, or every run
        with the new one; :meth:`load` takes the newest step all runs hold."""
        step = self.step
        for r, d in enumerate(dirs):
            ck = d / "checkpoint"
            ck.mkdir(parents=True, exist_ok=True)
            buffer_name = f"buffer-{step}.npz"
            _fault_point("buffer", r)
            self.buffers[r].save(ck / buffer_name)
            state = {
                "step": step, "updates": self.updates, "buffer": buffer_name,
                "nets": {k: n.run_state(r) for k, n in self.nets.items()},
                "optimizers": {k: o.run_state(r) for k, o in self.optimizers.items()},
                "rng": self.rngs[r].bit_generator.state, "env": env_state(self.envs.envs[r]),
                "obs": self.obs[r].copy(), "episodes": int(self.episodes[r]), "running": float(self.running[r]),
                "recent": list(self.recent[r]), "rows": list(self.rows[r]),
                "config": dataclasses.asdict(self.configs[r]), **self.extra_state(r),
            }
            tmp = ck / f"state-{step}.pt.tmp"
            torch.save(state, tmp)
            _fault_point("state written", r)
            os.replace(tmp, ck / f"state-{step}.pt")
            _fault_point("state renamed", r)
        # every run holds generation `step` now: the older ones (and leftovers of killed saves) can go
        keep = {f"buffer-{step}.npz", f"state-{step}.pt"}
        for r, d in enumerate(dirs):
            _fault_point("cleanup", r)
            for old in (d / "checkpoint").iterdir():
                if old.name not in keep and (old.name.startswith(("state", "buffer-"))):
                    old.unlink()

    def extra_state(self, r: int) -> dict:
        return {}

    def load_extra_state(self, r: int, state: dict) -> None:
        pass

    def load(self, dirs: Sequence[Path]) -> bool:
        """Restore every run from the newest checkpoint generation that all of them hold (see :meth:`save`);
        False (nothing changed) when none of them has one. Checkpoints are this runner's own files (they
        hold pickled environments)."""
        generations = [checkpoint_generations(d / "checkpoint") for d in dirs]
        if not any(generations):
            return False
        missing = [str(d) for d, g in zip(dirs, generations, strict=True) if not g]
        if missing:
            raise ValueError(f"checkpoints: some runs of this lockstep group have none ({missing}); the group "
                             f"cannot resume together. Remove the group's checkpoints to start it again")
        common = set.intersection(*(set(g) for g in generations))
        if not common:
            steps = {str(d): sorted(g) for d, g in zip(dirs, generations, strict=True)}
            raise ValueError(f"checkpoints: the runs of this lockstep group stopped at different steps {steps}; "
                             f"remove the group's checkpoints to start it again")
        step = max(common)
        states = [torch.load(g[step], weights_only=False) for g in generations]
        envs = []
        for r, (d, st) in enumerate(zip(dirs, states, strict=True)):
            if not same_config(st["config"], self.configs[r]):
                raise ValueError(f"{d}: the checkpoint was made with another configuration")
            self.buffers[r] = perx.ReplayBuffer.load(d / "checkpoint" / st["buffer"])
            for k, n in self.nets.items():
                n.load_run_state(r, st["nets"][k])
            for k, o in self.optimizers.items():
                o.load_run_state(r, st["optimizers"][k])
            self.rngs[r].bit_generator.state = st["rng"]
            envs.append(restore_env(st["env"]))
            self.episodes[r], self.running[r] = st["episodes"], st["running"]
            self.recent[r], self.rows[r] = st["recent"], st["rows"]
            self.load_extra_state(r, st)
        self.step, self.updates = states[0]["step"], states[0]["updates"]
        self.start_step = self.step
        self.envs.close()
        self.envs = gym.vector.SyncVectorEnv([lambda e=e: e for e in envs],
                                             autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.recorder = VectorRecorder(self.buffers, self.envs)
        self.recorder.obs = np.stack([st["obs"] for st in states])
        self.obs = self.recorder.obs.copy()
        return True

    def begin(self, dirs: Sequence[Path] | None) -> None:
        """Resume from the checkpoints in ``dirs``, or start fresh (and write each run's config.json)."""
        if dirs is None or not self.load(dirs):
            self.start()
            if dirs is not None:
                for d, cfg in zip(dirs, self.configs, strict=True):
                    write_config(d, cfg, self, dirs)
        self.started = time.time()

    def finish(self, dirs: Sequence[Path] | None) -> None:
        if dirs is not None and self.step == self.cfg.total_steps:
            for d in dirs:
                (d / "done").write_text(json.dumps({"step": self.step}))
        self.envs.close()


def keeps_priorities(buffer: Any) -> bool:
    """Whether the agent sends priorities back to ``buffer``: every sampler but ``perx.Uniform`` uses them (a
    buffer without a perx sampler, another library's prioritized buffer, does)."""
    return not isinstance(getattr(buffer, "sampler", None), perx.Uniform)


def _fault_point(stage: str, run: int) -> None:
    """Called at each step of a checkpoint save (tests replace it to kill the save there)."""


def checkpoint_generations(ck: Path) -> dict[int, Path]:
    """{step: state file} of the complete checkpoint generations in ``ck``: ``state-<step>.pt`` whose buffer
    file exists, and the single ``state.pt`` that checkpoints before group-atomic saves wrote."""
    out: dict[int, Path] = {}
    if not ck.is_dir():
        return out
    for path in ck.glob("state-*.pt"):
        step = path.name[len("state-"):-len(".pt")]
        if step.isdigit() and (ck / f"buffer-{step}.npz").exists():
            out[int(step)] = path
    legacy = ck / "state.pt"
    if legacy.exists():
        st = torch.load(legacy, weights_only=False)
        if (ck / st["buffer"]).exists():
            out.setdefault(int(st["step"]), legacy)
    return out


def same_config(saved: dict, cfg: Any) -> bool:
    """A saved config equals ``cfg``; a field added since it was saved must hold its default there."""
    now = dataclasses.asdict(cfg)
    saved = renamed(saved)
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    return all(saved[k] == v if k in saved else v == defaults[k] for k, v in now.items()) and saved.keys() <= now.keys()


def env_state(env: Any) -> dict:
    """Everything needed to continue ``env`` exactly. Pickling keeps the wrappers' state, but Gymnasium's
    MuJoCo and ale-py's Atari environments pickle only their constructor arguments (``EzPickle``): their
    simulator state and random generator are saved on their own."""
    u = env.unwrapped
    state: dict[str, Any] = {"pickle": pickle.dumps(env)}
    rng = getattr(u, "_np_random", None)
    if rng is not None:
        state["np_random"] = (type(rng.bit_generator).__name__, rng.bit_generator.state)
    if hasattr(u, "model") and hasattr(u, "data"):  # MuJoCo: the complete integration state
        import mujoco

        kind = mujoco.mjtState.mjSTATE_INTEGRATION
        buf = np.empty(mujoco.mj_stateSize(u.model, kind))
        mujoco.mj_getState(u.model, u.data, buf, kind)
        state["mujoco"] = buf
    if hasattr(u, "ale"):  # Atari: the emulator, its random generator included
        state["ale"] = u.ale.cloneState(include_rng=True)
    return state


def restore_env(state: dict) -> Any:
    """The environment :func:`env_state` saved, in exactly that state."""
    env = pickle.loads(state["pickle"])
    u = env.unwrapped
    if "np_random" in state:
        name, rng_state = state["np_random"]
        bit_generator = getattr(np.random, name)()
        bit_generator.state = rng_state
        u._np_random = np.random.Generator(bit_generator)
    if "mujoco" in state:
        import mujoco

        mujoco.mj_setState(u.model, u.data, state["mujoco"], mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(u.model, u.data)
    if "ale" in state:
        u.ale.restoreState(state["ale"])
    return env


class flush_denormals:
    """Optimiser statistics of parameters whose gradient is 0 decay into subnormal floats, which are slow
    on x86 (measured: the stacked RMSprop step took twice as long); flush them to 0 while training, and
    put the processor's mode back afterwards (it is global state)."""

    def __enter__(self):
        self.was = bool((torch.tensor([1e-40], dtype=torch.float32) * 1.0).item() == 0.0)
        torch.set_flush_denormal(True)

    def __exit__(self, *exc):
        torch.set_flush_denormal(self.was)


def progress_bar(progress: bool, total: int, initial: int, desc: str):
    if not progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the agents extra
        return None
    return tqdm(total=total, initial=initial, desc=desc, unit="step", mininterval=2.0, leave=False)


def write_metrics(d: Path, rows: list[dict], columns: Sequence[str] = METRICS) -> None:
    """``d/metrics.csv`` with ``columns`` of ``rows``, replaced atomically."""
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "metrics.csv.tmp"
    with open(tmp, "w") as f:
        f.write(",".join(columns) + "\n")
        for row in rows:
            f.write(",".join(f"{row[k]:.6g}" if isinstance(row[k], float) else str(row[k]) for k in columns) + "\n")
    os.replace(tmp, d / "metrics.csv")


def versions() -> dict[str, str]:
    """Versions of what the results depend on, and the git revision of the working tree."""
    import importlib.metadata as md

    out = {"python": platform.python_version(), "platform": platform.platform(), "perx": perx.__version__,
           "numpy": np.__version__, "torch": torch.__version__, "gymnasium": gym.__version__}
    for name in ("minatar", "ale-py", "mujoco", "numba", "llvmlite"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    try:
        here = Path(__file__).parent
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=here)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5, cwd=here)
        if rev.returncode == 0:
            out["git"] = rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return out


#: x86-64 micro-architecture levels (the psABI's), by the CPU features each adds.
def machine() -> dict[str, Any]:
    """What the numbers of a run depend on besides the code: :func:`perx.host.describe` (the CPU, the target
    numba compiles the kernels for, the instruction-set level) and the vector code torch dispatches to. Two
    machines that differ here may round differently, and a training run then takes another path."""
    out: dict[str, Any] = {**perx.host.describe(), "torch_threads": torch.get_num_threads()}
    try:
        out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # pragma: no cover - older torch
        pass
    return out


def write_config(d: Path, cfg: Any, runs: LockstepRuns, dirs: Sequence[Path] | None = None) -> None:
    """config.json: the config, its resolved settings, versions, the machine, and the lockstep partners
    (``lockstep``: variant/seed of each; ``lockstep_runs``: each partner's ``<label>/seed=<s>`` folder, unique
    where several runs share a variant, as named grid cells do)."""
    d.mkdir(parents=True, exist_ok=True)
    payload = {"config": dataclasses.asdict(cfg), "settings": cfg.settings(), "versions": versions(),
               "machine": {**machine(), "device": cfg.device},
               "lockstep": [f"{c.variant}/seed={c.seed}" for c in runs.configs]}
    if dirs is not None:
        payload["lockstep_runs"] = [f"{Path(x).parent.name}/{Path(x).name}" for x in dirs]
    (d / "config.json").write_text(json.dumps(payload, indent=2) + "\n")
