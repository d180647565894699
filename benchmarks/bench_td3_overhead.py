"""Run-time overhead of prioritized replay in TD3 (004 Appendix B, Table 3), ``perx bench-td3``.

perx's TD3 (``perx.agents.td3.train``: Table 6, two 256-256 critics, a 256-256 actor, batch 256, one update
per step), the same environment and number of steps; only the buffer and what the variant needs from it
change: perx uniform (the reference), perx PER / LAP / PAL, and where they install, cpprb's and Tianshou's
prioritized buffers behind the same agent for PER (benchmarks/_peers.py). Each configuration is timed in
interleaved rounds (after a random warm-up that fills the buffer; round r uses seed r for every row and
starts the order one row later); the table gives the median step time and, from the paired per-round
ratios to uniform, their median and a bootstrap 95% interval, beside the paper's GPU figures (+13.7% for its
own PER, +75.2% Dopamine, +229.4% OpenAI baselines).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

#: Each row of the table: the agent's variant and the buffer behind it (None: the variant's perx buffer).
ROWS: dict[str, tuple[str, str | None]] = {
    "uniform": ("uniform", None), "perx per": ("per", None), "perx lap": ("lap", None), "perx pal": ("pal", None),
    "cpprb per": ("per", "cpprb per"), "tianshou per": ("per", "tianshou per"),
}


def time_variant(name: str, env_id: str, warmup: int, steps: int, seed: int) -> float:
    """Seconds per environment step (act + store + one update) of ``perx.agents.td3.train``, after ``warmup``
    random steps: the time from its first update to its last, over the steps between them."""
    from _peers import PEERS
    from perx.agents import td3

    variant, peer = ROWS[name]
    capacity = warmup + steps + 1
    cfg = td3.TD3Config(env_id=env_id, variant=variant, seed=seed, total_steps=warmup + steps, start_steps=warmup,
                        capacity=capacity, eval_every=warmup + steps, eval_episodes=1, eval_max_steps=1)
    buffers = None if peer is None else [PEERS[peer](capacity, gamma=cfg.gamma)]
    stamps: list[float] = []

    def on_update(step: int, losses: np.ndarray) -> None:
        stamps.append(time.perf_counter())

    td3.train(cfg, buffers=buffers, on_update=on_update)
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


NAMES = tuple(ROWS)


def run(env_id: str = "Hopper-v5", warmup: int = 2000, steps: int = 2000, rounds: int = 10, log=print) -> dict:
    times: dict[str, list[float]] = {n: [] for n in NAMES}
    skipped = {}
    for r in range(rounds):
        k = r % len(NAMES)
        for name in NAMES[k:] + NAMES[:k]:  # interleaved rounds, each starting one row later
            if name in skipped:
                continue
            try:
                times[name].append(time_variant(name, env_id, warmup, steps, seed=r))
                log(f"round {r}: {name} {1e3 * times[name][-1]:.2f} ms per step")
            except ImportError as err:
                skipped[name] = f"not installed ({err.name})"
    from bench_buffer import cpu_model

    return {"times": {k: v for k, v in times.items() if v}, "skipped": skipped, "env": env_id, "warmup": warmup,
            "steps": steps, "rounds": rounds, "cpu": f"{cpu_model()} ({os.cpu_count()} cores)"}


def paired_interval(times: list[float], ref: list[float], level: float = 0.95, draws: int = 10_000,
                    seed: int = 0) -> tuple[float, float, float]:
    """Median over rounds of times[r] / ref[r] - 1 and a percentile-bootstrap interval of that median
    (rounds resampled with replacement; fixed seed)."""
    ratios = np.asarray(times) / np.asarray(ref) - 1.0
    rng = np.random.default_rng(seed)
    boot = np.median(ratios[rng.integers(0, len(ratios), (draws, len(ratios)))], axis=1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return float(np.median(ratios)), float(lo), float(hi)


def table(result: dict, command: str) -> str:
    t = result["times"]
    lines = ["# TD3 run time with each replay buffer (004 Appendix B, Table 3)", "", f"Command: `{command}`", "",
             f"{result['env']}, perx's TD3 (`perx.agents.td3`, 004 Table 6: one update per step, batch 256, 256-256 "
             f"networks, one torch thread), {result['steps']:,} steps timed after {result['warmup']:,} random ones, "
             f"{result['rounds']} interleaved rounds (round r: seed r for every row), {result.get('cpu', 'CPU')}; "
             "only the "
             "buffer (and the variant's loss/priority) changes. Run time vs uniform: the median over rounds of "
             "each round's ratio to uniform's time in that round, with a bootstrap 95% interval of that median.",
             "", "| buffer | ms per step (median) | run time vs uniform | 95% interval | rounds (ms) |",
             "|---|---|---|---|---|"]
    for name, v in t.items():
        rounds = ", ".join(f"{1e3 * x:.2f}" for x in v)
        if name == "uniform":
            cells = "(reference) | -"
        else:
            n = min(len(v), len(t["uniform"]))
            mid, lo, hi = paired_interval(v[:n], t["uniform"][:n])
            cells = f"{100 * mid:+.1f}% | {100 * lo:+.1f}% to {100 * hi:+.1f}%"
        lines.append(f"| {name} | {1e3 * statistics.median(v):.2f} | {cells} | {rounds} |")
    lines += ["", "004 Table 3 (TD3 on a GPU, the same comparison): the paper's own PER +13.7%, Dopamine's PER +75.2%, "
              "OpenAI baselines' PER +229.4% run time over uniform."]
    if result["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in result["skipped"].items())]
    return "\n".join(lines) + "\n"


#: Where ``perx bench-td3`` writes its table unless ``--out`` says otherwise: a folder git ignores, so a run never
#: replaces the committed results/td3_overhead.md (``--out results/td3_overhead.md`` does).
DEFAULT_OUT = "runs/td3_overhead.md"


def build_parser(prog: str = "perx bench-td3") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="write the markdown table to this file too (default: %(default)s, which git ignores)")
    return parser


def main(argv: list[str] | None = None, prog: str = "perx bench-td3") -> int:
    args = build_parser(prog).parse_args(argv)
    result = run(args.env, args.warmup, args.steps, args.rounds)
    text = table(result, " ".join([prog, *(argv if argv is not None else sys.argv[1:])]))
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python benchmarks/bench_td3_overhead.py"))
