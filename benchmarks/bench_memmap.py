"""Sample + update of a memmap buffer (fields in files on disk) against the same buffer in RAM.

    python benchmarks/bench_memmap.py --sizes 10000000 100000000 --out results/memmap.md

Transitions of 8-float observations (obs and next_obs float32[8], int64 action, float32 reward, two bools: 80
bytes a row), perx.Proportional(alpha=0.6), B = 32 and 256, one sample(B) + update_priorities(B) per call.

Three states of the same buffer:
  * ram: ``ReplayBuffer(N, ...)``, the floor;
  * memmap, warm: ``ReplayBuffer(N, ..., memmap=folder)`` right after it was filled, its file's pages in the page
    cache (``fincore`` reports the resident share);
  * memmap, cold: closed, its pages evicted from the page cache with ``posix_fadvise(POSIX_FADV_DONTNEED)`` on
    the file after an fsync (no global cache drop: only this file's pages go), then reopened with
    ``ReplayBuffer.open``; the calls are timed from the first one, so each touches pages not yet read back.
    ``fincore`` before the first call shows the share still resident. Three ways: perx's default mapping
    (``MADV_RANDOM``: a fault reads its page only; what every row costs once the buffer is larger than RAM),
    the kernel's default (``MADV_NORMAL``: a fault reads the device's read-ahead window around it, so the
    cache fills fast when the file fits in RAM), and ``open(warm=True)`` (the file read once sequentially before
    open returns; the open time includes it).

ram and memmap-warm are timed in interleaved blocks where both fit in RAM together (N <= --interleave-max), else
one after the other. The memmap folder lives under --dir (default: a temporary folder on the disk that holds
/tmp); the table says which file system and device.
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

import perx
from bench_buffer import cpu_model

FIELDS = {"obs": ((8,), np.float32), "next_obs": ((8,), np.float32), "action": ((), np.int64),
          "reward": ((), np.float32), "terminated": ((), np.bool_), "truncated": ((), np.bool_)}
CHUNK = 1 << 20
COLD = ("memmap, cold (MADV_RANDOM: perx's default)", "memmap, cold, read-around (MADV_NORMAL)",
        "memmap, cold, open(warm=True)")


def fill(buf: perx.ReplayBuffer, n: int, rng: np.random.Generator) -> float:
    """Add n transitions in chunks of 2^20; returns the seconds taken."""
    obs = rng.standard_normal((CHUNK, 8)).astype(np.float32)
    chunk = {"obs": obs, "next_obs": obs + 1, "action": rng.integers(0, 4, CHUNK),
             "reward": rng.standard_normal(CHUNK).astype(np.float32), "terminated": rng.random(CHUNK) < 0.01,
             "truncated": np.zeros(CHUNK, bool)}
    start = time.perf_counter()
    done = 0
    while done < n:
        k = min(CHUNK, n - done)
        buf.extend(**({name: a[:k] for name, a in chunk.items()} if k < CHUNK else chunk))
        done += k
    return time.perf_counter() - start


def step(buf: perx.ReplayBuffer, b: int, td: np.ndarray) -> None:
    batch = buf.sample(b, 0.4)
    buf.update_priorities(batch.indices, td)


def resident(path: Path) -> str:
    """The share of ``path``'s pages in the page cache, from util-linux ``fincore`` ('?' without it)."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES,SIZE", str(path)],
                             capture_output=True, text=True, timeout=60).stdout.split()
        return f"{int(out[0]) / max(int(out[1]), 1):.0%}"
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return "?"


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def per_call(fn, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def blocks(fns: dict, rounds: int, calls: int) -> dict[str, list[float]]:
    """Median seconds per call of each block of ``calls`` calls, ``rounds`` blocks each, interleaved."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            out[k].append(statistics.median(per_call(fn, calls)))
    return out


def run_size(n: int, batch_sizes: list[int], folder: Path, rounds: int, calls: int, cold_calls: int,
             interleave: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    td = {b: np.abs(rng.standard_normal(b)) for b in batch_sizes}
    path = folder / f"n{n}"
    shutil.rmtree(path, ignore_errors=True)

    def make(memmap):
        buf = perx.ReplayBuffer(n, perx.Proportional(alpha=0.6), seed=0, spec=FIELDS, memmap=memmap)
        return buf, fill(buf, n, rng)

    results: dict[str, dict[int, list[float]]] = {"ram": {}, "memmap, warm": {}}
    fills = {}
    if interleave:
        ram, fills["ram"] = make(None)
        disk, fills["memmap, warm"] = make(path)
        for b in batch_sizes:
            got = blocks({"ram": partial(step, ram, b, td[b]), "memmap, warm": partial(step, disk, b, td[b])},
                         rounds, calls)
            for k, v in got.items():
                results[k][b] = v
        del ram
    else:
        ram, fills["ram"] = make(None)
        for b in batch_sizes:
            results["ram"][b] = blocks({"ram": partial(step, ram, b, td[b])}, rounds, calls)["ram"]
        del ram
        gc.collect()
        disk, fills["memmap, warm"] = make(path)
        for b in batch_sizes:
            results["memmap, warm"][b] = blocks({"m": partial(step, disk, b, td[b])}, rounds, calls)["m"]
    warm_res = resident(path / "rows.npy")
    t = time.perf_counter()
    disk.close()
    close_s = time.perf_counter() - t
    disk = None
    gc.collect()
    for b in batch_sizes:
        floor = statistics.median(results["ram"][b])
        for name in ("ram", "memmap, warm"):
            med = statistics.median(results[name][b])
            rows.append({"n": n, "b": b, "state": name, "us": 1e6 * med, "ratio": med / floor,
                         "spread": f"{1e6 * min(results[name][b]):.0f}-{1e6 * max(results[name][b]):.0f}",
                         "resident": "-" if name == "ram" else warm_res, "fill_s": fills[name],
                         "calls": f"{rounds} x {calls}"})
        for state in COLD:
            evict(path / "rows.npy")
            cold_res = resident(path / "rows.npy")
            t = time.perf_counter()
            disk = perx.ReplayBuffer.open(path, warm=state == COLD[2])
            open_s = time.perf_counter() - t
            if state == COLD[1]:  # the kernel's default for a mapping: read around each faulting page
                disk._mapped.arrays["rows"]._mmap.madvise(mmap.MADV_NORMAL)
            waited = f", open read it in {open_s:.1f} s" if state == COLD[2] else ""
            times = per_call(partial(step, disk, b, td[b]), cold_calls)
            after = resident(path / "rows.npy")
            disk.close()
            disk = None
            gc.collect()
            med = statistics.median(times)
            rows.append({"n": n, "b": b, "state": state, "us": 1e6 * med, "ratio": med / floor,
                         "spread": f"p10 {1e6 * np.percentile(times, 10):.0f}, "
                                   f"p90 {1e6 * np.percentile(times, 90):.0f}",
                         "resident": f"{cold_res} -> {after}{waited}", "fill_s": None,
                         "calls": f"first {cold_calls}", "close_s": close_s, "open_s": open_s})
    shutil.rmtree(path, ignore_errors=True)
    return rows


def device_of(folder: Path) -> str:
    try:
        out = subprocess.run(["df", "--output=source,fstype", str(folder)], capture_output=True, text=True,
                             timeout=30).stdout.split("\n")[1].split()
        return f"{out[0]} ({out[1]})"
    except (OSError, IndexError, subprocess.SubprocessError):
        return "?"


def table(rows: list[dict], command: str, folder: Path) -> str:
    lines = [
        "# Memmap buffers: sample + update against the buffer in RAM", "",
        f"`{command}`", "",
        f"CPU: {cpu_model()}; Python {platform.python_version()}; numpy {np.__version__}; perx {perx.__version__}; "
        f"the memmap folder on {device_of(folder)}. Medians; the ratio is to the buffer in RAM at the same N and B.",
        "",
        "| N | B | state | us per sample+update | ratio to RAM | spread | file pages resident | calls |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['n']:.0e} | {r['b']} | {r['state']} | {r['us']:.0f} | {r['ratio']:.2f}x | {r['spread']} | "
                     f"{r['resident']} | {r['calls']} |")
    lines += ["", "| N | fill, RAM (s) | fill, memmap (s) | close (s) | open (s) |", "|---|---|---|---|---|"]
    for n in sorted({r["n"] for r in rows}):
        fill_ram = next(r["fill_s"] for r in rows if r["n"] == n and r["state"] == "ram")
        fill_mm = next(r["fill_s"] for r in rows if r["n"] == n and r["state"] == "memmap, warm")
        cold = [r for r in rows if r["n"] == n and r["state"] in COLD]
        lines.append(f"| {n:.0e} | {fill_ram:.1f} | {fill_mm:.1f} | {cold[0]['close_s']:.1f} | "
                     f"{statistics.median(r['open_s'] for r in cold):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_memmap.py", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000_000])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--cold-calls", type=int, default=300)
    parser.add_argument("--interleave-max", type=int, default=20_000_000,
                        help="largest N whose RAM and memmap buffers are built together and timed interleaved")
    parser.add_argument("--dir", type=Path, default=None, help="where the memmap folders go (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="perx-bench-memmap-", dir="/var/tmp"))
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.sizes:
        rows += run_size(n, args.batch_sizes, folder, args.rounds, args.calls, args.cold_calls,
                         n <= args.interleave_max)
        print(table(rows, "python benchmarks/bench_memmap.py " + " ".join(sys.argv[1:] if argv is None else argv),
                    folder), flush=True)
    text = table(rows, "python benchmarks/bench_memmap.py " + " ".join(sys.argv[1:] if argv is None else argv), folder)
    if args.out:
        args.out.write_text(text)
    if args.dir is None:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
