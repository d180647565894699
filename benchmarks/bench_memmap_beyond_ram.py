"""A memmap buffer larger than the machine's RAM: does it work, and what does sample + update cost there?

    python benchmarks/bench_memmap_beyond_ram.py --out results/memmap_beyond_ram.md

Rows of one Atari-sized frame (obs uint8[84, 84], int64 action, float32 reward, bool terminated), N chosen so
the file is ``--times`` (default 1.25) x the machine's RAM (MemTotal), perx.Proportional(alpha=0.6), one
sample(B) + update_priorities(B) per call. The page cache can then hold at most RAM / file size of the rows,
so a share of every batch's rows is read from the device however long the buffer runs: the steady state the
cold rows of results/memmap.md only start from.

Checked, not only timed: every frame's first 8 bytes hold its row index, and every sampled batch is compared
with its indices (a wrong row, torn page or stale mapping fails the run). The floor is the same row layout in
RAM at ``--floor-n`` rows (a buffer of the large N cannot be in RAM: that is the point). Blocks of ``--calls``
calls, each block's median and the file's resident share (util-linux ``fincore``) after it, so the steady
state shows as the blocks stop changing.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import perx
from bench_buffer import cpu_model
from bench_memmap import device_of, per_call, resident

FIELDS = {"obs": ((84, 84), np.uint8), "action": ((), np.int64), "reward": ((), np.float32),
          "terminated": ((), np.bool_)}
CHUNK = 8192


def mem_total() -> int:
    """The machine's RAM in bytes (/proc/meminfo MemTotal)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def fill(buf: perx.ReplayBuffer, n: int, rng: np.random.Generator) -> float:
    """Add n rows in chunks, frame i's first 8 bytes = i; returns the seconds taken."""
    obs = rng.integers(0, 256, (CHUNK, 84, 84), dtype=np.uint8)
    start, done = time.perf_counter(), 0
    while done < n:
        k = min(CHUNK, n - done)
        obs.reshape(CHUNK, -1)[:, :8] = np.arange(done, done + CHUNK, dtype=np.uint64)[:, None].view(np.uint8)
        buf.extend(obs=obs[:k], action=np.zeros(k, np.int64), reward=np.zeros(k, np.float32),
                   terminated=np.zeros(k, bool))
        done += k
    return time.perf_counter() - start


def checked_step(buf: perx.ReplayBuffer, b: int, td: np.ndarray) -> None:
    batch = buf.sample(b, 0.4)
    tags = np.ascontiguousarray(batch["obs"].reshape(b, -1)[:, :8]).view(np.uint64).ravel()
    if not np.array_equal(tags, batch.indices.astype(np.uint64)):
        raise AssertionError(f"sampled rows do not hold their indices: {tags[:4]} vs {batch.indices[:4]}")
    buf.update_priorities(batch.indices, td)


def floor(n: int, batch_sizes: list[int], td: dict, calls: int, rng: np.random.Generator) -> dict[int, float]:
    """Median us per checked sample + update of the same layout in RAM at ``n`` rows, per batch size."""
    buf = perx.ReplayBuffer(n, perx.Proportional(alpha=0.6), seed=0, spec=FIELDS)
    fill(buf, n, rng)
    return {b: 1e6 * statistics.median(per_call(lambda b=b: checked_step(buf, b, td[b]), calls)) for b in batch_sizes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_memmap_beyond_ram.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--times", type=float, default=1.25, help="file size / RAM (default %(default)s)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--floor-n", type=int, default=500_000)
    parser.add_argument("--dir", type=Path, default=None, help="where the memmap folder goes (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    row_bytes = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in FIELDS.values())
    ram = mem_total()
    n = int(args.times * ram / row_bytes)
    folder = Path(tempfile.mkdtemp(prefix="perx-beyond-", dir=args.dir))
    need = n * row_bytes
    free = shutil.disk_usage(folder).free
    if need > 0.9 * free:
        print(f"--times: {args.times} needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    td = {b: np.abs(rng.standard_normal(b)) for b in args.batch_sizes}
    lines = []
    try:
        floor_us = floor(args.floor_n, args.batch_sizes, td, 3 * args.calls, rng)
        path = folder / "buf"
        buf = perx.ReplayBuffer(n, perx.Proportional(alpha=0.6), seed=0, spec=FIELDS, memmap=path)
        fill_s = fill(buf, n, rng)
        size = sum(f.stat().st_size for f in path.iterdir())
        rows_file = next(f for f in path.iterdir() if f.name.startswith("rows"))
        print(f"N = {n:,}, files {size / 2**30:.1f} GiB, RAM {ram / 2**30:.1f} GiB, filled in {fill_s:.0f} s, "
              f"resident {resident(rows_file)}", flush=True)
        for b in args.batch_sizes:
            meds: dict[bool, list[float]] = {False: [], True: []}
            for k in range(args.blocks):
                cells = []
                for on in (False, True):  # interleaved, so both see the same page-cache history
                    buf.prefetch = on
                    times = per_call(lambda b=b: checked_step(buf, b, td[b]), args.calls)
                    meds[on].append(1e6 * statistics.median(times))
                    cells.append(f"{meds[on][-1]:.0f} ({meds[on][-1] / floor_us[b]:.1f}x; p90 "
                                 f"{1e6 * np.percentile(times, 90):.0f})")
                lines.append(f"| {b} | {k + 1} | {cells[0]} | {cells[1]} | {meds[False][-1] / meds[True][-1]:.1f}x | "
                             f"{resident(rows_file)} |")
                print(lines[-1], flush=True)
            off, on_ = statistics.median(meds[False]), statistics.median(meds[True])
            lines.append(f"| {b} | median | {off:.0f} ({off / floor_us[b]:.1f}x) | "
                         f"{on_:.0f} ({on_ / floor_us[b]:.1f}x) | {off / on_:.1f}x | |")
        buf.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    command = "python benchmarks/bench_memmap_beyond_ram.py" + (" " + " ".join(argv or sys.argv[1:])).rstrip()
    text = "\n".join([
        "# A memmap buffer larger than RAM: sample + update in the steady state", "",
        f"`{command}`", "",
        f"CPU: {cpu_model()}; Python {platform.python_version()}; numpy {np.__version__}; perx {perx.__version__}; "
        f"the memmap folder on {device_of(folder.parent)}. RAM (MemTotal) {ram / 2**30:.1f} GiB; N = {n:,} rows of "
        f"{row_bytes:,} bytes (an 84x84 uint8 frame, action, reward, terminated): files {size / 2**30:.1f} GiB, "
        f"{size / ram:.2f}x RAM, filled in {fill_s:.0f} s. Every sampled row was checked against its index.", "",
        f"Floor: the same layout in RAM at N = {args.floor_n:,}: "
        + ", ".join(f"B = {b}: {floor_us[b]:.0f} us" for b in args.batch_sizes)
        + f" (median of {3 * args.calls} calls).",
        "",
        "Each cell: median us per sample+update of a block (ratio to the floor; p90). Prefetch off: each row's "
        "pages are faulted in one at a time. On: `buf.prefetch = True` (madvise(MADV_WILLNEED) on every sampled "
        "row, then the copy).", "",
        "| B | block | prefetch off | prefetch on | off / on | rows file resident after |",
        "|---|---|---|---|---|---|", *lines, ""])
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
