"""Per-update losses of a fixed lockstep group, to compare two versions of perx's agents run by run.

    python benchmarks/loss_trace.py new.npy
    PYTHONPATH=<other checkout>/src python benchmarks/loss_trace.py old.npy
    python benchmarks/loss_trace.py --compare old.npy new.npy

Five MinAtar Breakout runs (uniform, per, rank, lap, pal; seeds 0-4), updates from step 500, 60 updates.
``--compare`` prints the largest relative difference between the two traces at a few updates.
"""

import argparse

import numpy as np


def trace(path: str, updates: int = 60) -> None:
    from perx.agents import dqn

    configs = [dqn.DQNConfig(env_id="MinAtar/Breakout-v0", variant=v, seed=s, total_steps=10**6, learning_starts=500,
                             eval_every=10**9)
               for s, v in enumerate(("uniform", "per", "rank", "lap", "pal"))]
    losses = []
    dqn.train(configs, on_update=lambda step, lo: losses.append(np.array(lo, np.float64)),
              stop_after=500 + 4 * (updates - 1))
    np.save(path, np.array(losses))


def compare(a_path: str, b_path: str) -> None:
    a, b = np.load(a_path), np.load(b_path)
    rel = np.abs(a - b) / np.maximum(np.abs(a), 1e-12)
    for u in (0, 1, 2, 5, 10, 20, 40, len(a) - 1):
        print(f"update {u + 1}: largest relative difference over the runs {rel[u].max():.1e}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--compare", action="store_true")
    args = parser.parse_args()
    compare(*args.paths) if args.compare else trace(args.paths[0])
