"""The cost of replay inside the Double DQN loop, and the throughput of lockstep runs (``perx bench-agents``).

1. Each variant's environment steps per second against ``uniform``, one run per process (R = 1), the
   same budget, in interleaved rounds on the same machine (004 Table 3 reports +13.7% run time for its
   own PER, +75% and +229% for Dopamine's and OpenAI baselines').
2. Aggregate throughput on this machine: ``workers`` processes at once, each training one run, against
   ``workers`` processes each training ``group`` runs in lockstep.

Steps are timed after ``learning_starts`` (the random warm-up is excluded) and without evaluations.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

from perx.agents.dqn import VARIANTS, DQNConfig

WARMUP = 1000
#: The single-run MinAtar rate issue 10 states as its baseline (steps/s on one core of this machine).
ISSUE_RATE = 670


def _timed(args: tuple[list[dict], int]) -> float:
    """Run-steps per second of training ``configs`` in lockstep for ``steps`` steps after the warm-up."""
    from perx.agents.dqn import train

    kwargs, steps = args
    configs = [DQNConfig(**k) for k in kwargs]
    marks = {}

    def on_update(step, losses):
        if "start" not in marks:
            marks["start"] = (step, time.perf_counter())
        marks["end"] = (step, time.perf_counter())

    train(configs, on_update=on_update, stop_after=WARMUP + steps)
    (s0, t0), (s1, t1) = marks["start"], marks["end"]
    return len(configs) * (s1 - s0) / (t1 - t0)


def base(env_id: str, **kw) -> dict:
    return {"env_id": env_id, "total_steps": 10**9, "learning_starts": WARMUP, "eval_every": 10**9, **kw}


def run(env_id: str = "MinAtar/Breakout-v0", steps: int = 5000, rounds: int = 3, workers: int = 2,
        group: int = 15, lockstep_steps: int = 2000, log=print) -> dict:
    per_variant: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for v in VARIANTS:  # interleaved, so that load changes hit every variant alike
            per_variant[v].append(_timed(([base(env_id, variant=v, seed=r)], steps)))
            log(f"round {r}: {v} {per_variant[v][-1]:.0f} steps/s")
    ctx = mp.get_context("spawn")
    variants = list(VARIANTS)
    with ctx.Pool(workers) as pool:
        single = pool.map(_timed, [([base(env_id, variant="per", seed=w)], steps) for w in range(workers)])
    log(f"{workers} processes x 1 run: {sum(single):.0f} run-steps/s")
    with ctx.Pool(workers) as pool:
        jobs = [([base(env_id, variant=variants[i % len(variants)], seed=w * group + i) for i in range(group)],
                 lockstep_steps) for w in range(workers)]
        lock = pool.map(_timed, jobs)
    log(f"{workers} processes x {group} runs in lockstep: {sum(lock):.0f} run-steps/s")
    return {"per_variant": per_variant, "single": single, "lockstep": lock, "env": env_id, "steps": steps,
            "rounds": rounds, "workers": workers, "group": group, "lockstep_steps": lockstep_steps,
            "load": os.getloadavg()}


def table(result: dict, command: str) -> str:
    med = {v: statistics.median(x) for v, x in result["per_variant"].items()}
    uni = med["uniform"]
    lines = ["# The cost of replay in the Double DQN loop, and lockstep throughput", "",
             f"Command: `{command}`", "",
             f"{result['env']}, K = 4 (one update per 4 steps), batch 32, MinAtar network, one torch thread per "
             f"process, on this 2-core machine; {result['steps']:,} steps after a {WARMUP:,}-step random warm-up, "
             f"timed per run; median of {result['rounds']} interleaved rounds. Load average after: "
             f"{'/'.join(f'{x:.2f}' for x in result['load'])}.", "",
             "| variant | env steps per second | run time vs uniform | rounds |", "|---|---|---|---|"]
    for v, m in med.items():
        rounds = ", ".join(f"{x:.0f}" for x in result["per_variant"][v])
        lines.append(f"| {v} | {m:.0f} | {100 * (uni / m - 1):+.1f}% | {rounds} |")
    single, lock = sum(result["single"]), sum(result["lockstep"])
    lines += ["", "004 Table 3 (TD3 on a GPU, for scale): its own PER +13.7% run time over uniform, Dopamine's "
              "+75.2%, OpenAI baselines' +229.4%.", "",
              "| aggregate over the machine | run-steps per second | ratio |", "|---|---|---|",
              f"| {result['workers']} processes x 1 run (per) | {single:.0f} | 1.00x |",
              f"| {result['workers']} processes x {result['group']} runs in lockstep (all variants) | {lock:.0f} | "
              f"{lock / single:.2f}x |", "",
              f"Against issue 10's one-run-per-core rate (670 steps/s, measured before this agent existed) on "
              f"{result['workers']} cores, {ISSUE_RATE * result['workers']:,} run-steps/s: lockstep "
              f"{lock / (ISSUE_RATE * result['workers']):.2f}x, single runs "
              f"{single / (ISSUE_RATE * result['workers']):.2f}x."]
    return "\n".join(lines) + "\n"


#: Where ``perx bench-agents`` writes its table unless ``--out`` says otherwise: a folder git ignores, so a run
#: never replaces the committed results/agents_bench.md (``--out results/agents_bench.md`` does).
DEFAULT_OUT = "runs/agents_bench.md"


def build_parser(prog: str = "perx bench-agents") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="MinAtar/Breakout-v0")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--group", type=int, default=15)
    parser.add_argument("--lockstep-steps", type=int, default=2000)
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="write the markdown table to this file too (default: %(default)s, which git ignores)")
    return parser


def main(argv: list[str] | None = None, prog: str = "perx bench-agents") -> int:
    args = build_parser(prog).parse_args(argv)
    result = run(args.env, args.steps, args.rounds, args.workers, args.group, args.lockstep_steps)
    text = table(result, " ".join([prog, *(argv if argv is not None else sys.argv[1:])]))
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python benchmarks/bench_agents.py"))
