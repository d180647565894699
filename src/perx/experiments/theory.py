"""``perx theory``: the loss/sampling equivalence of 004, checked exactly, plus a figure of the losses.

Prints one row per statement with the largest absolute error found (see :mod:`perx.experiments.theorems`), adds a
row comparing torch autograd gradients of every ``perx.torch`` loss with the analytic gradients of
``perx.losses`` (when torch is installed), and writes ``theory.csv``, ``meta.json`` and
``losses.png`` (loss shapes and gradients: MSE, Huber, PAL for two alphas, and the PER-equivalent
loss for alpha = 0.6, beta = 0.4, whose power 2 + alpha - alpha beta = 2.36 exceeds 2) to ``--out`` (default
``runs/theory``, which git ignores; ``--out results/theory`` regenerates the committed ones).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

import perx
from perx import losses
from perx.experiments import theorems as theory


def check_autograd(delta: np.ndarray | None = None):
    """Largest |autograd gradient - analytic gradient| over every torch loss, in float64."""
    import torch

    from perx import torch as pt

    d_np = theory.td_errors() if delta is None else delta
    n = len(d_np)
    eta = losses.per_eta(d_np, 0.6, 0.4)
    cases = {
        "mse": (lambda d: pt.mse(d, reduction="sum"), losses.mse_grad(d_np)),
        "l1": (lambda d: pt.l1(d, reduction="sum"), losses.l1_grad(d_np)),
        "huber(0.5)": (lambda d: pt.huber(d, 0.5, reduction="sum"), losses.huber_grad(d_np, 0.5)),
        "pal(0.4, 1)": (lambda d: pt.pal(d, 0.4, 1.0, reduction="sum"), losses.pal_grad(d_np, 0.4, 1.0)),
        "pal(0.6, 0.01)": (lambda d: pt.pal(d, 0.6, 0.01, reduction="sum"), losses.pal_grad(d_np, 0.6, 0.01)),
        "per_equivalent(tau 2)": (lambda d: pt.per_equivalent(d, 0.6, 0.4, 2.0, eta=eta, size=n, reduction="sum"),
                                  losses.per_equivalent_grad(d_np, 0.6, 0.4, 2.0)),
        "per_equivalent_huber": (lambda d: pt.per_equivalent_huber(d, 0.6, 0.4, 1.0, eta=eta, size=n,
                                                                   reduction="sum"),
                                 losses.per_equivalent_huber_grad(d_np, 0.6, 0.4, 1.0)),
    }
    err = 0.0
    for fn, analytic in cases.values():
        d = torch.tensor(d_np, dtype=torch.float64, requires_grad=True)
        fn(d).backward()
        err = max(err, float(np.max(np.abs(d.grad.numpy() - analytic))))
    return theory.Check("torch autograd = analytic gradients of perx.losses (float64)",
                        ", ".join(cases), err)


def plot(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = np.linspace(-3, 3, 1201)
    alpha, beta = 0.6, 0.4
    p = 2 + alpha - alpha * beta
    curves = {
        "MSE: 0.5 d^2": (losses.mse(d), losses.mse_grad(d)),
        "Huber (kappa = 1)": (losses.huber(d, 1.0), losses.huber_grad(d, 1.0)),
        "PAL alpha = 0.4 (lambda = 1)": (losses.pal(d, 0.4, 1.0, lam=1.0), losses.pal_grad(d, 0.4, 1.0, lam=1.0)),
        "PAL alpha = 0.7 (lambda = 1)": (losses.pal(d, 0.7, 1.0, lam=1.0), losses.pal_grad(d, 0.7, 1.0, lam=1.0)),
        f"PER-equivalent, alpha 0.6, beta 0.4: |d|^{p:.2f}/{p:.2f} (eta N = 1)": (
            losses.per_equivalent(d, alpha, beta, 2.0, eta=1.0, size=1),
            losses.per_equivalent_grad(d, alpha, beta, 2.0, eta=1.0, size=1)),
    }
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, (value, grad) in curves.items():
        ax1.plot(d, value, label=label)
        ax2.plot(d, grad, label=label)
    ax1.set_title("loss")
    ax2.set_title("gradient with respect to Q (= d loss / d delta)")
    for ax in (ax1, ax2):
        ax.set_xlabel("TD error delta")
        ax.grid(alpha=0.3)
    ax1.set_ylim(0, 6)
    ax2.set_ylim(-6, 6)
    ax1.legend(fontsize=7.5, loc="upper center")
    fig.suptitle("Losses of Fujimoto et al. (2020): PER with MSE behaves like a power above 2; PAL never does")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: Where ``perx theory`` writes unless ``--out`` says otherwise: a folder git ignores, so a run never touches the
#: committed results (``--out results/theory`` regenerates those).
DEFAULT_OUT = "runs/theory"


def build_parser(prog: str = "perx theory") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="folder for theory.csv, losses.png, meta.json (default: %(default)s, which git ignores; "
                             "results/theory holds the committed ones)")
    return parser


def main(argv: list[str] | None = None, prog: str = "perx theory") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog).parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    checks = theory.all_checks()
    try:
        checks.append(check_autograd())
    except ImportError:
        print("(torch is not installed: the autograd row is skipped; pip install 'torch==2.13.0')")
    print("| statement | cases | largest abs. error | tolerance | holds |")
    print("|---|---|---|---|---|")
    for c in checks:
        cells = [text.replace("|", "\\|") for text in (c.statement, c.cases)]  # markdown-safe
        print(f"| {cells[0]} | {cells[1]} | {c.max_abs_error:.2e} | {c.tolerance:.0e} | "
              f"{'yes' if c.passed else 'NO'} |")
    with open(out / "theory.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["statement", "cases", "max_abs_error", "tolerance", "holds"])
        for c in checks:
            writer.writerow([c.statement, c.cases, repr(c.max_abs_error), c.tolerance, c.passed])
    plot(out / "losses.png")
    meta = {"command": " ".join([prog, *argv]), "perx": perx.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "seconds": round(time.perf_counter() - t0, 2)}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"\nwrote {out}/theory.csv, losses.png, meta.json ({meta['seconds']} s)")
    return 0 if all(c.passed for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
