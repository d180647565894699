"""Throughput of perx.distributed.ShardedReplay against the in-process buffer (issue 13).

    python benchmarks/bench_distributed.py --out results/distributed/throughput.md

For each (shards K, writer actors A): A Ray actors push synthetic transitions (obs float32[8], batches of
``--push`` rows, one push in flight per actor) into the K shards while the learner (this process) keeps
``--prefetch`` sample calls of B = 256 in flight and sends a priority update per batch, for ``--seconds``.
Reported: transitions ingested per second, learner batches per second, and call latencies (p50/p90/p99):
a synchronous no-op call, a synchronous 256-row sample, a push as the writer sees it. The reference is the
same work in one process on one perx.ReplayBuffer (extend of ``--push`` rows; sample + update of 256).
Medians over ``--repeats`` runs of each cell; the machine is noisy, so read ratios, not digits.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

OBS = 8
B = 256


def transitions(n: int, rng: np.random.Generator, obs: int | None = None) -> dict[str, np.ndarray]:
    obs = OBS if obs is None else obs
    return {"obs": rng.standard_normal((n, obs), dtype=np.float32), "action": rng.integers(0, 4, n),
            "reward": rng.standard_normal(n).astype(np.float32), "discount": np.full(n, 0.99, np.float32),
            "next_obs": rng.standard_normal((n, obs), dtype=np.float32)}


def in_process(capacity: int, push: int, seconds: float) -> tuple[float, float]:
    """(transitions added per second, sample+update batches per second) on one buffer in one process."""
    import perx

    rng = np.random.default_rng(0)
    buf = perx.ReplayBuffer(capacity, perx.Proportional(alpha=0.6, normalize="buffer"), seed=0)
    data = transitions(push, rng)
    td = np.abs(rng.standard_normal(push)) + 0.1
    while len(buf) < capacity // 2:
        buf.update_priorities(buf.extend(**data), td)
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds / 2:
        buf.update_priorities(buf.extend(**data), td)
        n += push
    ingest = n / (time.perf_counter() - t)
    err = np.abs(rng.standard_normal(B)) + 0.1
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds / 2:
        batch = buf.sample(B, beta=0.4)
        buf.update_priorities(batch.indices, err)
        n += 1
    return ingest, n / (time.perf_counter() - t)


class Writer:
    """A Ray actor pushing synthetic batches to shards round-robin, one push in flight."""

    def __init__(self, shards: list, push: int, seed: int, obs: int) -> None:
        self.shards, self.push = shards, push
        self.rng = np.random.default_rng(seed)
        self.data = transitions(push, self.rng, obs)  # obs given: this runs in another process
        self.td = np.abs(self.rng.standard_normal(push)) + 0.1

    def run(self, seconds: float) -> tuple[int, list[float]]:
        import ray

        sent, latencies, k = 0, [], 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            ray.get(self.shards[k].add.remote(self.data, self.td))
            latencies.append(time.perf_counter() - t)
            sent += self.push
            k = (k + 1) % len(self.shards)
        return sent, latencies


def row_bytes() -> int:
    """Bytes of one transition as pushed and sampled (obs and next_obs float32[OBS], action int64, reward and
    discount float32)."""
    return 2 * 4 * OBS + 8 + 4 + 4


def cell(shards: int, actors: int, capacity: int, push: int, seconds: float, prefetch: int,
         single: bool = False, ratio: float = 0.0) -> dict:
    import ray

    import perx
    from perx.distributed import RateLimiter, ShardedReplay

    # the rate limiter starts counting at the prefilled size: from then on the learner may sample `ratio`
    # transitions per transition the writers insert, within a band of a few batches and pushes
    prefill = shards * max(1, capacity // 2 // shards // push) * push
    limiter = RateLimiter(ratio, prefill, error_buffer=2 * B + ratio * push) if ratio > 0 else None
    replay = ShardedReplay(shards, capacity, perx.Proportional(alpha=0.6, normalize="buffer"), seed=0,
                           single_shard_batches=single, rate_limiter=limiter)
    rng = np.random.default_rng(1)
    # half full before timing, as in the in-process reference
    for k in range(shards):
        for _ in range(max(1, capacity // 2 // shards // push)):
            replay.add(shard=k, td_errors=np.abs(rng.standard_normal(push)) + 0.1, **transitions(push, rng))
    writer = ray.remote(Writer).options(num_cpus=0)
    writers = [writer.remote(replay.shards, push, 10 + i, OBS) for i in range(actors)]
    ray.get([w.run.remote(0.2) for w in writers])  # warm-up: imports, compiled kernels
    runs = [w.run.remote(seconds) for w in writers]
    err = np.abs(rng.standard_normal(B)) + 0.1
    pending = [replay.sample_async(B, 0.4) for _ in range(prefetch)]
    batches, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        batch = pending.pop(0).result()
        replay.update_priorities(batch.indices, err[:len(batch)])
        pending.append(replay.sample_async(B, 0.4))
        batches += 1
    learner_time = time.perf_counter() - t0
    results = ray.get(runs)
    for p in pending:
        p.result()
    replay.flush()
    # latencies with the writers stopped: a no-op call and a synchronous sample (without the rate limiter,
    # which would now wait for inserts that no longer come)
    if limiter is not None:  # the ratio as the limiter counts it, warm-up pushes included
        replay.refresh()
        spi = limiter.sampled / max(1, limiter.inserted - limiter.min_size_to_sample)
    replay.rate_limiter = None
    noop = []
    for _ in range(200):
        t = time.perf_counter()
        ray.get(replay.shards[0].ping.remote())
        noop.append(time.perf_counter() - t)
    sample = []
    for _ in range(100):
        t = time.perf_counter()
        replay.sample_async(B, 0.4).result()
        sample.append(time.perf_counter() - t)
    replay.close()
    for w in writers:
        ray.kill(w)
    push_lat = [x for _, lat in results for x in lat]
    ingested = sum(n for n, _ in results)
    return {"ingest": ingested / seconds, "batches": batches / learner_time,
            # sampled transitions per transition inserted while the learner ran (what a rate limiter holds)
            "spi": batches * B / max(1, ingested) if limiter is None else spi,
            "noop": np.percentile(noop, [50, 90, 99]) * 1e3, "sample": np.percentile(sample, [50, 90, 99]) * 1e3,
            "push": np.percentile(push_lat, [50, 90, 99]) * 1e3}


def main(argv: list[str] | None = None) -> int:
    global OBS
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_distributed.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--capacity", type=int, default=200_000)
    parser.add_argument("--push", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count())
    parser.add_argument("--modes", nargs="+", default=["all"], choices=["all", "single", "rate"],
                        help="all: every shard draws its share of each batch; single: one shard per batch "
                             "(single_shard_batches=True); rate: single with a RateLimiter at --ratio samples "
                             "per insert")
    parser.add_argument("--ratio", type=float, default=2.0, help="samples per insert of the rate mode")
    parser.add_argument("--obs", type=int, default=OBS, help="float32 values per observation")
    parser.add_argument("--out", default=None, help="markdown file for the table (default: print only)")
    args = parser.parse_args(argv)
    OBS = args.obs

    import ray

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    ref = [in_process(args.capacity, args.push, args.seconds) for _ in range(args.repeats)]
    ref_ingest = statistics.median(r[0] for r in ref)
    ref_batches = statistics.median(r[1] for r in ref)
    lines = [
        f"# ShardedReplay throughput ({platform.node() and 'this machine'}: {os.cpu_count()} cores, "
        f"Ray {ray.__version__}, Python {platform.python_version()})",
        "",
        f"Command: `python benchmarks/bench_distributed.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
        "",
        f"obs float32[{OBS}], pushes of {args.push} rows with TD errors, learner batches of {B} with "
        f"{args.prefetch} in flight and a priority update per batch, {args.seconds:g} s per run, median of "
        f"{args.repeats} runs. In-process reference (one perx.ReplayBuffer, Proportional, one process): "
        f"{ref_ingest:,.0f} transitions/s added, {ref_batches:,.0f} sample+update batches/s.",
        "",
        f"A transition is {row_bytes()} bytes. Learner calls / s: sample and update calls (every shard: K of each "
        f"per batch; one shard: one of each). MB/s per shard: pushed in plus sampled out, averaged over the "
        f"shards. Samples/insert: transitions sampled per transition pushed while the learner ran (with the limiter: "
        f"as the limiter counts them, from its start at the prefilled size).",
        "",
        "| shards | batch from | writer actors | ingested / s | x in-process | learner batches / s | x in-process | "
        "learner calls / s | MB/s per shard | samples/insert | push ms p50/p90/p99 | sample ms p50/p90/p99 | "
        "no-op ms p50/p90/p99 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k, a, mode in [(k, a, m) for k in args.shards for a in args.actors for m in args.modes]:
        rs = [cell(k, a, args.capacity, args.push, args.seconds, args.prefetch, single=mode in ("single", "rate"),
                   ratio=args.ratio if mode == "rate" else 0.0)
              for _ in range(args.repeats)]
        ingest = statistics.median(r["ingest"] for r in rs)
        batches = statistics.median(r["batches"] for r in rs)
        pct = {key: np.median([r[key] for r in rs], axis=0) for key in ("push", "sample", "noop")}
        spi = statistics.median(r["spi"] for r in rs)
        source = {"all": "every shard", "single": "one shard", "rate": f"one shard, limiter {args.ratio:g}"}[mode]
        calls = batches * 2 * (1 if mode in ("single", "rate") else k)
        mb = (ingest + batches * B) * row_bytes() / k / 1e6
        latencies = " | ".join("/".join(f"{x:.2f}" for x in pct[key]) for key in ("push", "sample", "noop"))
        row = (f"| {k} | {source} | {a} | {ingest:,.0f} | {ingest / ref_ingest:.3f} | {batches:,.0f} | "
               f"{batches / ref_batches:.3f} | {calls:,.0f} | {mb:.2f} | {spi:.2f} | {latencies} |")
        lines.append(row)
        print(row, flush=True)
    ray.shutdown()
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
