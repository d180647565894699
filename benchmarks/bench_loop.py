"""The replay buffer's cost inside a TD3-style training loop, ``perx bench-loop`` (issue 14).

A micro-benchmark times the buffer alone, with its arrays hot in the caches. Inside a training loop the
networks' work evicts them, so each buffer call costs more. This loop is perx's TD3 (``perx.agents.td3.train``,
004 Table 6: a 256-256 actor, two 256-256 critics, batch 256, one critic update per step, the actor every
second one) on HalfCheetah-v5 (whose steps cost a few percent of an update), with the buffer filled to ``N``
random transitions first, so learning starts at once. The perx rows use the agent's own buffer (episodic
layout); the ``out=`` rows a plain-layout buffer whose samples refill one batch in place (``sample(out=)``
needs the plain layout). Every buffer call (add, sample, update of the priorities) is timed inside the loop;
the table gives the buffer's microseconds per step, the step time, and the prioritized buffer's extra time
over perx.Uniform's as a share of the uniform step, all from interleaved rounds of one process.
Networks run on CUDA when it is available (``--device``), else on one CPU thread.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench_buffer import cpu_model

ENV = "HalfCheetah-v5"  # 17 float observations, 6 actions


class _Perx:
    """The agent's own buffer (what ``perx.agents.runner`` makes: ``perx.Episodes``, next observations shared)
    with the variant's sampler."""

    def __init__(self, sampler, capacity: int, seed: int) -> None:
        import perx

        self.buf = perx.ReplayBuffer(capacity, sampler, seed=seed,
                                     episodes=perx.Episodes(n_step=1, gamma=0.99, next_obs="shared"))

    def __getattr__(self, name):  # episodes, sampler, end_episodes, extend, sample, update_priorities
        return getattr(self.buf, name)


class _PerxOut:
    """A plain-layout perx buffer holding what the agent samples (``return``, ``discount``), each sample
    refilling the previous batch in place (``sample(out=)``, which needs the plain layout)."""

    def __init__(self, sampler, capacity: int, seed: int, gamma: float = 0.99) -> None:
        import perx

        self.gamma = gamma
        self.batch = None
        self.buf = perx.ReplayBuffer(capacity, sampler, seed=seed, spec={
            "obs": ((17,), np.float32), "action": ((6,), np.float32), "return": ((), np.float32),
            "next_obs": ((17,), np.float32), "discount": ((), np.float32)})

    def __getattr__(self, name):  # sampler, update_priorities, priorities
        return getattr(self.buf, name)

    def extend(self, *, obs, action, reward, next_obs, terminated, truncated):
        return self.buf.extend(obs=obs, action=action, next_obs=next_obs, **{"return": reward},
                               discount=self.gamma * (1.0 - np.asarray(terminated, np.float32)))

    def sample(self, b: int, *, beta: float):
        self.batch = self.buf.sample(b, beta=beta, out=self.batch)
        return self.batch


def make(name: str, capacity: int, seed: int):
    """The buffer of a table row: perx's (the TD3 variant's sampler) or cpprb's behind the agent's interface."""
    from perx.agents import td3

    reuse = name.endswith(" out=")
    base = name.removesuffix(" out=")
    if base in ("perx.Uniform", "perx.Proportional"):
        variant = "uniform" if base == "perx.Uniform" else "per"
        sampler = td3.make_sampler(td3.TD3Config(variant=variant))
        return _PerxOut(sampler, capacity, seed) if reuse else _Perx(sampler, capacity, seed)
    if name == "cpprb PER":
        from _peers import CpprbPER

        return CpprbPER(capacity, eps=1e-6)
    raise ValueError(f"name: unknown buffer {name!r}")


class _Timed:
    """The buffer with a clock around each call the agent makes to store, sample and update; ``seconds``
    accumulates the time spent inside them. Everything else passes through untimed."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.seconds = 0.0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _timed(self, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.seconds += time.perf_counter() - t0
        return out

    def extend(self, **fields):
        return self._timed(self.inner.extend, **fields)

    def sample(self, b: int, *, beta: float):
        return self._timed(self.inner.sample, b, beta=beta)

    def update_priorities(self, indices, priorities) -> None:
        self._timed(self.inner.update_priorities, indices, priorities)


def _fill_data(n: int, seed: int, obs_dim: int = 17, act_dim: int = 6, episode: int = 1000) -> dict:
    """``n`` random transitions in episodes of ``episode`` steps (cut by a time limit), each next observation
    the following observation, as an environment would give them."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n + 1, obs_dim), dtype=np.float32)
    truncated = (np.arange(n) + 1) % episode == 0
    return {"obs": obs[:-1], "action": rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
            "reward": rng.standard_normal(n, dtype=np.float32), "next_obs": obs[1:],
            "terminated": np.zeros(n, np.bool_), "truncated": truncated}


def _round(variant: str, buf: _Timed, steps: int, seed: int, device: str, sync,
           capacity: int) -> tuple[float, float]:
    """(seconds per step, buffer seconds per step): ``perx.agents.td3.train`` for ``steps`` steps on ``buf``
    (already full: learning starts at once), timed from its first update to its last."""
    from perx.agents import td3

    cfg = td3.TD3Config(env_id=ENV, variant=variant, seed=seed, total_steps=steps, start_steps=0,
                        capacity=capacity, eval_every=steps,
                        eval_episodes=1, eval_max_steps=1, device=device)
    marks: list[tuple[float, float]] = []

    def on_update(step: int, losses: np.ndarray) -> None:
        sync()
        marks.append((time.perf_counter(), buf.seconds))

    td3.train(cfg, buffers=[buf], on_update=on_update)
    (t0, b0), (t1, b1) = marks[0], marks[-1]
    return (t1 - t0) / (len(marks) - 1), (b1 - b0) / (len(marks) - 1)


NAMES = ("perx.Uniform", "perx.Proportional", "perx.Uniform out=", "perx.Proportional out=", "cpprb PER")


def run(n: int = 1_000_000, steps: int = 500, rounds: int = 5, device: str | None = None, seed: int = 0,
        log=print) -> dict:
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    data = _fill_data(n, seed)
    capacity = n + (steps + 20) * (rounds + 1)
    setups, skipped = {}, {}
    for name in NAMES:
        try:
            inner = make(name, capacity, seed)
        except ImportError as err:
            skipped[name] = f"not installed ({err.name or err})"
            continue
        inner.extend(**data)
        setups[name] = ("uniform" if name.startswith("perx.Uniform") else "per", _Timed(inner))
    for variant, buf in setups.values():  # warm-up: kernels compiled, CUDA initialised
        _round(variant, buf, 20, seed, device, sync, capacity)
    times = {name: {"step": [], "buffer": []} for name in setups}
    for r in range(rounds):
        for name, (variant, buf) in setups.items():
            step, bufs = _round(variant, buf, steps, seed + r, device, sync, capacity)
            times[name]["step"].append(step)
            times[name]["buffer"].append(bufs)
            log(f"round {r + 1}/{rounds} {name}: step {step * 1e3:.2f} ms, buffer {bufs * 1e6:.1f} us")
    return {"times": times, "skipped": skipped, "n": n, "steps": steps, "rounds": rounds, "device": str(dev),
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
            "torch": torch.__version__}


def table(result: dict, command: str) -> str:
    import perx

    t = result["times"]
    med = {k: {m: statistics.median(v[m]) for m in ("step", "buffer")} for k, v in t.items()}
    where = result["gpu"] or f"CPU, one torch thread ({platform.machine()}, {cpu_model()})"
    lines = ["# Buffer time inside perx's TD3 loop", "", f"Command: `{command}`", "",
             f"{where}; torch {result['torch']}, perx {perx.__version__}. `perx.agents.td3.train` on {ENV}, buffer "
             f"filled to N = {result['n']:,}; {result['rounds']} interleaved rounds of {result['steps']} steps (act, "
             "add, one critic update with batch 256, the actor every second step); medians over rounds. The perx "
             "rows hold the agent's own (episodic) buffer, the `out=` rows a plain-layout one. Buffer time = the "
             "add, sample and priority-update calls, timed inside the loop. Extra = (buffer time - perx.Uniform's "
             "buffer time) / perx.Uniform's step time; for the `out=` rows (each sample refills the previous "
             "batch in place) against `perx.Uniform out=`.", "",
             "| buffer | buffer µs per step | step ms | extra over uniform | rounds: buffer µs |",
             "|---|---|---|---|---|"]
    for name, m in med.items():
        uni = med.get("perx.Uniform out=" if name.endswith(" out=") else "perx.Uniform")
        extra = "-" if uni is None or name.startswith("perx.Uniform") else \
            f"{(m['buffer'] - uni['buffer']) / uni['step'] * 100:+.2f}%"
        rounds = ", ".join(f"{x * 1e6:.0f}" for x in t[name]["buffer"])
        lines.append(f"| {name} | {m['buffer'] * 1e6:.1f} | {m['step'] * 1e3:.2f} | {extra} | {rounds} |")
    if result["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in result["skipped"].items())]
    return "\n".join(lines) + "\n"


#: Where ``perx bench-loop`` writes its table unless ``--out`` says otherwise: a folder git ignores, so a run never
#: replaces the committed results/loop_bench.md (``--out results/loop_bench.md`` does).
DEFAULT_OUT = "runs/loop_bench.md"


def build_parser(prog: str = "perx bench-loop") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000, help="transitions in the buffer before timing")
    p.add_argument("--steps", type=int, default=500, help="steps per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help="write the markdown table here too (default: %(default)s, which git ignores)")
    return p


def main(argv: list[str] | None = None, prog: str = "perx bench-loop") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog).parse_args(argv)
    result = run(args.n, args.steps, args.rounds, args.device)
    md = table(result, " ".join([prog, *argv]))
    print(md)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python benchmarks/bench_loop.py"))
