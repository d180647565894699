"""Replay-buffer micro-benchmark: perx against a uniform floor and PyPI peers, in one process run.

One *iteration* is "sample a batch of B with IS weights, then update the priorities of those B
indices with fresh random values" on a buffer filled to N transitions (obs and next_obs float32[8],
int64 action, float32 reward, bool terminated and truncated). The *floor* is ``rng.integers`` plus a
gather of the same six fields, with no priorities at all. Also timed: one ``add`` and one ``extend``
of 256 rows into the full buffer.

Implementations are timed in interleaved blocks (floor, perx.Uniform, perx.Proportional, cpprb,
tianshou, floor, ...) so that load changes on a shared machine hit them alike; each cell is the median
over blocks of the mean time per call within a block. Ratios divide by the floor's median.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import perx

OBS_DIM = 8
UPDATE_POOL = 64  # batches of fresh random priorities generated up front, cycled through


class _Values(dict):
    """B -> an endless cycle through the first B columns of each row of ``pool``: the fresh priorities of
    every update, sliced once up front (a slice per call, ``pool[k, :b]``, cost ~0.25 us, a twentieth of a
    B = 1 iteration, and belongs to the benchmark, not to the buffer timed)."""

    def __init__(self, pool: np.ndarray) -> None:
        super().__init__()
        self.pool = pool

    def __missing__(self, b: int) -> Iterator[np.ndarray]:
        cycle = self[b] = itertools.cycle([row[:b] for row in self.pool])
        return cycle


def make_data(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((n, OBS_DIM), dtype=np.float32),
        "action": rng.integers(0, 4, n, dtype=np.int64),
        "reward": rng.standard_normal(n, dtype=np.float32),
        "next_obs": rng.standard_normal((n, OBS_DIM), dtype=np.float32),
        "terminated": rng.random(n) < 0.01,
        "truncated": rng.random(n) < 0.001,
    }


@dataclass
class Impl:
    """One implementation under test: closures built on a buffer filled to N."""

    name: str
    iteration: Callable[[int], None]  # (B) -> sample + update
    add: Callable[[], None]
    extend: Callable[[], None]
    note: str = ""
    sort: Callable[[], None] | None = None  # RankBased heap mode: one full re-sort


def cpu_model() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), or platform's guess: the benchmark tables name it
    because the machines this project runs on change between sessions (ratios move with the cache sizes)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _floor(data, n, rng):
    store = {k: v.copy() for k, v in data.items()}
    one = {k: v[0] for k, v in data.items()}
    rows = {k: v[:256] for k, v in data.items()}
    pos = [0]

    def iteration(b):
        idx = rng.integers(0, n, b)
        for arr in store.values():
            arr[idx]

    def add():
        p = pos[0]
        for k, arr in store.items():
            arr[p] = one[k]
        pos[0] = (p + 1) % n

    def extend():
        p = pos[0]
        if p + 256 > n:
            p = 0
        for k, arr in store.items():
            arr[p : p + 256] = rows[k]
        pos[0] = p + 256

    return Impl("floor", iteration, add, extend, "rng.integers + gather, no priorities")


def _perx(sampler, label, data, n, rng, reuse=False):
    buf = perx.ReplayBuffer(n, sampler, seed=0)
    buf.extend(**data)
    values = _Values(rng.random((UPDATE_POOL, 256)))
    one = {k: v[0] for k, v in data.items()}
    rows = {k: v[:256] for k, v in data.items()}
    kept: dict[int, perx.Batch] = {}

    def iteration(b):
        if reuse:  # sample(out=...): the batch of the previous call with this B is refilled in place
            out = kept.get(b)
            batch = buf.sample(b, beta=0.4) if out is None else buf.sample(b, beta=0.4, out=out)
            kept[b] = batch
        else:
            batch = buf.sample(b, beta=0.4)
        buf.update_priorities(batch.indices, next(values[b]))

    sort = None
    if isinstance(sampler, (perx.RankBased, perx.Greedy)):
        # Give every transition a replayed priority (a fill of N updates also triggers RankBased's
        # first full sort), then disorder the heap with N/2 more, so sampling and the timed sort act
        # on a heap in a realistic state rather than on N ties at +inf.
        buf.update_priorities(np.arange(n), rng.random(n))
        buf.update_priorities(rng.integers(0, n, n // 2), rng.random(n // 2))
        if isinstance(sampler, perx.RankBased) and not sampler.exact:
            sort = sampler.sort
    return Impl(label, iteration, lambda: buf.add(**one), lambda: buf.extend(**rows), sort=sort)


def _cpprb(data, n, rng):
    import cpprb

    env = {
        "obs": {"shape": OBS_DIM, "dtype": np.float32},
        "action": {"dtype": np.int64},
        "reward": {"dtype": np.float32},
        "next_obs": {"shape": OBS_DIM, "dtype": np.float32},
        "terminated": {"dtype": np.bool_},
        "truncated": {"dtype": np.bool_},
    }
    buf = cpprb.PrioritizedReplayBuffer(n, env, alpha=0.6, eps=1e-6)
    buf.add(**data)
    values = _Values(rng.random((UPDATE_POOL, 256)))
    one = {k: v[0] for k, v in data.items()}
    rows = {k: v[:256] for k, v in data.items()}

    def iteration(b):
        s = buf.sample(b, beta=0.4)
        buf.update_priorities(s["indexes"], next(values[b]))

    return Impl(f"cpprb {cpprb.__version__}" if hasattr(cpprb, "__version__") else "cpprb",
                iteration, lambda: buf.add(**one), lambda: buf.add(**rows))


def _tianshou(data, n, rng):
    import tianshou
    from tianshou.data import Batch, PrioritizedReplayBuffer

    buf = PrioritizedReplayBuffer(n, alpha=0.6, beta=0.4)

    def row(i):
        return Batch(obs=data["obs"][i], act=data["action"][i], rew=data["reward"][i],
                     obs_next=data["next_obs"][i], terminated=data["terminated"][i],
                     truncated=data["truncated"][i], info={})

    buf.add(row(0))  # allocates the storage through the public API
    # Tianshou's single-buffer `add` takes one transition per call (~1e6 calls would take minutes),
    # so the rest of the fill writes its preallocated arrays directly and sets the tree's leaves to
    # max_priority ** alpha, as its `init_weight` would. Sampling and updating below use the public API.
    meta = buf._meta
    meta.obs[:n] = data["obs"]
    meta.act[:n] = data["action"]
    meta.rew[:n] = data["reward"]
    meta.obs_next[:n] = data["next_obs"]
    meta.terminated[:n] = data["terminated"]
    meta.truncated[:n] = data["truncated"]
    meta.done[:n] = data["terminated"] | data["truncated"]
    buf._size = n
    buf._insertion_idx = 0
    buf.init_weight(np.arange(n))
    values = _Values(rng.random((UPDATE_POOL, 256)))
    one = row(1)

    def iteration(b):
        batch, indices = buf.sample(b)
        batch.weight  # noqa: B018 - the IS weights are part of the measured work
        buf.update_weight(indices, next(values[b]))

    def extend():
        for _ in range(256):
            buf.add(one)

    return Impl(f"tianshou {tianshou.__version__}", iteration, lambda: buf.add(one), extend,
                "no batch add: extend is 256 single adds")


@dataclass
class Cell:
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def _interleaved(fns: dict[str, Callable[[], None]], blocks: int, calls: int) -> dict[str, Cell]:
    """Time every function in interleaved blocks (so that load changes hit them alike), after a warm-up
    that compiles kernels and touches memory; garbage collection off while timing."""
    cells = {name: Cell() for name in fns}
    for fn in fns.values():
        _time_block(fn, 10)
    gc.disable()
    try:
        for _ in range(blocks):
            for name, fn in fns.items():
                cells[name].samples.append(_time_block(fn, calls))
    finally:
        gc.enable()
    return cells


def _time_block(fn: Callable[[], None], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


#: Every implementation the benchmark knows, in table order (``--only`` picks among them).
IMPLEMENTATIONS = ("floor", "perx.Uniform", "perx.Proportional", "perx.Proportional out=", "perx.RankBased",
                   "perx.RankBased exact", "perx.Greedy", "cpprb", "tianshou")


def _build(data, n, rng, peers, skipped, only=None) -> list[Impl]:
    builders = [
        ("floor", lambda: _floor(data, n, rng)),
        ("perx.Uniform", lambda: _perx(perx.Uniform(), "perx.Uniform", data, n, rng)),
        # buffer-wide IS normalisation: the committed tables' setting (000 Sec. 3.4)
        ("perx.Proportional", lambda: _perx(perx.Proportional(alpha=0.6, normalize="buffer"), "perx.Proportional",
                                            data, n, rng)),
        ("perx.Proportional out=", lambda: _perx(perx.Proportional(alpha=0.6, normalize="buffer"),
                                                 "perx.Proportional out=", data, n,
                                                 rng, reuse=True)),
        ("perx.RankBased", lambda: _perx(perx.RankBased(alpha=0.7, normalize="buffer"), "perx.RankBased", data, n,
                                         rng)),
        ("perx.RankBased exact", lambda: _perx(perx.RankBased(alpha=0.7, exact=True, normalize="buffer"),
                                               "perx.RankBased exact",
                                               data, n, rng)),
        ("perx.Greedy", lambda: _perx(perx.Greedy(), "perx.Greedy", data, n, rng)),
    ]
    if peers:
        builders += [("cpprb", lambda: _cpprb(data, n, rng)), ("tianshou", lambda: _tianshou(data, n, rng))]
    impls = []
    for name, build in builders:
        if only is not None and name not in only:
            continue
        try:
            impls.append(build())
        except ImportError as err:
            skipped[name] = f"not installed ({err.name or err})"
        except Exception as err:  # a peer that breaks must not hide the others
            skipped[name] = f"failed: {type(err).__name__}: {err}"
    return impls


def run(sizes=(100_000, 1_000_000), batch_sizes=(32, 256), blocks=15, calls=200, peers=True,
        log=print, only=None) -> dict:
    """Run the benchmark; returns {"rows": [...], "impls": [...], "skipped": {...}, "load": ...}."""
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()
    rows = []
    skipped: dict[str, str] = {}
    impl_names: list[str] = []
    for n in sizes:
        impls = _build(make_data(n), n, rng, peers, skipped, only)
        for impl in impls:
            if impl.name not in impl_names:
                impl_names.append(impl.name)
        ops = [(f"sample+update B={b}", b, (lambda impl, b=b: (lambda: impl.iteration(b))))
               for b in batch_sizes]
        ops += [("full sort (once per sort_every updates)", None, None),
                ("add (1 row)", None, lambda impl: impl.add),
                ("extend (256 rows)", None, lambda impl: impl.extend)]
        for op_name, b, make_fn in ops:
            if make_fn is None:
                # before the adds (which put +inf keys into the heap): one call each, on a heap the fill
                # shuffled (a second call would find it sorted already)
                sorters = [impl for impl in impls if impl.sort is not None]
                if not sorters:
                    continue
                row = {"op": op_name, "N": n, "cells": {impl.name: _time_block(impl.sort, 1) for impl in sorters}}
            else:
                fns = {impl.name: make_fn(impl) for impl in impls}
                k = calls if b is None or b <= 64 else max(20, calls // 4)
                cells = _interleaved(fns, blocks, k)
                row = {"op": op_name, "N": n, "cells": {name: c.median for name, c in cells.items()}}
            rows.append(row)
            log(format_row(row, impl_names))
        del impls
        gc.collect()
    return {"rows": rows, "impls": impl_names, "skipped": skipped,
            "load": (load_before, os.getloadavg()), "notes": {}}


# -- episodic storage: n-step windows, next observations and frames stored once ---------------------

def _episode_fill(buf: perx.ReplayBuffer, n: int, obs_shape: tuple, dtype, frames: int | None, rng,
                  episode: int = 1000, chunk: int = 5000) -> None:
    """Fill ``buf`` with n steps of one stream: episodes of ``episode`` steps, ended alternately by
    termination and truncation; observations consistent step to step (stacks shifted by one frame)."""
    unit = obs_shape[1:] if frames else obs_shape
    pool = (rng.integers(0, 256, (4096, *unit)) if dtype == np.uint8 else
            rng.standard_normal((4096, *unit))).astype(dtype)
    for start in range(0, n, chunk):
        t = np.arange(start, min(n, start + chunk) + 1)
        ep_t = t % episode  # step within the episode
        if frames:
            back = np.maximum(ep_t[:, None] - np.arange(frames - 1, -1, -1), 0)  # pad with the first frame
            cur = pool[(t[:, None] - ep_t[:, None] + back) % len(pool)]
        else:
            cur = pool[t % len(pool)]
        end = ep_t[1:] == 0  # the step that reaches the next episode's start is the last of this one
        nxt = cur[1:].copy()
        if end.any():  # the final observation: the one after the last step, within the same episode
            if frames:
                last = cur[:-1][end]
                nxt[end] = np.concatenate([last[:, 1:], pool[(t[1:][end] + 7) % len(pool)][:, None]], axis=1)
            else:
                nxt[end] = pool[(t[1:][end] + 7) % len(pool)]
        m = len(t) - 1
        episode_no = t[:-1] // episode
        buf.extend(obs=cur[:-1], next_obs=nxt, action=rng.integers(0, 4, m), reward=rng.standard_normal(m),
                   terminated=end & (episode_no % 2 == 0), truncated=end & (episode_no % 2 == 1))


def episode_run(n_vec: int = 1_000_000, n_frames: int = 100_000, batch_sizes=(32, 256), blocks: int = 15,
                calls: int = 200, log=print) -> list[dict]:
    """Time sample+update (Proportional, alpha 0.6, beta 0.4) for each storage layout; bytes per step."""
    rng = np.random.default_rng(0)
    groups = [
        ("vector obs float32[8]", n_vec, (8,), np.float32, [
            ("obs and next_obs stored (no episodes)", None),
            ("Episodes(n_step=1)", perx.Episodes(n_step=1)),
            ("Episodes(n_step=3)", perx.Episodes(n_step=3)),
            ("Episodes(n_step=3, next_obs='shared')", perx.Episodes(n_step=3, next_obs="shared")),
        ]),
        ("Atari obs uint8[4, 84, 84]", n_frames, (4, 84, 84), np.uint8, [
            ("stacks stored (no episodes)", None),
            ("Episodes(n_step=1, frame_stack=4)", perx.Episodes(n_step=1, frame_stack=4)),
            ("Episodes(n_step=3, frame_stack=4)", perx.Episodes(n_step=3, frame_stack=4)),
        ]),
    ]
    rows = []
    for group, n, shape, dtype, layouts in groups:
        bufs = {}
        for name, episodes in layouts:
            buf = perx.ReplayBuffer(n, perx.Proportional(alpha=0.6, normalize="buffer"), seed=0, episodes=episodes)
            _episode_fill(buf, n, shape, dtype, shape[0] if len(shape) == 3 else None, np.random.default_rng(1))
            bufs[name] = buf
        pool = rng.random((UPDATE_POOL, max(batch_sizes)))
        for b in batch_sizes:
            fns = {name: _sample_update(buf, b, pool) for name, buf in bufs.items()}
            cells = _interleaved(fns, blocks, calls if b <= 64 else max(20, calls // 4))
            ref = cells[layouts[0][0]].median
            for name, buf in bufs.items():
                row = {"group": group, "layout": name, "N": n, "B": b, "time": cells[name].median,
                       "ratio": cells[name].median / ref,
                       "bytes": (buf.nbytes - buf.sampler.nbytes) / n}
                rows.append(row)
                log(format_episode_row(row))
        del bufs
        gc.collect()
    return rows


def _sample_update(buf: perx.ReplayBuffer, b: int, pool: np.ndarray) -> Callable[[], None]:
    values = _Values(pool)[b]

    def iteration():
        batch = buf.sample(b, beta=0.4)
        buf.update_priorities(batch.indices, next(values))

    return iteration


def format_episode_row(row: dict) -> str:
    n = f"{row['N']:.0e}".replace("e+0", "e")
    return (f"| {row['group']} | {row['layout']} | {n} | {row['B']} | {_fmt_time(row['time'])} | "
            f"{row['ratio']:.2f}x | {row['bytes']:,.0f} |")


def format_episode_table(rows: list[dict]) -> str:
    lines = ["## Episodic storage: n-step windows, observations stored once", "",
             "Sample+update with `perx.Proportional(alpha=0.6, normalize='buffer')` (beta = 0.4) on buffers "
             "filled with one stream of episodes of 1000 steps; ratio = time / the first layout of its group in "
             "the same run (interleaved blocks, medians). Bytes per transition: the buffer's fields and episode "
             "links and observation stores, without the sampler's own arrays.", "",
             "| observations | layout | N | B | sample+update | ratio | bytes per transition |",
             "|---|---|---|---|---|---|---|"]
    lines += [format_episode_row(r) for r in rows]
    return "\n".join(lines) + "\n"


def _fmt_time(s: float) -> str:
    us = s * 1e6
    return f"{us:.1f} µs" if us < 1000 else f"{us / 1000:.2f} ms"


def format_row(row: dict, impl_names: list[str]) -> str:
    floor = row["cells"].get("floor")
    cells = []
    for name in impl_names:
        t = row["cells"].get(name)
        if t is None:
            cells.append("-")
        elif floor:
            cells.append(f"{_fmt_time(t)} ({t / floor:.2f}x)")
        else:
            cells.append(_fmt_time(t))
    n = f"{row['N']:.0e}".replace("e+0", "e")
    return f"| {row['op']} | {n} | " + " | ".join(cells) + " |"


def _scaling(rows: list[dict], names: list[str]) -> list[str]:
    """Per implementation, time per iteration at the largest N over the time at the smallest, per B."""
    iters = [r for r in rows if r["op"].startswith("sample+update")]
    sizes = sorted({r["N"] for r in iters})
    if len(sizes) < 2:
        return []
    lo, hi = sizes[0], sizes[-1]
    out = ["", f"Growth with the buffer size: time per iteration at N = {hi:.0e} / at N = {lo:.0e} (same run).", "",
           "| operation | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for op in dict.fromkeys(r["op"] for r in iters):
        a = next(r for r in iters if r["op"] == op and r["N"] == lo)["cells"]
        b = next(r for r in iters if r["op"] == op and r["N"] == hi)["cells"]
        out.append(f"| {op} | " + " | ".join(f"{b[n] / a[n]:.2f}x" if n in a and n in b else "-" for n in names)
                   + " |")
    return out


def format_table(result: dict, command: str) -> str:
    names = result["impls"]
    (l1, l5, l15), (e1, e5, e15) = result["load"]
    lines = [
        "# perx benchmark: sample+update, add, extend",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.machine()} ({cpu_model()}), {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, "
        f"numpy {np.__version__}, perx {perx.__version__}. Load average (1/5/15 min) before: "
        f"{l1:.2f}/{l5:.2f}/{l15:.2f}, after: {e1:.2f}/{e5:.2f}/{e15:.2f}.",
        "",
        "Each cell: median over interleaved blocks of the mean time per call, and in brackets the ratio "
        "to the floor (`rng.integers` + gather of the same six fields, no priorities) in the same row. "
        "Iteration = sample B with IS weights (beta = 0.4) + update those B priorities with fresh "
        "random values; alpha = 0.6.",
        "",
        "| operation | N | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    lines += [format_row(r, names) for r in result["rows"]]
    lines += _scaling(result["rows"], names)
    if result["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in result["skipped"].items())]
    lines += ["", "Notes: tianshou has no batch add for a single buffer, so its extend is 256 single adds; "
              "its fill (not timed) writes its arrays directly. cpprb and tianshou sample independently; "
              "perx.Proportional samples stratified (its default). perx.RankBased (heap mode) re-sorts its "
              "heap every `sort_every` priority updates (default: capacity); block medians leave that rare "
              "sort out, so its cost is the separate 'full sort' row: amortized, add "
              "sort time x B / sort_every to each iteration. perx.RankBased exact keeps a "
              "compiled list of sorted blocks with a Fenwick tree over their sizes. perx.Greedy returns the "
              "top B (no randomness)."]
    return "\n".join(lines) + "\n"


#: Where ``perx bench`` writes its table unless ``--out`` says otherwise: a folder git ignores, so a run never
#: replaces the committed results/bench.md (``--out results/bench.md`` does).
DEFAULT_OUT = "runs/bench.md"


def build_parser(prog: str = "python benchmarks/bench_buffer.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer blocks and calls (about a minute)")
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="buffer sizes N (default 1e6 and 1e7; 1e5 and 1e6 with --quick)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 256], help="batch sizes B")
    parser.add_argument("--blocks", type=int, default=None, help="interleaved timing blocks per cell")
    parser.add_argument("--calls", type=int, default=None, help="calls per block (B <= 64)")
    parser.add_argument("--no-peers", action="store_true", help="skip cpprb and tianshou")
    parser.add_argument("--no-episodes", action="store_true", help="skip the episodic-storage table")
    parser.add_argument("--episode-size", type=int, default=1_000_000,
                        help="N of the vector-observation rows of the episodic table")
    parser.add_argument("--frame-size", type=int, default=None,
                        help="N of the Atari-frame rows (default 100,000; 20,000 with --quick)")
    parser.add_argument("--only", nargs="+", default=None, choices=IMPLEMENTATIONS, metavar="NAME",
                        help="time only these implementations (fewer buffers, less cache interference); "
                             f"from: {', '.join(IMPLEMENTATIONS)}")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="also write the markdown table to this file (default: %(default)s, which git ignores)")
    return parser


def main(argv: list[str] | None = None, prog: str = "python benchmarks/bench_buffer.py") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog).parse_args(argv)
    if args.sizes is None:
        args.sizes = [100_000, 1_000_000] if args.quick else [1_000_000, 10_000_000]
    blocks = args.blocks or (7 if args.quick else 21)
    calls = args.calls or (100 if args.quick else 300)
    command = " ".join([prog, *map(shlex.quote, argv)])
    names = [n for n in IMPLEMENTATIONS if (args.only is None or n in args.only)
             and not (args.no_peers and n in ("cpprb", "tianshou"))]
    print("| operation | N | " + " | ".join(names) + " |", flush=True)
    result = run(tuple(args.sizes), tuple(args.batch_sizes), blocks=blocks, calls=calls,
                 peers=not args.no_peers, log=lambda line: print(line, flush=True), only=args.only)
    table = format_table(result, command)
    if not args.no_episodes:
        print("\n| observations | layout | N | B | sample+update | ratio | bytes per transition |", flush=True)
        frames = args.frame_size or (20_000 if args.quick else 100_000)
        rows = episode_run(n_vec=args.episode_size, n_frames=frames,
                           batch_sizes=tuple(args.batch_sizes), blocks=blocks, calls=calls,
                           log=lambda line: print(line, flush=True))
        table += "\n" + format_episode_table(rows)
    print()
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python benchmarks/bench_buffer.py"))
