"""Where an episodic sample's time goes, against the plain layout (issue 40 item 4's attribution).

    python benchmarks/bench_episodic_parts.py --out results/episodic_parts.md

Vector observations float32[8], N = 1e6, one stream of 1000-step episodes (bench_buffer's episodic fill),
``Proportional(alpha=0.6)``. For each layout, medians over interleaved blocks (bench_buffer's timer) of:

* sample+update(B) and sample(B) alone;
* the episode store's gather for B ids drawn uniformly at random (``EpisodeStore.gather``: the windows, the
  observations, the batch's derived fields; a new set of ids each call, cycling through 64 sets, so that the
  rows are not in the cache, as in a sample), and for 0 ids: its fixed cost (Python, allocations, the kernel
  call);
* the window kernel (``perx.episodes._windows_stored``; ``_gather`` in shared mode) called with 0 ids: numba's
  dispatch of its arguments alone.

So gather(B) - gather(0) is the per-row work, gather(0) - kernel(0) the Python around the call, kernel(0) the
dispatch; sample(B) - gather(B) for an episodic layout is the draw and the stored fields' gather, which the plain
layout also pays.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import sys
from pathlib import Path

import numpy as np

import perx
from bench_buffer import UPDATE_POOL, _episode_fill, _fmt_time, _interleaved, _Values, cpu_model
from perx import episodes as E

LAYOUTS = [("obs and next_obs stored (no episodes)", None), ("Episodes(n_step=1)", perx.Episodes(n_step=1)),
           ("Episodes(n_step=3)", perx.Episodes(n_step=3)),
           ("Episodes(n_step=3, next_obs='shared')", perx.Episodes(n_step=3, next_obs="shared"))]


def kernel_args(buf: perx.ReplayBuffer, ids: np.ndarray) -> tuple:
    """(the window kernel, its arguments for ``ids``), as EpisodeStore.gather builds them."""
    st, storage = buf._episodes, buf._storage.data
    cfg, count = st.cfg, len(ids)
    floats, steps, (term, trunc) = np.empty((2, count)), np.empty(count, np.int64), np.empty((2, count), np.bool_)
    head = (ids, st.succ, storage["reward"], storage["terminated"], storage["truncated"], st.capacity, cfg.n_step,
            cfg.gamma)
    links = st.head if cfg.streams == 1 else np.empty(0, np.int64)
    if not cfg.shared:
        nxt = np.empty((count, 8), np.float32)
        return E._windows_stored, (*head, links, floats[0], floats[1], steps, term, trunc,
                                   E._rows(storage[cfg.next_name]), E._rows(nxt, count))
    obs = np.empty((count, 8), np.float32)
    nxt = np.empty_like(obs)
    return E._gather, (*head, links, floats[0], floats[1], steps, term, trunc, *st._ring(), st.rpred, st.ring,
                       E._rows(st.final_units), st.final, E._rows(st.head_units), st.stream, 0, False,
                       E._rows(obs, count), E._rows(nxt, count))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    bufs = {}
    for name, episodes in LAYOUTS:
        buf = perx.ReplayBuffer(args.n, perx.Proportional(alpha=0.6), seed=0, episodes=episodes)
        _episode_fill(buf, args.n, (8,), np.float32, None, np.random.default_rng(1))
        bufs[name] = buf
    pool = np.random.default_rng(2).random((UPDATE_POOL, 256))
    lines = []
    for b in (32, 256):
        id_sets = itertools.cycle(list(np.random.default_rng(3).integers(0, args.n, (64, b))))
        ids = next(id_sets)
        fns = {}
        for name, buf in bufs.items():
            values = _Values(pool)[b]

            def step(buf=buf, values=values, b=b):
                batch = buf.sample(b, beta=0.4)
                buf.update_priorities(batch.indices, next(values))

            fns[(name, "sample+update")] = step
            fns[(name, "sample")] = lambda buf=buf, b=b: buf.sample(b, beta=0.4)
            if buf._episodes is not None:
                st, storage = buf._episodes, buf._storage.data
                fns[(name, "gather(B)")] = lambda st=st, s=storage, sets=id_sets: st.gather(next(sets), None, {}, s)
                fns[(name, "gather(0)")] = lambda st=st, s=storage, ids=ids[:0]: st.gather(ids, None, {}, s)
                kernel, call0 = kernel_args(buf, ids[:0])
                fns[(name, "kernel(0)")] = lambda f=kernel, a=call0: f(*a)
        cells = _interleaved(fns, args.blocks, args.calls if b <= 64 else args.calls // 4)
        plain = cells[(LAYOUTS[0][0], "sample+update")].median
        for name in bufs:
            row = {part: cells[(n, part)].median for (n, part) in cells if n == name}
            su = row["sample+update"]
            parts = " | ".join(_fmt_time(row[p]) if p in row else "-" for p in
                               ("sample+update", "sample", "gather(B)", "gather(0)", "kernel(0)"))
            lines.append(f"| {name} | {b} | {parts} | {su / plain:.2f}x | {_fmt_time(su - plain)} |")
            print(lines[-1], flush=True)
    text = "\n".join([
        "# Where an episodic sample's time goes (vector observations)", "",
        f"Command: `python benchmarks/bench_episodic_parts.py {' '.join(sys.argv[1:])}`", "",
        f"Machine: {platform.machine()} ({cpu_model()}), {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"numpy {np.__version__}, perx {perx.__version__}. N = {args.n:,}; parts as the benchmark's docstring "
        f"defines them; medians over interleaved blocks.", "",
        "| layout | B | sample+update | sample | gather(B) | gather(0) | kernel(0) | ratio to plain | gap to plain |",
        "|---|---|---|---|---|---|---|---|---|", *lines, ""])
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
