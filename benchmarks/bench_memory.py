"""The physical floor of a replay buffer's sample+update on this machine: random-access costs and line counts.

Measures, with compiled loops (numba):
  * latency: dependent random reads (pointer chasing through a random cycle) over working sets from 256 KB
    to 1 GB: the cost of one cache miss that nothing overlaps;
  * throughput: B = 256 independent random 64-byte-line reads per call (what a batched gather or a
    level-by-level tree pass issues), the cost per line when misses overlap;
then counts the distinct cache lines that one transition of a sample+update touches outside the caches,
for perx.Proportional and for the floor of `perx bench` (numpy gather of six separate fields), and prints
the implied time per iteration at B = 256 next to the measured one.

    python benchmarks/bench_memory.py --out results/memory_limit.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
from numba import njit

from bench_buffer import cpu_model

LINE = 64


@njit(cache=True)
def _chase(nxt, start, steps):
    i = start
    for _ in range(steps):
        i = nxt[i]
    return i


@njit(cache=True)
def _gather_lines(arr, idx, stride):
    acc = 0
    for k in range(idx.shape[0]):
        acc += arr[idx[k] * stride]
    return acc


def _cycle(n_lines: int, rng: np.random.Generator) -> np.ndarray:
    """A random cyclic permutation over n_lines lines, one int64 per line (stride 8 elements)."""
    order = rng.permutation(n_lines)
    nxt = np.zeros(n_lines * 8, np.int64)
    nxt[order * 8] = np.roll(order, -1) * 8
    return nxt


def latency_ns(nbytes: int, steps: int = 2_000_000, rng=None) -> float:
    rng = rng or np.random.default_rng(0)
    nxt = _cycle(max(nbytes // LINE, 2), rng)
    _chase(nxt, 0, 1000)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        _chase(nxt, 0, steps)
        runs.append((time.perf_counter() - t0) / steps * 1e9)
    return statistics.median(runs)


def throughput_ns(nbytes: int, batch: int = 256, calls: int = 4000, rng=None) -> float:
    """ns per line when a call reads `batch` random lines that do not depend on each other."""
    rng = rng or np.random.default_rng(1)
    n_lines = max(nbytes // LINE, 2)
    arr = np.ones(n_lines * 8, np.int64)
    pool = rng.integers(0, n_lines, (calls, batch))
    _gather_lines(arr, pool[0], 8)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for c in range(calls):
            _gather_lines(arr, pool[c], 8)
        runs.append((time.perf_counter() - t0) / calls / batch * 1e9)
    return statistics.median(runs)


def line_counts(n: int) -> dict[str, float]:
    """Distinct lines one transition touches in arrays larger than the L2 cache, per sample+update.

    perx.Proportional: the masses line (the search ends there; the update rewrites it), the raw-priority
    line (written by the update), the row's lines (80-byte rows straddle 2 lines), and the heap levels whose
    nodes do not fit in L2 (estimated from the level sizes against half of a 4 MB L2: the rest of the cache
    holds the other arrays' lines of the batch). The floor: one line per field (six separate arrays).
    """
    leaves = 1 << (n - 1).bit_length()
    blocks = leaves // 8
    resident = 2 * 2**20  # bytes of heap assumed to stay in L2
    levels = blocks.bit_length()
    heap_misses = sum(1 for lv in range(levels) if (1 << lv) * 16 > resident)
    return {"perx.Proportional": 1 + 1 + 2 + heap_misses, "floor": 6}


def run(sizes_mb=(0.25, 2, 8, 32, 128, 512, 1024)) -> dict:
    rows = []
    for mb in sizes_mb:
        nbytes = int(mb * 2**20)
        rows.append({"MB": mb, "latency": latency_ns(nbytes), "throughput": throughput_ns(nbytes)})
        print(f"| {mb:g} MB | {rows[-1]['latency']:.1f} ns | {rows[-1]['throughput']:.2f} ns |", flush=True)
    return {"rows": rows, "lines": {n: line_counts(n) for n in (10**6, 10**7)}}


def format_md(result: dict, command: str) -> str:
    load = os.getloadavg()
    lines = ["# Random-access costs on this machine, and the floor they set for sample+update", "",
             f"Command: `{command}`", "",
             f"Machine: {platform.machine()} ({cpu_model()}), {os.cpu_count()} CPUs, "
             f"Python {platform.python_version()}; load "
             f"average after: {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}.", "",
             "Latency: one dependent read per step through a random cycle of 64-byte lines (nothing overlaps). "
             "Throughput: 256 independent random line reads per compiled call (as a batched gather or a "
             "level-by-level tree pass issues them), time per line. Medians of 5 runs.", "",
             "| working set | latency per read | time per line, 256 independent reads |", "|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['MB']:g} MB | {r['latency']:.1f} ns | {r['throughput']:.2f} ns |")
    lines += ["", "Lines outside L2 that one transition of a sample+update touches (see `line_counts`):", "",
              "| N | perx.Proportional | floor (six separate fields) |", "|---|---|---|"]
    for n, c in result["lines"].items():
        lines.append(f"| {n:.0e} | {c['perx.Proportional']} | {c['floor']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    print("| working set | latency | per line (256 independent) |")
    result = run()
    md = format_md(result, "python benchmarks/bench_memory.py" + (f" --out {args.out}" if args.out else ""))
    print(md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
