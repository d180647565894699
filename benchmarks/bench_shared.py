"""Writer processes feeding one learner's buffer through perx.shared, against one process writing alone.

    python benchmarks/bench_shared.py --writers 1 2 4 --seconds 10 --out results/shared.md

Rows of 8-float observations (80 bytes), perx.Proportional(alpha=0.6), capacity 1e6, batches of 64 rows (a
vector env's step). Rows:
  * one process, extend only: the same batches written by ``buf.extend`` in a loop (the ingest floor);
  * one process, extend + learn: the loop alternates one extend(64) with one sample(256) + update (what a
    single-process training loop does with the buffer);
  * K writers: K processes call ``writer.extend`` as fast as they can while the learner loops pull() + sample(256)
    + update_priorities (+ --learner-work-ms of busy work, a stand-in for its gradient step). Ingest is rows
    pulled per second; the learner's latency is one sample+update (pull not included; pull's cost per row is its
    own column);
  * the peer, cpprb's MPPrioritizedReplayBuffer (when cpprb is installed): K explorer processes call ``rb.add``
    on the shared buffer while the learner loops sample + update_priorities (+ the same work). Ingest is rows
    added per second, counted by the explorers.
Medians of --rounds rounds of --seconds each. The machine's cores are shared by the writers and the learner:
with K writers on C cores, K + 1 processes compete.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import perx
from bench_buffer import cpu_model
from perx.shared import SharedReplay

SPEC = {"obs": ((8,), np.float32), "next_obs": ((8,), np.float32), "action": ((), np.int64),
        "reward": ((), np.float32), "terminated": ((), np.bool_), "truncated": ((), np.bool_)}
ROWS = 64
CAPACITY = 1_000_000
#: seconds of busy work the learner does after each sample+update (a stand-in for its gradient step)
WORK = 0.0


def work() -> None:
    end = time.perf_counter() + WORK
    while time.perf_counter() < end:
        pass


def batch(rng: np.random.Generator) -> dict:
    obs = rng.standard_normal((ROWS, 8)).astype(np.float32)
    return {"obs": obs, "next_obs": obs + 1, "action": rng.integers(0, 4, ROWS),
            "reward": rng.standard_normal(ROWS).astype(np.float32), "terminated": rng.random(ROWS) < 0.01,
            "truncated": np.zeros(ROWS, bool)}


def make() -> perx.ReplayBuffer:
    buf = perx.ReplayBuffer(CAPACITY, perx.Proportional(alpha=0.6), seed=0, spec=SPEC)
    buf.extend(**{k: np.concatenate([v] * 16) for k, v in batch(np.random.default_rng(1)).items()})
    return buf


def alone(seconds: float, learn: bool) -> dict:
    buf = make()
    data = batch(np.random.default_rng(0))
    td = np.ones(256)
    n, lat = 0, []
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        buf.extend(**data)
        n += ROWS
        if learn:
            t = time.perf_counter()
            b = buf.sample(256, 0.4)
            buf.update_priorities(b.indices, td)
            lat.append(time.perf_counter() - t)
            work()
    return {"rows_s": n / (time.perf_counter() - start), "lat_us": 1e6 * statistics.median(lat) if lat else None,
            "pull_ns": None}


def _writer(w, stop) -> None:
    data = batch(np.random.default_rng(os.getpid()))
    while not stop.is_set():
        w.extend(**data)


def shared(k: int, seconds: float, ctx) -> dict:
    buf = make()
    td = np.ones(256)
    stop = ctx.Event()
    with SharedReplay(buf, k, ring=8192, context=ctx) as hub:
        procs = [ctx.Process(target=_writer, args=(hub.writer(i), stop)) for i in range(k)]
        for p in procs:
            p.start()
        time.sleep(0.5)  # the writers start and fill their rings
        hub.pull()
        n, lat, pull_s = 0, [], 0.0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            n += hub.pull()
            pull_s += time.perf_counter() - t
            t = time.perf_counter()
            b = buf.sample(256, 0.4)
            buf.update_priorities(b.indices, td)
            lat.append(time.perf_counter() - t)
            work()
        elapsed = time.perf_counter() - start
        stop.set()
        for _ in range(100):  # keep pulling so that no writer waits on a full ring while it stops
            hub.pull()
            if not any(p.is_alive() for p in procs):
                break
            time.sleep(0.01)
        for p in procs:
            p.join(10)
    return {"rows_s": n / elapsed, "lat_us": 1e6 * statistics.median(lat), "pull_ns": 1e9 * pull_s / max(n, 1)}


def _cpprb_writer(rb, stop, count) -> None:
    data = batch(np.random.default_rng(os.getpid()))
    while not stop.is_set():
        rb.add(**data)
        with count.get_lock():
            count.value += ROWS


def cpprb_shared(k: int, seconds: float, ctx) -> dict:
    """The peer: cpprb's MPPrioritizedReplayBuffer, its explorers adding into the shared buffer (cpprb's lock)."""
    from cpprb import MPPrioritizedReplayBuffer

    env = {name: {"shape": shape or 1, "dtype": dtype} for name, (shape, dtype) in SPEC.items()}
    rb = MPPrioritizedReplayBuffer(CAPACITY, env, alpha=0.6, ctx=ctx)
    rb.add(**{k_: np.concatenate([v] * 16) for k_, v in batch(np.random.default_rng(1)).items()})
    td = np.ones(256)
    stop, count = ctx.Event(), ctx.Value("q", 0)
    procs = [ctx.Process(target=_cpprb_writer, args=(rb, stop, count)) for _ in range(k)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    lat = []
    before = count.value
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        b = rb.sample(256, 0.4)
        rb.update_priorities(b["indexes"], td)
        lat.append(time.perf_counter() - t)
        work()
    rows = count.value - before
    elapsed = time.perf_counter() - start
    stop.set()
    for p in procs:
        p.join(10)
    return {"rows_s": rows / elapsed, "lat_us": 1e6 * statistics.median(lat), "pull_ns": None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_shared.py", description=__doc__.split("\n")[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-peers", action="store_true", help="skip cpprb's MPPrioritizedReplayBuffer")
    parser.add_argument("--learner-work-ms", type=float, default=0.0,
                        help="busy work of the learner after each sample+update (its gradient step), ms")
    args = parser.parse_args(argv)
    global WORK
    WORK = args.learner_work_ms / 1000
    try:
        import cpprb  # noqa: F401
        peers = not args.no_peers
    except ImportError:
        peers = False
    ctx = multiprocessing.get_context("fork")
    names = ["one process, extend only", "one process, extend + learn", *[f"{k} writer processes" for k in
                                                                         args.writers]]
    if peers:
        names += [f"cpprb MPPrioritizedReplayBuffer, {k} explorer processes" for k in args.writers]
    got: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(args.rounds):  # interleaved rounds
        got[names[0]].append(alone(args.seconds, False))
        got[names[1]].append(alone(args.seconds, True))
        for k in args.writers:
            got[f"{k} writer processes"].append(shared(k, args.seconds, ctx))
            if peers:
                got[f"cpprb MPPrioritizedReplayBuffer, {k} explorer processes"].append(
                    cpprb_shared(k, args.seconds, ctx))
    floor = statistics.median(r["rows_s"] for r in got[names[0]])

    def med(rows, key):
        vals = [r[key] for r in rows if r[key] is not None]
        return statistics.median(vals) if vals else None

    command = "python benchmarks/bench_shared.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = ["# One buffer fed by several processes (perx.shared)", "", f"`{command}`", "",
             f"CPU: {cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}; numpy {np.__version__}. "
             f"Medians of {args.rounds} interleaved rounds of {args.seconds:g} s; the learner busy-works "
             f"{args.learner_work_ms:g} ms after each sample+update.", "",
             "| setup | rows ingested/s | ratio to one process writing alone | learner sample(256)+update, us | "
             "pull, ns per row | rounds (rows/s) |", "|---|---|---|---|---|---|"]
    for name in names:
        rows = got[name]
        rate, lat, pull = med(rows, "rows_s"), med(rows, "lat_us"), med(rows, "pull_ns")
        each = ", ".join(f"{r['rows_s']:,.0f}" for r in rows)
        lines.append(f"| {name} | {rate:,.0f} | {rate / floor:.2f}x | {'-' if lat is None else f'{lat:.0f}'} | "
                     f"{'-' if pull is None else f'{pull:.0f}'} | {each} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
