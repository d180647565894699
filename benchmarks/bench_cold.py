"""Sample+update with the buffer's cache lines evicted before every call, as a training step evicts them.

`perx bench` times back-to-back calls, so the upper tree levels and recently used rows stay in cache within a
block. Here a 32 MB array is rewritten before each timed call (about 8x this VM's L2), for perx.Uniform,
perx.Proportional (with and without ``out=``) and the floor of `perx bench` (numpy gather of six separate
fields), each timed after its own eviction, interleaved call by call; medians. It also times the piece the
priority update cannot avoid: reading the 256 drawn mass lines and writing the 256 raw priorities.

    python benchmarks/bench_cold.py --out results/cold_cache.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import numpy as np
from numba import njit

import perx
from bench_buffer import cpu_model, make_data


@njit(cache=True)
def _touch_lines(mass, prio, slots, values):
    """Read each slot's 8-mass block and write its raw priority: 2 lines per draw."""
    acc = 0.0
    for b in range(slots.shape[0]):
        j = slots[b] // 8 * 8
        acc += mass[j] + mass[j + 7]
    for b in range(slots.shape[0]):
        prio[slots[b]] = values[b]
    return acc


def run(n: int, batch_size: int, calls: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    data = make_data(n, seed)
    evict = np.zeros(4 << 20)  # 32 MB
    floor = {k: v.copy() for k, v in data.items()}
    bufs = {name: perx.ReplayBuffer(n, sampler, seed=seed) for name, sampler in
            (("perx.Uniform", perx.Uniform()), ("perx.Proportional", perx.Proportional(alpha=0.6, normalize="buffer")),
             ("perx.Proportional out=", perx.Proportional(alpha=0.6, normalize="buffer")))}
    for buf in bufs.values():
        buf.extend(**data)
    pool = rng.random((64, batch_size))
    kept = {"out": bufs["perx.Proportional out="].sample(batch_size, beta=0.4)}
    mass, prio = np.zeros(n), np.zeros(n)

    def floor_call(i):
        idx = rng.integers(0, n, batch_size)
        for arr in floor.values():
            arr[idx]

    def perx_call(name):
        buf = bufs[name]

        def call(i):
            if name.endswith("out="):
                batch = buf.sample(batch_size, beta=0.4, out=kept["out"])
            else:
                batch = buf.sample(batch_size, beta=0.4)
            buf.update_priorities(batch.indices, pool[i % 64])
        return call

    def lines_call(i):
        _touch_lines(mass, prio, np.sort(rng.integers(0, n, batch_size)), pool[i % 64])

    fns = {"floor": floor_call, **{name: perx_call(name) for name in bufs},
           "2 lines per draw (mass read + priority write)": lines_call}
    for fn in fns.values():  # compile and warm
        fn(0)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(calls):
        for name, fn in fns.items():
            evict += 1.0
            t0 = time.perf_counter_ns()
            fn(i)
            times[name].append((time.perf_counter_ns() - t0) / 1000)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="buffer size N")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--calls", type=int, default=1500, help="timed calls per implementation and batch size")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    command = " ".join(["python benchmarks/bench_cold.py", *(argv if argv is not None else sys.argv[1:])])
    lines = ["# Sample+update with the buffer's cache lines evicted before every call", "",
             f"Command: `{command}`", "",
             f"Machine: {platform.machine()} ({cpu_model()}), Python {platform.python_version()}, "
             f"numpy {np.__version__}, "
             f"perx {perx.__version__}. N = {args.size:,}; 32 MB rewritten before each timed call; median of "
             f"{args.calls} calls each, interleaved call by call. Ratio to the floor (`rng.integers` + numpy "
             "gather of six separate fields) of the same batch size.", "",
             "| B | implementation | µs per call | ratio to floor |", "|---|---|---|---|"]
    for b in args.batch_sizes:
        res = run(args.size, b, args.calls)
        for name, t in res.items():
            lines.append(f"| {b} | {name} | {t:.1f} | {t / res['floor']:.2f}x |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
