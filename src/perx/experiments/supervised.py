"""Prioritized supervised learning on class-imbalanced digits (000 Sec. 6, Figure 5, App. B.3).

Data (``--data``): scikit-learn's bundled 8x8 digits (1,797 images; nothing is downloaded; no PyPI package
ships the full MNIST files), or MNIST-1D (``mnist1d``, Greydanus 2020: 1-D signals of length 40 made from ten
digit-like templates by the package's own generator, in code, nothing downloaded), ``--samples`` of them
(default 70,000, MNIST's size: ~4,200 training examples per digit before the imbalance, so 1% keeps ~42 of
each rare digit where the 8x8 digits keep one). Each class is split at random into test (25%), validation
(15%) and training pool (60%); the test and validation sets keep every example (balanced). The training set
keeps ``keep`` = 1% of the pool's 0-4s (at least one of each; B.3: "randomly sampled 1% of the available
examples") and every 5-9.

Network (B.3's LeNet-like shape at 8x8): conv 3x3 (16) + ReLU + 2x2 max pool, conv 3x3 (32) + ReLU + 2x2
max pool, a 128-unit fully connected layer + ReLU, 10 log-softmax outputs; negative log-likelihood; SGD
without momentum, minibatch 60, step sizes {0.3, 0.1, 0.03, 0.01, 0.003, 0.001}, each method reported at
the step size with the best final balanced validation error (median over seeds), as in B.3.

Methods (every batch is drawn through a perx sampler over the training set):
  uniform            perx.Uniform
  informed           perx.Uniform, the loss of digits 0-4 scaled by 100 (B.3's weighted loss)
  prioritized        perx.Proportional(alpha=1), priority = the example's last-seen loss, beta = 0
                     (Sec. 6: "Prioritized sampling (uninformed, with alpha = 1, beta = 0)")
  prioritized-is     the same with IS weights at beta = 1

Outputs, in ``--out`` (default ``runs/supervised``, which git ignores; ``--out results/supervised`` regenerates the
committed study): ``runs.csv`` (every evaluation of every run), ``summary.csv`` (selected step sizes, final errors),
``meta.json``, ``supervised.png`` (Figure 5: test errors and test loss against updates, median of the seeds;
the title names the keep share and the rare-digit counts it gives). ``--plot-only`` redraws summary.csv and the
PNG from ``runs.csv`` with the settings saved in ``meta.json``, all in ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

import perx
from perx.experiments._pool import run_jobs

METHODS = ("uniform", "informed", "prioritized", "prioritized-is")
RARE = (0, 1, 2, 3, 4)
LEARNING_RATES = (0.3, 0.1, 0.03, 0.01, 0.003, 0.001)


@dataclass(frozen=True)
class Config:
    updates: int = 4000
    """SGD updates per run."""
    batch_size: int = 60
    """Minibatch (B.3)."""
    eval_every: int = 100
    """Updates between evaluations."""
    seeds: int = 3
    """Initialisations per (method, step size); Figure 5 shows the median of 3."""
    keep: float = 0.01
    """Share of the training pool's 0-4 kept (B.3: 1%); at least one example per class."""
    rare_weight: float = 100.0
    """Loss scale of digits 0-4 for the informed baseline (B.3)."""
    learning_rates: tuple[float, ...] = LEARNING_RATES
    """Step sizes tried (B.3)."""
    methods: tuple[str, ...] = field(default=METHODS)
    """Methods to run."""
    split_seed: int = 0
    """Seed of the data split (one split for every run, as the paper's one dataset)."""
    data: str = "digits"
    """"digits" (scikit-learn's 8x8) or "mnist1d" (generated locally)."""
    samples: int = 70_000
    """MNIST-1D examples generated (all classes, before the split); ignored for digits."""
    select_seeds: int | None = None
    """Seeds run at every step size to choose each method's step size; the other seeds (up to ``seeds``) run at
    the chosen one only. None: every seed at every step size (the committed digits study)."""


def _split(cfg: Config, y: np.ndarray) -> dict[str, list[np.ndarray]]:
    """Per class, the indices of test, validation, the whole training pool and the training set kept."""
    rng = np.random.default_rng(cfg.split_seed)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": [], "pool": []}
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_test, n_val = round(0.25 * len(idx)), round(0.15 * len(idx))
        test, val, pool = idx[:n_test], idx[n_test:n_test + n_val], idx[n_test + n_val:]
        parts["pool"].append(pool)
        if c in RARE:
            pool = pool[: max(1, round(cfg.keep * len(pool)))]
        parts["test"].append(test)
        parts["val"].append(val)
        parts["train"].append(pool)
    return parts


DATA = ("digits", "mnist1d")


@functools.lru_cache(maxsize=2)
def _dataset(data: str, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Every example and label of a data set: digits float32 [1797, 1, 8, 8] in [0, 1]; mnist1d float32
    [samples, 1, 40] (the generator's own train and test parts together; we split them ourselves). int64
    labels. Cached per process: generating 70,000 MNIST-1D signals takes about a minute."""
    if data == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        return (digits.images / 16.0).astype(np.float32)[:, None], digits.target.astype(np.int64)
    if data == "mnist1d":
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()  # the package's defaults (its seed 42), only the number of examples changed
        args.num_samples = samples
        made = make_dataset(args)
        x = np.concatenate([made["x"], made["x_test"]]).astype(np.float32)[:, None]
        return x, np.concatenate([made["y"], made["y_test"]]).astype(np.int64)
    raise ValueError(f"data: one of {DATA}, got {data!r}")


def rare_kept(cfg: Config) -> tuple[list[int], list[int]]:
    """(training examples kept, pool size) of each rare digit 0-4: what the keep share means after
    rounding and the at-least-one rule, for the figure's title."""
    parts = _split(cfg, _dataset(cfg.data, cfg.samples)[1])
    return [len(parts["train"][c]) for c in RARE], [len(parts["pool"][c]) for c in RARE]


def load_split(cfg: Config) -> dict[str, np.ndarray]:
    """The imbalanced training set and the balanced validation and test sets (float32 [n, 1, 8, 8] in [0, 1]
    for digits, [n, 1, 40] for mnist1d; int64 labels)."""
    x, y = _dataset(cfg.data, cfg.samples)
    parts = _split(cfg, y)
    del parts["pool"]
    out = {}
    for name, chunks in parts.items():
        idx = np.concatenate(chunks)
        out[f"x_{name}"], out[f"y_{name}"] = x[idx], y[idx]
    return out


def network(seed: int, data: str = "digits"):
    """B.3's LeNet-like shape: two conv + ReLU + max-pool stages, 128 hidden units, 10 log-softmax outputs
    (2-D convolutions over the 8x8 digits, 1-D over MNIST-1D's length-40 signals)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    if data == "mnist1d":
        return nn.Sequential(
            nn.Conv1d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),   # 40 -> 20
            nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),  # 20 -> 10
            nn.Flatten(), nn.Linear(32 * 10, 128), nn.ReLU(), nn.Linear(128, 10), nn.LogSoftmax(dim=1),
        )
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 8x8 -> 4x4
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 4x4 -> 2x2
        nn.Flatten(), nn.Linear(32 * 4, 128), nn.ReLU(), nn.Linear(128, 10), nn.LogSoftmax(dim=1),
    )


def _sampler(method: str):
    if method in ("uniform", "informed"):
        return perx.Uniform()
    if method in ("prioritized", "prioritized-is"):
        # 000 Sec. 3.4 as the committed study ran it (the sampler default became the batch maximum later)
        return perx.Proportional(alpha=1.0, eps=1e-6, normalize="buffer")
    raise ValueError(f"method: must be one of {METHODS}, got {method!r}")


def _evaluate(net, x, y) -> tuple[int, float, float]:
    """(misclassified count, mean NLL, balanced error = mean over classes of the per-class error rate)."""
    import torch

    with torch.no_grad():
        logp = net(torch.from_numpy(x))
        loss = float(torch.nn.functional.nll_loss(logp, torch.from_numpy(y)))
        wrong = (logp.argmax(1).numpy() != y)
    per_class = [wrong[y == c].mean() for c in range(10) if (y == c).any()]
    return int(wrong.sum()), loss, float(np.mean(per_class))


def run_one(method: str, lr: float, seed: int, cfg: Config, data: dict[str, np.ndarray] | None = None) -> list[dict]:
    """Train one network; returns one row per evaluation."""
    import torch

    torch.set_num_threads(1)
    data = load_split(cfg) if data is None else data
    x, y = data["x_train"], data["y_train"]
    buf = perx.ReplayBuffer(len(y), _sampler(method), seed=seed + 1000 * METHODS.index(method))
    buf.extend(x=x, y=y)
    net = network(seed, cfg.data)
    opt = torch.optim.SGD(net.parameters(), lr=lr)  # no momentum (B.3)
    scale = torch.ones(10)
    if method == "informed":
        scale[list(RARE)] = cfg.rare_weight
    beta = 1.0 if method == "prioritized-is" else 0.0
    prioritized = method.startswith("prioritized")
    rows = []
    t0 = time.perf_counter()
    for update in range(cfg.updates + 1):
        if update % cfg.eval_every == 0:
            test = _evaluate(net, data["x_test"], data["y_test"])
            val = _evaluate(net, data["x_val"], data["y_val"])
            train = _evaluate(net, x, y)
            rows.append({"method": method, "lr": lr, "seed": seed, "update": update, "test_errors": test[0],
                         "test_loss": round(test[1], 6), "test_balanced_error": round(test[2], 6),
                         "val_balanced_error": round(val[2], 6), "train_errors": train[0],
                         "train_loss": round(train[1], 6), "seconds": round(time.perf_counter() - t0, 2)})
        if update == cfg.updates:
            break
        batch = buf.sample(cfg.batch_size, beta=beta)
        xb, yb = torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"])
        per_example = torch.nn.functional.nll_loss(net(xb), yb, reduction="none")
        weighted = per_example * scale[yb]
        if beta > 0:
            weighted = weighted * torch.from_numpy(batch.weights.astype(np.float32))
        loss = weighted.mean()
        if not torch.isfinite(loss):
            # diverged at this step size: one closing row says so (inf loss), and selection skips the run
            rows.append({**rows[-1], "update": cfg.updates, "test_loss": float("inf"), "train_loss": float("inf"),
                         "val_balanced_error": 1.0, "seconds": round(time.perf_counter() - t0, 2)})
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
        if prioritized:  # priority = the example's last-seen loss (Sec. 6)
            buf.update_priorities(batch.indices, per_example.detach().numpy().astype(np.float64))
    return rows


def _run_job(args) -> list[dict]:
    method, lr, seed, cfg = args
    return run_one(method, lr, seed, cfg)


FIELDS = ["method", "lr", "seed", "update", "test_errors", "test_loss", "test_balanced_error",
          "val_balanced_error", "train_errors", "train_loss", "seconds"]


def read_runs(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["lr"] = float(r["lr"])
        for key in ("seed", "update", "test_errors", "train_errors"):
            r[key] = int(r[key])
        for key in ("test_loss", "test_balanced_error", "val_balanced_error", "train_loss", "seconds"):
            r[key] = float(r[key])
    return rows


def select(rows: list[dict], cfg: Config) -> list[dict]:
    """Per method, the step size with the lowest median final balanced validation error (B.3).

    A diverged run takes part with the balanced validation error 1.0 its closing row records, so one seed
    blowing up does not rule out a step size the other seeds do well at. The medians reported at the chosen
    step size are over the runs that did not diverge (``seeds``); ``diverged`` counts the others, which the
    curves leave out too."""
    out = []
    for method in cfg.methods:
        best = None
        for lr in cfg.learning_rates:
            finals = _finals(rows, method, lr, range(cfg.select_seeds or cfg.seeds), cfg)
            if finals is None:
                continue  # a run is missing or unfinished
            val = float(np.median([f["val_balanced_error"] for f in finals]))
            if best is None or val < best[0]:
                best = (val, lr)
        if best is None:
            continue
        finals = _finals(rows, method, best[1], range(cfg.seeds), cfg)
        if finals is None:  # (the remaining seeds are not all finished yet: report the selection seeds)
            finals = _finals(rows, method, best[1], range(cfg.select_seeds or cfg.seeds), cfg)
        assert finals is not None
        ok = [f for f in finals if np.isfinite(f["test_loss"])]
        med = {k: float(np.median([f[k] for f in ok])) if ok else float("nan")
               for k in ("test_errors", "test_balanced_error", "test_loss", "train_errors")}
        out.append({"method": method, "lr": best[1], "median_val_balanced_error": best[0], "seeds": len(ok),
                    "diverged": len(finals) - len(ok), **{f"median_{k}": v for k, v in med.items()}})
    return out


def _finals(rows: list[dict], method: str, lr: float, seeds: range, cfg: Config) -> list[dict] | None:
    """The last row of each seed's run (a diverged run's is its closing row, test loss inf), or None if one is
    missing or unfinished."""
    finals = [max((r for r in rows if r["method"] == method and r["lr"] == lr and r["seed"] == s),
                  key=lambda r: r["update"], default=None) for s in seeds]
    if any(f is None or f["update"] < cfg.updates for f in finals):
        return None
    return finals


def seed_curves(rows: list[dict], method: str, lr: float, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(updates [T], values [seeds, T]) of ``key`` for the finished seeds of one method and step size (a run
    that diverged is left out, even one whose closing row completes its evaluations)."""
    sel = [r for r in rows if r["method"] == method and r["lr"] == lr]
    steps = np.array(sorted({r["update"] for r in sel}))
    by_seed: dict[int, dict[int, float]] = {}
    diverged = {r["seed"] for r in sel if not np.isfinite(r["test_loss"])}
    for r in sel:
        by_seed.setdefault(r["seed"], {})[r["update"]] = r[key]
    full = [s for s in sorted(by_seed) if len(by_seed[s]) == len(steps) and s not in diverged]
    return steps, np.array([[by_seed[s][u] for u in steps] for s in full], dtype=float)


def median_band(values: np.ndarray, level: float = 0.95, resamples: int = 2000, seed: int = 0
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(median, low, high) over seeds at each evaluation: the median of ``values`` [seeds, T] and a percentile
    bootstrap interval of it (seeds resampled with a fixed seed). Never outside the seeds' range."""
    med = np.median(values, axis=0)
    if len(values) < 2:
        return med, med, med
    idx = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))
    boot = np.median(values[idx], axis=1)
    tail = (1 - level) / 2
    return med, np.quantile(boot, tail, axis=0), np.quantile(boot, 1 - tail, axis=0)


def _first_reach(steps: np.ndarray, curve: np.ndarray, target: float) -> float:
    """The first evaluation at which ``curve`` is at or below ``target`` (inf if never)."""
    hit = np.flatnonzero(curve <= target)
    return float(steps[hit[0]]) if len(hit) else float("inf")


def speedups(rows: list[dict], chosen: list[dict], key: str = "test_errors", tail: float = 0.1,
             resamples: int = 2000, seed: int = 0) -> list[dict]:
    """000 Sec. 6's speed-up, per method at its chosen step size: the updates uniform's median curve needs to
    first reach uniform's final level (its median over the last ``tail`` of the evaluations), divided by the
    updates the method's median curve needs to reach that level. With a 95% percentile bootstrap interval:
    the seeds of uniform and of the method are resampled independently and the whole computation repeated
    (a resample whose method never reaches the level counts as speed-up 0). ``reached`` is the share of
    resamples in which the method reaches it."""
    lr = {c["method"]: c["lr"] for c in chosen}
    if "uniform" not in lr:
        return []
    steps, uni = seed_curves(rows, "uniform", lr["uniform"], key)
    last = max(1, round(tail * len(steps)))

    def ratio(u: np.ndarray, m: np.ndarray) -> float:
        u_med, m_med = np.median(u, axis=0), np.median(m, axis=0)
        target = float(np.mean(u_med[-last:]))
        t_u, t_m = _first_reach(steps, u_med, target), _first_reach(steps, m_med, target)
        if not np.isfinite(t_m):
            return 0.0
        return 1.0 if t_m == t_u else (t_u / t_m if t_m > 0 else float("inf"))

    rng = np.random.default_rng(seed)
    out = []
    for c in chosen:
        m_steps, m = seed_curves(rows, c["method"], c["lr"], key)
        if len(m) == 0 or len(uni) == 0 or not np.array_equal(m_steps, steps):
            continue
        point = ratio(uni, m)
        boot = np.array([ratio(uni[rng.integers(0, len(uni), len(uni))], m[rng.integers(0, len(m), len(m))])
                         for _ in range(resamples)])
        u_med = np.median(uni, axis=0)
        target = float(np.mean(u_med[-last:]))
        out.append({"method": c["method"], "lr": c["lr"], "target": target,
                    "uniform_updates": _first_reach(steps, u_med, target),
                    "updates": _first_reach(steps, np.median(m, axis=0), target), "speedup": point,
                    # (no interpolation between order statistics: a resample may give inf)
                    "low": float(np.quantile(boot, 0.025, method="inverted_cdf")),
                    "high": float(np.quantile(boot, 0.975, method="inverted_cdf")),
                    "reached": float(np.mean(boot > 0)), "seeds": len(m), "uniform_seeds": len(uni)})
    return out


STYLE = {"uniform": "black", "informed": "tab:green", "prioritized": "tab:blue", "prioritized-is": "tab:orange"}


def _span(values: list[int]) -> str:
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"


def keep_label(cfg: Config) -> str:
    """The share of the rare digits kept as run, e.g. '0-4 kept at 10%: 11 of 106-110 training examples each'."""
    kept, pool = rare_kept(cfg)
    return f"0-4 kept at {100 * cfg.keep:g}%: {_span(kept)} of {_span(pool)} training examples each"


def plot(rows: list[dict], chosen: list[dict], n_test: int, path: Path, kept: str) -> None:
    """Figure 5's panels; ``kept`` (from :func:`keep_label`) names the share of rare digits in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for c in chosen:
        color = STYLE.get(c["method"], "gray")
        for ax, key in zip(axes, ("test_errors", "test_loss", "train_errors"), strict=True):
            x, values = seed_curves(rows, c["method"], c["lr"], key)
            if len(values) == 0:  # every run at this step size diverged: nothing to draw
                continue
            med, lo, hi = median_band(values)
            ax.plot(x, med, color=color, lw=1.6,
                    label=f"{c['method']} (step size {c['lr']:g}, {len(values)} seeds"
                    + (f", {c['diverged']} diverged)" if c.get("diverged") else ")"))
            ax.fill_between(x, lo, hi, color=color, alpha=0.15, lw=0)
    axes[0].set_ylabel(f"misclassified test digits (of {n_test})")
    axes[1].set_ylabel("test loss (NLL)")
    axes[2].set_ylabel("misclassified training digits")
    for ax in axes:
        ax.set_xlabel("updates (minibatch 60)")
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    if axes[0].get_legend_handles_labels()[0]:  # (nothing drawn when every run diverged)
        axes[0].legend(fontsize=8, loc="upper right")
    fig.suptitle(f"Class-imbalanced digits ({kept}): median of the seeds at each method's best step size, "
                 "95% bootstrap interval of the median shaded (000 Fig. 5)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_outputs(rows: list[dict], cfg: Config, out: Path) -> tuple[list[dict], list[dict]]:
    """summary.csv, supervised.png and speedup.csv in ``out``; returns (chosen step sizes, speed-ups)."""
    chosen = select(rows, cfg)
    fast = speedups(rows, chosen) if chosen else []
    if chosen:
        _write_csv(out / "summary.csv", chosen)
        n_test = len(load_split(cfg)["y_test"])
        plot(rows, chosen, n_test, out / "supervised.png", keep_label(cfg))
    if fast:
        _write_csv(out / "speedup.csv", fast)
    return chosen, fast


#: Where ``perx supervised`` writes unless ``--out`` says otherwise: a folder git ignores, so an interrupted run
#: never touches the committed study (``--out results/supervised`` regenerates that one).
DEFAULT_OUT = "runs/supervised"


def build_parser(prog: str = "perx supervised") -> argparse.ArgumentParser:
    d = Config()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=d.updates)
    parser.add_argument("--eval-every", type=int, default=d.eval_every)
    parser.add_argument("--seeds", type=int, default=d.seeds)
    parser.add_argument("--select-seeds", type=int, default=d.select_seeds,
                        help="run only this many seeds at every step size; the rest of --seeds at each method's "
                             "chosen step size (default: every seed at every step size)")
    parser.add_argument("--keep", type=float, default=d.keep, help="share of the 0-4 training examples kept")
    parser.add_argument("--data", choices=DATA, default=d.data,
                        help="digits: scikit-learn's 8x8; mnist1d: MNIST-1D generated locally (pip install mnist1d)")
    parser.add_argument("--samples", type=int, default=d.samples, help="MNIST-1D examples generated (mnist1d only)")
    parser.add_argument("--learning-rates", type=float, nargs="+", default=list(d.learning_rates))
    parser.add_argument("--methods", nargs="+", default=list(d.methods), choices=METHODS)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="folder for runs.csv, summary.csv, meta.json, PNG (default: %(default)s, which git "
                             "ignores; results/supervised is the committed study)")
    parser.add_argument("--resume", action="store_true", help="keep finished runs in OUT/runs.csv")
    parser.add_argument("--plot-only", action="store_true",
                        help="redraw summary.csv and the PNG from OUT/runs.csv with the settings in OUT/meta.json")
    return parser


def main(argv: list[str] | None = None, prog: str = "perx supervised") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if not 0 < args.keep <= 1:
        parser.error(f"--keep: must lie in (0, 1], got {args.keep}")
    if args.samples < 100:
        parser.error(f"--samples: at least 100, got {args.samples}")
    if args.select_seeds is not None and not 1 <= args.select_seeds <= args.seeds:
        parser.error(f"--select-seeds: must lie in [1, --seeds = {args.seeds}], got {args.select_seeds}")
    cfg = Config(updates=args.updates, eval_every=args.eval_every, seeds=args.seeds, keep=args.keep,
                 learning_rates=tuple(args.learning_rates), methods=tuple(args.methods), data=args.data,
                 samples=args.samples, select_seeds=args.select_seeds)
    out = Path(args.out)
    runs_path = out / "runs.csv"
    if args.plot_only:  # reads and writes OUT only, and creates nothing when OUT holds no runs
        if not runs_path.exists():
            hint = " (the committed study: --out results/supervised)" if args.out == DEFAULT_OUT else ""
            print(f"perx supervised: no runs in {runs_path}{hint}", file=sys.stderr)
            return 1
        meta_path = out / "meta.json"
        if meta_path.exists():
            # redraw with the settings the runs were made with (the keep share in the title, the step
            # sizes and seeds selection looks for), not this command's defaults
            saved = json.loads(meta_path.read_text())["config"]
            cfg = Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()})
            print(f"settings from {meta_path}: keep {cfg.keep:g}, {cfg.updates} updates, {cfg.seeds} seeds")
        rows = read_runs(runs_path)
        chosen, fast = write_outputs(rows, cfg, out)
        if not chosen:
            print(f"perx supervised: no finished runs in {runs_path}; nothing written", file=sys.stderr)
            return 1
        print_table(chosen, fast)
        print(f"\nwrote {out}/summary.csv, supervised.png from {runs_path}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if not args.resume and runs_path.exists():
        runs_path.unlink()
    rows = read_runs(runs_path)
    data = load_split(cfg)
    counts = {name: np.bincount(data[f"y_{name}"], minlength=10).tolist() for name in ("train", "val", "test")}
    import sklearn
    import torch

    meta = {"command": " ".join([prog, *argv]), "config": asdict(cfg), "class_counts": counts,
            "perx": perx.__version__, "torch": torch.__version__, "sklearn": sklearn.__version__,
            "numpy": np.__version__, "python": platform.python_version(), "machine": platform.machine()}
    if cfg.data == "mnist1d":
        from importlib.metadata import version

        meta["mnist1d"] = version("mnist1d")
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    done = {(r["method"], r["lr"], r["seed"]) for r in rows if r["update"] == cfg.updates}
    rows = [r for r in rows if (r["method"], r["lr"], r["seed"]) in done]  # drop half-written runs
    every = range(cfg.select_seeds or cfg.seeds)  # seeds run at every step size
    jobs = [(m, lr, s, cfg) for m in cfg.methods for lr in cfg.learning_rates for s in every
            if (m, lr, s) not in done]
    print(f"training set per class {counts['train']}; {len(jobs)} runs to go"
          + (f" before the step sizes are chosen ({len(every)} seeds each)" if cfg.select_seeds else ""))
    with open(runs_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
        f.flush()
        _run_into(jobs, args.workers, writer, f, rows)
        if cfg.select_seeds:  # then the other seeds at each method's chosen step size (B.3's selection)
            jobs = [(c["method"], c["lr"], s, cfg) for c in select(rows, cfg)
                    for s in range(cfg.select_seeds, cfg.seeds) if (c["method"], c["lr"], s) not in done]
            print(f"step sizes chosen; {len(jobs)} runs of seeds {cfg.select_seeds}-{cfg.seeds - 1} to go")
            _run_into(jobs, args.workers, writer, f, rows)
    chosen, fast = write_outputs(rows, cfg, out)
    if not chosen:
        print(f"perx supervised: no step size has all its runs finished; wrote {out}/runs.csv and meta.json only",
              file=sys.stderr)
        return 1
    print_table(chosen, fast)
    print(f"\nwrote {out}/runs.csv, summary.csv, meta.json, supervised.png")  # last: where the results are
    return 0


def _execute(jobs, workers):
    return run_jobs(_run_job, jobs, workers, "supervised runs")


def _run_into(jobs, workers, writer, f, rows: list[dict]) -> None:
    """Run ``jobs``, writing each finished run's rows (flushed: --resume keeps them) and adding them to rows."""
    for run_rows in _execute(jobs, workers):
        writer.writerows(run_rows)
        f.flush()
        rows.extend(run_rows)


def print_table(chosen: list[dict], fast: list[dict] | None = None) -> None:
    """The summary as markdown: final medians, and 000's speed-up over uniform with its interval."""
    speed = {f["method"]: f for f in fast or []}
    print("| method | step size | seeds | test errors | test balanced error | test loss | training errors "
          "| updates to uniform's final test errors | speed-up (95% interval) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in chosen:
        f = speed.get(c["method"])
        reach = "-" if f is None else ("not reached" if not np.isfinite(f["updates"]) else f"{f['updates']:.0f}")
        gain = "-" if f is None else f"{f['speedup']:.2f}x ({f['low']:.2f}-{f['high']:.2f})"
        seeds = f"{c.get('seeds', '-')}" + (f" ({c['diverged']} diverged)" if c.get("diverged") else "")
        print(f"| {c['method']} | {c['lr']:g} | {seeds} | {c['median_test_errors']:.0f} | "
              f"{c['median_test_balanced_error']:.3f} | {c['median_test_loss']:.3f} | {c['median_train_errors']:.0f} "
              f"| {reach} | {gain} |")


if __name__ == "__main__":
    sys.exit(main())
