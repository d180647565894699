"""The priority variants of 000 Appendix A on the Blind Cliffwalk (linear, the setting of 000 Figure 2).

Every variant is plain proportional prioritization (alpha 0.6, no IS weights, as the Figure 2 curves) plus
one rule of :mod:`perx.priorities` or a hybrid sampler, against uniform and plain proportional (and
rank-based, the baseline of the staleness bonus, which needs an order-based sampler). Q-learning with the
linear features of ``perx cliffwalk`` (a block [one-hot(s), 1] per action), one transition per update,
updates counted until the MSE to the true Q-values falls below 1e-3; the memory order and initial
parameters depend only on (seed, n), so every variant starts from the same memory and parameters.

  uniform             perx.Uniform
  proportional        perx.Proportional(0.6)
  learning-progress   + LearningProgress(): priority |(|delta| now) - (|delta| at the last replay)|
  rprop-sign          + LearningProgress(sign_rule=True): x1.2 while the sign holds, x0.5 when it flips
  asymmetric          + Asymmetric(positive=2): positive TD errors count double
  return-to-go        + ReturnBoost(1): priority + the discounted return-to-go of the transition
  episode-return      + ReturnBoost(1, episode=True): priority + its episode's return
  predecessor         + PredecessorBoost(1): |delta| added to the predecessor's priority
  hybrid              perx.Hybrid([Proportional(0.6), Uniform()], [0.5, 0.5], mixing="random")
  rank                perx.RankBased(0.7, segments=32)
  rank-staleness      + Staleness(1 / N): every transition's priority grows by 1 per N updates unreplayed

Outputs, in ``--out`` (default ``runs/variants``, which git ignores; ``--out results/variants`` regenerates the
committed study): ``runs.csv``, ``summary.csv`` (median updates to convergence per variant and n), ``meta.json``,
``variants.png`` and ``table.md`` (each variant against proportional at the largest n: paired Wilcoxon p, raw and
Holm-adjusted over the family of those tests). ``--plot-only`` redraws all but runs.csv from runs.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

import perx
from perx.envs import BlindCliffwalk
from perx.experiments._cliffwalk_learner import CONVERGED_MSE, Learner
from perx.experiments._pool import run_jobs
from perx.experiments._stats import holm
from perx.priorities import Asymmetric, LearningProgress, PredecessorBoost, ReturnBoost, Staleness

VARIANTS = ("uniform", "proportional", "learning-progress", "rprop-sign", "asymmetric", "return-to-go",
            "episode-return", "predecessor", "hybrid", "rank", "rank-staleness")


@dataclass(frozen=True)
class Config:
    n_min: int = 2
    """Smallest chain."""
    n_max: int = 12
    """Largest chain (memory 2^(n+1) - 2 = 8,190 at n = 12)."""
    seeds: int = 10
    """Runs per (variant, n)."""
    variants: tuple[str, ...] = field(default=VARIANTS)
    """Variants to run."""
    alpha: float = 0.6
    """Proportional exponent (000 Table 3)."""
    alpha_rank: float = 0.7
    """Rank-based exponent (000 Table 3)."""
    cap_factor: int = 50
    """Cap on updates, in multiples of the memory size."""


def make(variant: str, cfg: Config, buf_factory, size: int):
    """(buffer, prioritizer or None) for a variant; ``buf_factory(sampler)`` builds the filled buffer."""
    if variant == "uniform":
        return buf_factory(perx.Uniform()), None
    if variant == "hybrid":
        sampler = perx.Hybrid([perx.Proportional(cfg.alpha), perx.Uniform()], [0.5, 0.5], mixing="random")
        return buf_factory(sampler), None
    if variant.startswith("rank"):
        buf = buf_factory(perx.RankBased(cfg.alpha_rank, segments=32))
        rules = [Staleness(1.0 / size, horizon=float(cfg.cap_factor * size + 1))] if variant == "rank-staleness" \
            else []
        return buf, perx.Prioritizer(buf, *rules)
    rules = {"proportional": [], "learning-progress": [LearningProgress()],
             "rprop-sign": [LearningProgress(sign_rule=True)], "asymmetric": [Asymmetric(positive=2.0)],
             "return-to-go": [ReturnBoost(1.0)], "episode-return": [ReturnBoost(1.0, episode=True)],
             "predecessor": [PredecessorBoost(1.0)]}
    if variant not in rules:
        raise ValueError(f"variant: must be one of {VARIANTS}, got {variant!r}")
    buf = buf_factory(perx.Proportional(cfg.alpha))
    return buf, perx.Prioritizer(buf, *rules[variant])


def run_one(variant: str, n: int, seed: int, cfg: Config) -> dict:
    streams = np.random.SeedSequence([seed, n]).spawn(3)  # the same memory and parameters as perx cliffwalk
    env = BlindCliffwalk(n, seed=np.random.default_rng(streams[0]).integers(2**63))
    memory = env.replay_memory()
    size = len(memory["obs"])
    learner = Learner(env, True, np.random.default_rng(streams[1]), "per-action")
    sampler_seed = int(np.random.default_rng(streams[2]).integers(2**63)) + VARIANTS.index(variant)

    def filled(sampler):
        buf = perx.ReplayBuffer(size, sampler, seed=sampler_seed)
        buf.extend(**memory)
        return buf

    buf, prio = make(variant, cfg, filled, size)
    if variant in ("return-to-go", "episode-return"):
        ends = np.flatnonzero(memory["terminated"])
        starts = np.concatenate(([0], ends[:-1] + 1))
        for a, b in zip(starts, ends, strict=True):  # the memory holds whole episodes in execution order
            prio.record_episode(np.arange(a, b + 1), memory["reward"][a:b + 1], gamma=env.gamma)
    cap = cfg.cap_factor * size
    ones, deltas = np.ones(1), np.empty(1)
    updates, mse = 0, learner.mse()
    t0 = time.perf_counter()
    while mse >= CONVERGED_MSE and updates < cap:
        batch = buf.sample(1, beta=0.0)
        done, mse = learner.learn(batch["obs"], batch["action"], batch["reward"], batch["next_obs"],
                                  batch["terminated"], ones, deltas)
        updates += done
        if prio is not None:
            prio.update(batch.indices, deltas)
        elif variant != "uniform":
            buf.update_priorities(batch.indices, deltas)
    return {"variant": variant, "n": n, "memory_size": size, "seed": seed, "updates": updates,
            "converged": bool(mse < CONVERGED_MSE), "final_mse": mse, "seconds": round(time.perf_counter() - t0, 3)}


def _run_job(args) -> dict:
    return run_one(*args)


FIELDS = ["variant", "n", "memory_size", "seed", "updates", "converged", "final_mse", "seconds"]


def read_runs(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for key in ("n", "memory_size", "seed", "updates"):
            r[key] = int(r[key])
        r["converged"] = r["converged"] == "True"
        r["final_mse"], r["seconds"] = float(r["final_mse"]), float(r["seconds"])
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for variant in VARIANTS:
        for n in sorted({r["n"] for r in rows}):
            sel = [r for r in rows if r["variant"] == variant and r["n"] == n]
            if not sel:
                continue
            ups = np.array([r["updates"] if r["converged"] else np.inf for r in sel])
            with np.errstate(invalid="ignore"):  # quartiles of runs that never converged are inf
                q25, q75 = (float(np.percentile(ups, q, method="lower")) for q in (25, 75))
            out.append({"variant": variant, "n": n, "memory_size": sel[0]["memory_size"], "runs": len(sel),
                        "converged": int(np.isfinite(ups).sum()), "median_updates": float(np.median(ups)),
                        "q25": q25, "q75": q75})
    return out


def compare(rows: list[dict], n: int, base: str = "proportional") -> list[dict]:
    """Each variant against ``base`` at chain size n: ratio of medians and a paired two-sided Wilcoxon
    signed-rank test over seeds (a seed fixes the memory and the initial parameters for every variant);
    runs that did not converge count as the cap. ``holm_p``: the p-values Holm-adjusted over the family of
    every variant-against-``base`` test at this n (the base's own row is no test: NaN)."""
    from scipy import stats

    def updates(variant):
        sel = {r["seed"]: r["updates"] for r in rows if r["variant"] == variant and r["n"] == n}
        return sel

    ref = updates(base)
    out = []
    for variant in VARIANTS:
        cur = updates(variant)
        seeds = sorted(set(ref) & set(cur))
        if not seeds:
            continue
        a, b = np.array([cur[s] for s in seeds]), np.array([ref[s] for s in seeds])
        p = 1.0 if variant == base or (a == b).all() else float(stats.wilcoxon(a, b).pvalue)
        out.append({"variant": variant, "n": n, "seeds": len(seeds), "median": float(np.median(a)),
                    "ratio_to_" + base: float(np.median(a) / np.median(b)), "wins": int((a < b).sum()),
                    "wilcoxon_p": p, "holm_p": float("nan")})
    tests = [t for t in out if t["variant"] != base]
    for t, adjusted in zip(tests, holm([t["wilcoxon_p"] for t in tests]), strict=True):
        t["holm_p"] = float(adjusted)
    return out


STYLE = {"uniform": ("black", "-"), "proportional": ("tab:blue", "-"), "rank": ("tab:red", "-"),
         "learning-progress": ("tab:orange", "--"), "rprop-sign": ("tab:brown", "--"),
         "asymmetric": ("tab:purple", "--"), "return-to-go": ("tab:green", "--"),
         "episode-return": ("olive", ":"), "predecessor": ("tab:cyan", "--"), "hybrid": ("gray", "-."),
         "rank-staleness": ("salmon", "--")}


def plot(summary: list[dict], path: Path, table: list[dict] | None = None) -> None:
    """Median updates against memory size; with ``table`` (from :func:`compare`) the legend gives each
    variant's ratio to proportional at the largest n and its Holm-adjusted p-value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    at = {t["variant"]: t for t in table or []}
    fig, ax = plt.subplots(figsize=(11.5, 6))
    for variant in VARIANTS:
        rows = [s for s in summary if s["variant"] == variant]
        if not rows:
            continue
        x = np.array([r["memory_size"] for r in rows])
        med = np.array([r["median_updates"] for r in rows])
        ok = np.isfinite(med)
        color, ls = STYLE.get(variant, ("gray", "-"))
        label = variant
        if variant in at and not np.isnan(at[variant]["holm_p"]):
            t = at[variant]
            label += f": {t['ratio_to_proportional']:.2f}x, Holm p {t['holm_p']:.3f}"
        ax.plot(x[ok], med[ok], color=color, ls=ls, marker="o", ms=3, lw=1.6, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("memory size (transitions)")
    ax.set_ylabel("updates to convergence (median over seeds)")
    ax.set_title("Blind Cliffwalk, linear: 000 Appendix A priority variants (no IS weights)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    if at:  # outside the axes on the right: the longer labels would cover the small chains' curves
        n = next(iter(at.values()))["n"]
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                  title=f"at n = {n}: updates / proportional's,\nHolm-adjusted Wilcoxon p\n(family: the "
                  f"{len(at) - 1} variants vs proportional)", title_fontsize=8, alignment="left")
    else:
        ax.legend(fontsize=8, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: Where ``perx variants`` writes unless ``--out`` says otherwise: a folder git ignores, so an interrupted run
#: never touches the committed study (``--out results/variants`` regenerates that one).
DEFAULT_OUT = "runs/variants"


def build_parser(prog: str = "perx variants") -> argparse.ArgumentParser:
    d = Config()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-min", type=int, default=d.n_min)
    parser.add_argument("--n-max", type=int, default=d.n_max)
    parser.add_argument("--seeds", type=int, default=d.seeds)
    parser.add_argument("--variants", nargs="+", default=list(d.variants), choices=VARIANTS)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="folder for runs.csv, summary.csv, table.md, meta.json, PNG (default: %(default)s, "
                             "which git ignores; results/variants is the committed study)")
    parser.add_argument("--resume", action="store_true", help="keep the runs already in OUT/runs.csv")
    parser.add_argument("--plot-only", action="store_true",
                        help="redraw OUT/summary.csv, table.md and the PNG from OUT/runs.csv (no runs)")
    return parser


def main(argv: list[str] | None = None, prog: str = "perx variants") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog).parse_args(argv)
    cfg = Config(n_min=args.n_min, n_max=args.n_max, seeds=args.seeds, variants=tuple(args.variants))
    out = Path(args.out)
    runs_path = out / "runs.csv"
    if args.plot_only and not runs_path.exists():  # --plot-only reads and writes OUT only; creates nothing
        hint = " (the committed study: --out results/variants)" if args.out == DEFAULT_OUT else ""
        print(f"perx variants: no runs in {runs_path}{hint}", file=sys.stderr)
        return 1
    if not args.plot_only:
        out.mkdir(parents=True, exist_ok=True)
        if not args.resume and runs_path.exists():
            runs_path.unlink()
        rows = read_runs(runs_path)
        done = {(r["variant"], r["n"], r["seed"]) for r in rows}
        jobs = [(v, n, s, cfg) for n in range(cfg.n_min, cfg.n_max + 1) for v in cfg.variants
                for s in range(cfg.seeds) if (v, n, s) not in done]
        jobs.sort(key=lambda j: -j[1])
        meta = {"command": " ".join([prog, *argv]), "config": asdict(cfg), "perx": perx.__version__,
                "numpy": np.__version__, "python": platform.python_version()}
        (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        new = not runs_path.exists()
        with open(runs_path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            if new:
                writer.writeheader()
            for row in _execute(jobs, args.workers):
                writer.writerow(row)
                f.flush()
    rows = read_runs(runs_path)
    summary = summarize(rows)
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    table = compare(rows, max(r["n"] for r in rows))
    plot(summary, out / "variants.png", table)
    command = json.loads((out / "meta.json").read_text())["command"] if (out / "meta.json").exists() \
        else " ".join([prog, *argv])
    family = [t["variant"] for t in table if t["variant"] != "proportional"]
    survive = [t["variant"] for t in table if t["holm_p"] <= 0.05]
    lines = [f"# 000 App. A variants on the linear Blind Cliffwalk, n = {table[0]['n']}", "",
             f"Command: `{command}`; {table[0]['seeds']} seeds; paired two-sided Wilcoxon signed-rank test "
             "against plain proportional over seeds (a seed fixes the memory and the initial parameters).", "",
             f"Multiple comparisons: the family is the {len(family)} tests of this table, each variant against "
             f"proportional at n = {table[0]['n']} ({', '.join(family)}); Holm p is the Holm-Bonferroni adjusted "
             "p-value over that family (family-wise error rate). Differences with Holm p <= 0.05: "
             f"{', '.join(survive) if survive else 'none'}.", "",
             "| variant | median updates | / proportional | runs faster than proportional | Wilcoxon p (raw) "
             "| Holm p |",
             "|---|---|---|---|---|---|"]
    for t in table:
        adjusted = "--" if np.isnan(t["holm_p"]) else f"{t['holm_p']:.3g}"
        base = t["variant"] == "proportional"  # the reference itself: no test
        raw = "--" if base else f"{t['wilcoxon_p']:.3g}"
        wins = "--" if base else f"{t['wins']}/{t['seeds']}"
        lines.append(f"| {t['variant']} | {t['median']:,.0f} | {t['ratio_to_proportional']:.2f}x | {wins} | {raw} | "
                     f"{adjusted} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    wrote = "summary.csv, table.md, variants.png from runs.csv" if args.plot_only else \
        "runs.csv, summary.csv, table.md, meta.json, variants.png"
    print("\n".join(lines))
    print(f"\nwrote {out}/{wrote}")  # last: where the results are
    return 0


def _execute(jobs, workers):
    return run_jobs(_run_job, jobs, workers, "variant runs")


if __name__ == "__main__":
    sys.exit(main())
