"""perx inside Stable-Baselines3: training steps per second of SB3's DQN and SAC with SB3's own replay buffer
against perx.sb3 with uniform, per and lap replay (issue 37, item 8).

Same hyperparameters for every configuration of an algorithm, one torch thread, rounds interleaved (every
configuration once per round, in a rotated order) so that the machine's load changes hit all of them alike;
the table gives each configuration's median over rounds and its ratio to SB3's own buffer in the same round
(median of the per-round ratios). Timed: ``learn(steps)`` after a warm-up that fills ``learning_starts``
transitions and compiles perx's kernels, so the time is the training loop's (acting, storing, sampling,
the update, priority writes).

    python benchmarks/bench_sb3.py --out results/sb3_bench.md            # ~15 minutes on this 2-core machine
    python benchmarks/bench_sb3.py --rounds 2 --steps 500                # a quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import stable_baselines3 as sb3
import torch

import perx.sb3

ALGOS = {
    # env, SB3 class, perx class, keyword arguments shared by every configuration
    "DQN": ("CartPole-v1", sb3.DQN, perx.sb3.DQN,
            {"learning_starts": 1000, "train_freq": 4, "batch_size": 32, "buffer_size": 50_000,
             "policy_kwargs": {"net_arch": [64, 64]}}),
    "SAC": ("Pendulum-v1", sb3.SAC, perx.sb3.SAC,
            {"learning_starts": 1000, "train_freq": 1, "gradient_steps": 1, "batch_size": 256,
             "buffer_size": 50_000, "policy_kwargs": {"net_arch": [64, 64]}}),
}
CONFIGS = ("sb3", "perx uniform", "perx per", "perx lap")


def make(algo: str, config: str, seed: int):
    env_id, sb3_cls, perx_cls, kw = ALGOS[algo]
    env = gym.make(env_id)
    if config == "sb3":
        return sb3_cls("MlpPolicy", env, seed=seed, **kw)
    return perx_cls("MlpPolicy", env, replay=config.split()[1], seed=seed, **kw)


def time_learn(algo: str, config: str, steps: int, seed: int) -> float:
    """Steps per second of ``learn(steps)`` after a warm-up of learning_starts + 100 steps."""
    model = make(algo, config, seed)
    model.learn(ALGOS[algo][3]["learning_starts"] + 100)
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return steps / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000, help="timed environment steps per configuration")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    parser.add_argument("--out", default="runs/sb3_bench.md", help="markdown table (default runs/sb3_bench.md)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rates: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for algo in args.algos:
            order = CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]  # rotated: no fixed position
            for config in order:
                rate = time_learn(algo, config, args.steps, seed=r)
                rates.setdefault((algo, config), []).append(rate)
                print(f"round {r + 1}/{args.rounds} {algo} {config}: {rate:.0f} steps/s", flush=True)
    load = os.getloadavg()
    lines = ["# perx.sb3 against SB3's own replay buffer", "",
             f"`python benchmarks/bench_sb3.py --steps {args.steps} --rounds {args.rounds}`; stable-baselines3 "
             f"{sb3.__version__}, torch {torch.__version__}, one torch thread; {args.steps} timed steps per run "
             f"after a {'/'.join(str(ALGOS[a][3]['learning_starts'] + 100) for a in args.algos)}-step warm-up; "
             f"median over {args.rounds} interleaved rounds; ratio: median of the per-round ratios to SB3's own "
             f"buffer (below 1: slower). Load average at the end: {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}.", "",
             "| algorithm | replay | steps per second | ratio to SB3's buffer | rounds |", "|---|---|---|---|---|"]
    for algo in args.algos:
        base = rates[algo, "sb3"]
        for config in CONFIGS:
            vals = rates[algo, config]
            ratio = statistics.median(v / b for v, b in zip(vals, base, strict=True))
            lines.append(f"| {algo} ({ALGOS[algo][0]}) | {config} | {statistics.median(vals):.0f} | {ratio:.3f} | "
                         + ", ".join(f"{v:.0f}" for v in vals) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
