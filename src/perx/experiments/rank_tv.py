"""How far is the heap approximation of rank-based PER from the exact power law? (000 App. B.2.1)

A stream like a DQN learner's: the buffer is filled with N new transitions, then every learning step
adds ``adds_per_step`` new transitions (at +inf, as new transitions enter), samples a batch of B with
``perx.RankBased`` in heap mode, and replaces the replayed transitions' |delta| -- a heavy-tailed draw
(Pareto, shape 1.5) at the first replay, then the previous value times a log-normal factor
(median 0.9, sigma 0.5) so errors shrink noisily as they are replayed.

Every ``measure_every`` steps it computes three total-variation distances over the stored transitions
(0.5 * sum_i |P(i) - Q(i)|):

* ``tv_total``: what the heap sampler actually draws (segment probability at the transition's heap
  position) against the exact power law at its true rank -- the error a user gets;
* ``tv_order``: the same segment probabilities at heap position vs at true rank -- the heap's disorder;
* ``tv_segments``: segment probabilities vs the power law, both at the true rank -- the error of the
  paper's piecewise-linear CDF alone, which no amount of sorting removes.

Writes ``rank_tv.csv`` (one row per measurement), ``summary.csv`` (means per sort_every), ``meta.json``
(configuration and versions), ``segments.csv`` and ``rank_tv.png`` to ``--out`` (default ``runs/rank_tv``,
which git ignores; ``--out results/rank_tv`` regenerates the committed study).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

import perx
from perx.samplers.rank import power_law, rank_segments, segment_probabilities


@dataclass(frozen=True)
class Config:
    capacity: int = 100_000
    """N, the number of stored transitions."""
    batch_size: int = 32
    """B = k, the number of segments."""
    alpha: float = 0.7
    """Power-law exponent (000 Table 3, rank-based Double DQN)."""
    adds_per_step: int = 4
    """New transitions per learning step (a replay period of 4, as in 000's Atari agents)."""
    steps: int = 50_000
    """Learning steps after the fill (each replays B transitions)."""
    measure_every: int = 1_000
    """Steps between measurements."""
    sort_every: tuple[int, ...] = field(default=(1_000, 10_000, 100_000, 1_000_000, 0))
    """Values of RankBased(sort_every=...) to compare, in priority updates; 0 means never."""
    seeds: int = 3
    """Independent streams per sort_every."""


def _true_ranks(sampler: perx.RankBased, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(heap position, exact rank) of every slot."""
    slots = np.arange(n)
    keys = sampler.keys(slots)
    ids = sampler._ids[sampler._pos[slots]]
    exact = np.empty(n, np.int64)
    exact[np.lexsort((ids, -keys))] = np.arange(n)
    return sampler.ranks(slots), exact


def measure(sampler: perx.RankBased, n: int, k: int, alpha: float) -> dict[str, float]:
    heap_pos, exact = _true_ranks(sampler, n)
    lo, hi = rank_segments(n, k, alpha)
    p_heap = segment_probabilities(lo, hi, heap_pos)
    p_seg_true = segment_probabilities(lo, hi, exact)
    target = power_law(n, alpha)[exact]
    return {
        "tv_total": 0.5 * float(np.abs(p_heap - target).sum()),
        "tv_order": 0.5 * float(np.abs(p_heap - p_seg_true).sum()),
        "tv_segments": 0.5 * float(np.abs(p_seg_true - target).sum()),
        "rank_displacement": float(np.mean(np.abs(heap_pos - exact))) / n,
    }


def run_stream(cfg: Config, sort_every: int, seed: int) -> list[dict]:
    n, k = cfg.capacity, cfg.batch_size
    never = 10**18
    sampler = perx.RankBased(alpha=cfg.alpha, sort_every=sort_every or never)
    buf = perx.ReplayBuffer(n, sampler, seed=seed, spec={"x": ((), np.float32)})
    rng = np.random.default_rng([seed, 1])
    buf.extend(x=np.zeros(n, np.float32))
    last_delta = np.full(n, np.nan)  # by slot; NaN = not replayed yet
    rows = []
    t0 = time.perf_counter()
    update_seconds = 0.0
    for step in range(1, cfg.steps + 1):
        ids = buf.extend(x=np.zeros(cfg.adds_per_step, np.float32))
        last_delta[ids % n] = np.nan
        batch = buf.sample(k, beta=0.5)
        slots = batch.indices % n
        prev = last_delta[slots]
        fresh = (rng.pareto(1.5, k) + 1.0) * 0.1
        new = np.where(np.isnan(prev), fresh, prev * rng.lognormal(np.log(0.9), 0.5, k))
        last_delta[slots] = new
        u0 = time.perf_counter()
        buf.update_priorities(batch.indices, new)
        update_seconds += time.perf_counter() - u0
        if step % cfg.measure_every == 0:
            row = {"seed": seed, "sort_every": sort_every, "step": step, **measure(sampler, n, k, cfg.alpha)}
            rows.append(row)
    elapsed = time.perf_counter() - t0
    for row in rows:
        row["us_per_update_call"] = 1e6 * update_seconds / cfg.steps
        row["stream_seconds"] = elapsed
    return rows


def segment_error_table(sizes=(1_000, 10_000, 100_000, 1_000_000), ks=(32, 256), alphas=(0.5, 0.7)
                        ) -> list[dict]:
    """TV between the segment distribution and the power law over sorted ranks (no heap involved)."""
    rows = []
    for alpha in alphas:
        for n in sizes:
            row = {"alpha": alpha, "N": n}
            for k in ks:
                lo, hi = rank_segments(n, k, alpha)
                p = segment_probabilities(lo, hi, np.arange(n))
                row[f"tv_k{k}"] = 0.5 * float(np.abs(p - power_law(n, alpha)).sum())
            rows.append(row)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for se in sorted({r["sort_every"] for r in rows}, key=lambda v: v or 10**18):
        sel = [r for r in rows if r["sort_every"] == se]
        entry = {"sort_every": se or "never"}
        for key in ("tv_total", "tv_order", "tv_segments", "rank_displacement", "us_per_update_call"):
            vals = np.array([r[key] for r in sel])
            entry[key] = float(vals.mean())
            entry[key + "_max"] = float(vals.max())
        out.append(entry)
    return out


def plot(summary: list[dict], cfg: Config, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(s["sort_every"]) for s in summary]
    x = np.arange(len(summary))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key, label in (("tv_total", "heap sampler vs power law (total)"),
                       ("tv_order", "heap disorder only"),
                       ("tv_segments", "segments only (sorted)")):
        ax.plot(x, [s[key] for s in summary], marker="o", label=label)
    ax.set_xticks(x, labels)
    ax.set_xlabel("sort_every (priority updates between full sorts)")
    ax.set_ylabel("total-variation distance")
    ax.set_title(f"Rank-based PER, N={cfg.capacity:,}, k=B={cfg.batch_size}, alpha={cfg.alpha}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: Where ``perx rank-tv`` writes unless ``--out`` says otherwise: a folder git ignores, so an interrupted run
#: never touches the committed study (``--out results/rank_tv`` regenerates that one).
DEFAULT_OUT = "runs/rank_tv"


def build_parser(prog: str = "perx rank-tv") -> argparse.ArgumentParser:
    d = Config()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=d.capacity, help="N stored transitions")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="B = number of segments")
    parser.add_argument("--alpha", type=float, default=d.alpha)
    parser.add_argument("--steps", type=int, default=d.steps, help="learning steps after the fill")
    parser.add_argument("--measure-every", type=int, default=d.measure_every)
    parser.add_argument("--sort-every", type=int, nargs="+", default=list(d.sort_every),
                        help="values to compare (priority updates; 0 = never)")
    parser.add_argument("--seeds", type=int, default=d.seeds)
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="folder for CSV, PNG and meta.json (default: %(default)s, which git ignores; "
                             "results/rank_tv is the committed study)")
    return parser


def main(argv: list[str] | None = None, prog: str = "perx rank-tv") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog).parse_args(argv)
    cfg = Config(capacity=args.capacity, batch_size=args.batch_size, alpha=args.alpha, steps=args.steps,
                 measure_every=args.measure_every, sort_every=tuple(args.sort_every), seeds=args.seeds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for se in cfg.sort_every:
        for seed in range(cfg.seeds):
            stream = run_stream(cfg, se, seed)
            rows += stream
            mean_tv = np.mean([r["tv_total"] for r in stream])
            print(f"sort_every={se or 'never':>8} seed={seed}: tv_total={mean_tv:.4f} "
                  f"({stream[-1]['stream_seconds']:.1f} s)", flush=True)
    with open(out / "rank_tv.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = summarize(rows)
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    meta = {"command": " ".join([prog, *argv]), "config": asdict(cfg), "perx": perx.__version__,
            "numpy": np.__version__, "python": platform.python_version()}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    plot(summary, cfg, out / "rank_tv.png")
    seg_rows = segment_error_table()
    with open(out / "segments.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(seg_rows[0]))
        writer.writeheader()
        writer.writerows(seg_rows)
    print()
    print("| sort_every | TV total (mean / max) | TV heap order | TV segments | mean rank displacement / N "
          "| update call (us) |")
    print("|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['sort_every']} | {s['tv_total']:.4f} / {s['tv_total_max']:.4f} | {s['tv_order']:.4f} | "
              f"{s['tv_segments']:.4f} | {s['rank_displacement']:.4f} | {s['us_per_update_call']:.1f} |")
    print("\nSegments alone (sorted ranks), TV to the power law:\n")
    ks = [key for key in seg_rows[0] if key.startswith("tv_k")]
    print("| alpha | N | " + " | ".join(f"k = {key[4:]}" for key in ks) + " |")
    print("|---|---|" + "---|" * len(ks))
    for r in seg_rows:
        print(f"| {r['alpha']} | {r['N']:,} | " + " | ".join(f"{r[key]:.4f}" for key in ks) + " |")
    print(f"\nwrote {out}/rank_tv.csv, summary.csv, segments.csv, meta.json, rank_tv.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
