"""Where a lockstep Double-DQN step goes: acting, environments, storing, and the update's parts.

    python benchmarks/bench_lockstep_parts.py --runs 15 --steps 1000
    python benchmarks/bench_lockstep_parts.py --runs 1 --steps 3000

MinAtar Breakout, the variants in turn (uniform, per, rank, lap, pal, hybrid), K = 4, batch 32, one torch
thread, after a 1,000-step random warm-up. Prints run-steps per second and milliseconds per lockstep step of
each part, then one update timed piece by piece (``--updates`` of them). To compare two versions of perx in
one session, run it with ``PYTHONPATH=<other checkout>/src`` in turn with this one.
"""

import argparse
import time
from collections import defaultdict

import numpy as np
import torch

from perx.agents import dqn
from perx.agents.runner import flush_denormals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    variants = list(dqn.VARIANTS)
    configs = [dqn.DQNConfig(env_id="MinAtar/Breakout-v0", variant=variants[i % len(variants)], seed=i,
                             total_steps=10**9, learning_starts=1000, eval_every=10**9) for i in range(args.runs)]
    parts = defaultdict(float)
    with flush_denormals():
        runs = dqn.Runs(configs)
        runs.begin(None)
        while runs.step < 1000:
            runs.env_step(runs.act(runs.obs, runs.epsilon()))
        start = time.perf_counter()
        for _ in range(args.steps):
            t0 = time.perf_counter()
            actions = runs.act(runs.obs, runs.epsilon())
            t1 = time.perf_counter()
            result = runs.envs.step(actions)
            t2 = time.perf_counter()
            runs.recorder.record(actions, *result)
            t3 = time.perf_counter()
            runs.obs = result[0]
            runs.step += 1
            parts["act"] += t1 - t0
            parts["environments"] += t2 - t1
            parts["store (episodic adds)"] += t3 - t2
            if runs.step % runs.cfg.train_frequency == 0:
                runs.update()
                parts["update / K"] += time.perf_counter() - t3
        total = time.perf_counter() - start
        print(f"{args.runs} runs: {args.runs * args.steps / total:.0f} run-steps/s "
              f"({1e3 * total / args.steps:.2f} ms per lockstep step)")
        for k, v in parts.items():
            print(f"  {k:24s} {1e3 * v / args.steps:7.3f} ms per lockstep step")
        print(f"one update of {args.runs} runs, median of {args.updates}:")
        pieces = defaultdict(list)
        for _ in range(args.updates):
            for k, v in _timed_update(runs).items():
                pieces[k].append(v)
        for k, v in pieces.items():
            print(f"  {k:24s} {1e3 * np.median(v):7.3f} ms")
        print(f"  {'total':24s} {1e3 * np.median(np.sum(list(pieces.values()), axis=0)):7.3f} ms")


def _timed_update(runs: dqn.Runs) -> dict[str, float]:
    """Runs.update, step by step, with a clock between the steps (same operations, same order)."""
    marks = [time.perf_counter()]
    B = runs.cfg.batch_size
    batches = [buf.sample(B, beta=runs.beta(r)) for r, buf in enumerate(runs.buffers)]
    marks.append(time.perf_counter())
    obs = runs.tensor(np.stack([b["obs"] for b in batches]))
    next_obs = runs.tensor(np.stack([b["next_obs"] for b in batches]))
    actions = runs.stack(batches, "action", torch.long)
    returns, discounts = runs.stack(batches, "return"), runs.stack(batches, "discount")
    weights = torch.as_tensor(np.stack([b.weights for b in batches]), dtype=torch.float32)
    marks.append(time.perf_counter())
    y = dqn.double_dqn_target(runs.q, runs.target, next_obs, returns, discounts)
    marks.append(time.perf_counter())
    q_sa = runs.q(obs).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    delta = q_sa - y
    losses = dqn.variant_loss(delta, weights, runs.kappa, runs.alpha, runs.is_pal)
    marks.append(time.perf_counter())
    runs.optimizer.zero_grad()
    losses.sum().backward()
    marks.append(time.perf_counter())
    runs.optimizer.step()
    marks.append(time.perf_counter())
    td = delta.detach().numpy()
    for r, (buf, batch) in enumerate(zip(runs.buffers, batches, strict=True)):
        if runs.writes_priorities[r]:
            buf.update_priorities(batch.indices, td[r])
    marks.append(time.perf_counter())
    names = ["sample", "batch to tensors", "target (2 forwards)", "forward + loss", "backward", "optimiser",
             "priorities"]
    return {k: b - a for k, a, b in zip(names, marks, marks[1:], strict=False)}


if __name__ == "__main__":
    main()
