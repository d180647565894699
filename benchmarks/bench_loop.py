"""The replay buffer's cost inside a TD3-style training loop, ``perx bench-loop`` (issue 14).

A micro-benchmark times the buffer alone, with its arrays hot in the caches. Inside a training loop the
networks' work evicts them, so each buffer call costs more. This loop is TD3's (004 Table 6: a 256-256 actor,
two 256-256 critics, batch 256, one critic update per step, the actor every second one) on a fake
environment (random observations, so nothing but the networks and the buffer runs), with the buffer filled
to ``N`` transitions first. Every buffer call (add, sample, update of the priorities) is timed inside the
loop; the table gives the buffer's microseconds per step, the step time, and the prioritized buffer's extra
time over perx.Uniform's as a share of the uniform step, all from interleaved rounds of one process.
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
from bench_td3_overhead import TD3

OBS, ACT = 17, 6  # Hopper-like sizes; float32


class _Perx:
    def __init__(self, sampler, capacity: int, seed: int, reuse: bool = False) -> None:
        import perx

        self.reuse = reuse  # sample(out=...): refill the previous batch in place
        self.batch = None

        self.buf = perx.ReplayBuffer(capacity, sampler, seed=seed, spec={
            "obs": ((OBS,), np.float32), "action": ((ACT,), np.float32), "reward": ((), np.float32),
            "next_obs": ((OBS,), np.float32), "not_done": ((), np.float32)})
        self.prioritized = not isinstance(sampler, perx.Uniform)

    def fill(self, data: dict) -> None:
        self.buf.extend(**data)

    def add(self, obs, act, rew, nxt, not_done) -> None:
        self.buf.add(obs=obs, action=act, reward=rew, next_obs=nxt, not_done=not_done)

    def sample(self, b: int, beta: float):
        if self.reuse and self.batch is not None:
            batch = self.buf.sample(b, beta=beta, out=self.batch)
        else:
            batch = self.buf.sample(b, beta=beta)
        self.batch = batch
        return (batch["obs"], batch["action"], batch["reward"], batch["next_obs"], batch["not_done"],
                batch.weights, batch.indices)

    def update(self, idx, prio) -> None:
        self.buf.update_priorities(idx, prio)


class _Cpprb:
    prioritized = True

    def __init__(self, capacity: int) -> None:
        import cpprb

        env = {"obs": {"shape": OBS}, "act": {"shape": ACT}, "rew": {}, "next_obs": {"shape": OBS}, "not_done": {}}
        self.buf = cpprb.PrioritizedReplayBuffer(capacity, env, alpha=0.6, eps=1e-6)

    def fill(self, data: dict) -> None:
        self.buf.add(obs=data["obs"], act=data["action"], rew=data["reward"], next_obs=data["next_obs"],
                     not_done=data["not_done"])

    def add(self, obs, act, rew, nxt, not_done) -> None:
        self.buf.add(obs=obs, act=act, rew=rew, next_obs=nxt, not_done=not_done)

    def sample(self, b: int, beta: float):
        s = self.buf.sample(b, beta=beta)
        return s["obs"], s["act"], s["rew"][:, 0], s["next_obs"], s["not_done"][:, 0], s["weights"], s["indexes"]

    def update(self, idx, prio) -> None:
        self.buf.update_priorities(idx, prio + 1e-6)


def make(name: str, capacity: int, seed: int):
    import perx

    reuse = name.endswith(" out=")
    if name.removesuffix(" out=") == "perx.Uniform":
        return _Perx(perx.Uniform(), capacity, seed, reuse)
    if name.removesuffix(" out=") == "perx.Proportional":
        return _Perx(perx.Proportional(alpha=0.6, normalize="buffer"), capacity, seed, reuse)
    if name == "cpprb PER":
        return _Cpprb(capacity)
    raise ValueError(f"name: unknown buffer {name!r}")


class _Timed:
    """The buffer with a clock around each call; ``seconds`` accumulates the time spent inside it."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.seconds = 0.0

    def __getattr__(self, name):
        fn = getattr(self.inner, name)

        def call(*args):
            t0 = time.perf_counter()
            out = fn(*args)
            self.seconds += time.perf_counter() - t0
            return out

        return call


def _fill_data(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((n, OBS), dtype=np.float32),
            "action": rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
            "reward": rng.standard_normal(n, dtype=np.float32),
            "next_obs": rng.standard_normal((n, OBS), dtype=np.float32),
            "not_done": (rng.random(n) > 0.01).astype(np.float32)}


def _round(agent, buf: _Timed, prioritized: bool, steps: int, rng, sync) -> tuple[float, float]:
    """(seconds per step, buffer seconds per step) over ``steps`` steps of act + add + one update, with the TD3
    of ``perx bench-td3`` (its IS-weighted MSE for the prioritized buffers)."""
    variant = "per" if prioritized else "uniform"
    buf.seconds = 0.0
    obs = rng.standard_normal(OBS, dtype=np.float32)
    t0 = time.perf_counter()
    for t in range(steps):
        a = np.clip(agent.act(obs) + rng.normal(0, 0.1, ACT), -1, 1).astype(np.float32)
        nxt = rng.standard_normal(OBS, dtype=np.float32)
        buf.add(obs, a, float(rng.standard_normal()), nxt, 1.0)
        obs = nxt
        agent.train(buf, variant, 0.4 + 0.6 * t / steps)
    sync()
    return (time.perf_counter() - t0) / steps, buf.seconds / steps


NAMES = ("perx.Uniform", "perx.Proportional", "perx.Uniform out=", "perx.Proportional out=", "cpprb PER")


def run(n: int = 1_000_000, steps: int = 500, rounds: int = 5, device: str | None = None, seed: int = 0,
        log=print) -> dict:
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    data = _fill_data(n, seed)
    setups, skipped = {}, {}
    for name in NAMES:
        try:
            inner = make(name, n + steps * rounds + 1, seed)
        except ImportError as err:
            skipped[name] = f"not installed ({err.name or err})"
            continue
        inner.fill(data)
        setups[name] = (TD3(OBS, ACT, 1.0, seed, device=dev), _Timed(inner), inner.prioritized,
                        np.random.default_rng(seed))
    for agent, buf, prio, rng in setups.values():  # warm-up: kernels compiled, CUDA initialised
        _round(agent, buf, prio, 20, rng, sync)
    times = {name: {"step": [], "buffer": []} for name in setups}
    for r in range(rounds):
        for name, (agent, buf, prio, rng) in setups.items():
            step, bufs = _round(agent, buf, prio, steps, rng, sync)
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
    lines = ["# Buffer time inside a TD3-style loop", "", f"Command: `{command}`", "",
             f"{where}; torch {result['torch']}, perx {perx.__version__}. Buffer filled to N = {result['n']:,}; "
             f"{result['rounds']} interleaved rounds of {result['steps']} steps (act, add, one critic update with "
             "batch 256, the actor every second step); medians over rounds. Buffer time = the add, sample and "
             "priority-update calls, timed inside the loop. Extra = (buffer time - perx.Uniform's buffer time) / "
             "perx.Uniform's step time; for the `out=` rows (each sample refills the previous batch in place) "
             "against `perx.Uniform out=`.", "",
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
