"""How large the Double-DQN updates of each variant are, from a study's checkpoints (a diagnostic).

For every run of a study with checkpoints, restore it, take ``updates`` more updates (on a copy: the
checkpoint is not touched) and report, per variant: the RMS gradient, the RMS of centered RMSprop's
denominator sqrt(v - m^2) against its eps, and the RMS parameter change per update relative to
uniform's. With RMSprop's eps = 0.01 (the MinAtar paper's) a gradient much smaller than eps moves the
parameters in proportion to its size, so a loss of smaller scale (IS weights below 1, LAP's and PAL's
Huber/PAL threshold kappa = 0.01 instead of 1) takes proportionally smaller steps.

    python -m perx.experiments.step_sizes results/minatar --out results/minatar/step_sizes.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from perx.agents import dqn
from perx.agents.runner import flush_denormals


def measure(run_dir: Path, updates: int) -> dict:
    cfg = dqn.config_from_record(json.loads((run_dir / "config.json").read_text())["config"])
    runs = dqn.Runs([cfg])
    if not runs.load([run_dir]):
        raise SystemExit(f"{run_dir}: no checkpoint")
    opt = runs.optimizer
    grads, denoms, steps, weights = [], [], [], []
    sample = runs.buffers[0].sample
    runs.buffers[0].sample = lambda *a, **k: _seen(sample(*a, **k), weights)  # the IS weights of each batch
    for _ in range(updates):
        before = [p.detach().clone() for p in runs.q.parameters()]
        runs.update()
        g = torch.cat([p.grad.reshape(-1) for p in runs.q.parameters() if p.grad is not None])
        grads.append(float(g.pow(2).mean().sqrt()))
        d = torch.cat([(s["v"] - s["m"] * s["m"]).clamp(min=0).sqrt().reshape(-1) for s in opt.state])
        denoms.append(float(d.pow(2).mean().sqrt()))
        delta = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(runs.q.parameters(), before, strict=True)])
        steps.append(float(delta.pow(2).mean().sqrt()))
    return {"variant": cfg.variant, "env": cfg.env_id, "seed": cfg.seed, "step": runs.step,
            "lr": float(opt.lr[0]), "eps": opt.eps, "grad_rms": float(np.mean(grads)),
            "denominator_rms": float(np.mean(denoms)), "update_rms": float(np.mean(steps)),
            "weight_mean": float(np.mean(weights)), "weight_median": float(np.median(weights))}


def _seen(batch, weights: list) -> object:
    weights.extend(np.asarray(batch.weights, dtype=float).tolist())
    return batch


def checkpointed_runs(study: Path) -> list[Path]:
    """The run folders of a study that hold a checkpoint."""
    from perx.agents.runner import checkpoint_generations

    return [d for d in sorted(Path(study).glob("*/*/seed=*")) if checkpoint_generations(d / "checkpoint")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", help="a study folder with checkpoints, e.g. results/minatar")
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    with flush_denormals():
        for run in checkpointed_runs(Path(args.study)):
            rows.append(measure(run, args.updates))
            r = rows[-1]
            print(f"{r['env']} {r['variant']} seed {r['seed']}: grad {r['grad_rms']:.2e}, "
                  f"sqrt(v - m^2) {r['denominator_rms']:.2e} (eps {r['eps']:g}), update {r['update_rms']:.2e}")
    lines = [f"# Update sizes per variant ({args.study})", "",
             f"Command: `python -m perx.experiments.step_sizes {args.study}"
             + (f" --out {args.out}`" if args.out else "`"),
             "", f"From each run's last checkpoint, {args.updates} further updates on a copy; RMS over all parameters "
             "of the network, mean over updates and seeds.", "",
             "| env | variant | step | lr | eps | gradient RMS | sqrt(v - m^2) RMS | update RMS | update / uniform's |",
             "|---|---|---|---|---|---|---|---|---|"]
    for env in sorted({r["env"] for r in rows}):
        per = {}
        for r in rows:
            if r["env"] == env:
                per.setdefault(r["variant"], []).append(r)
        ref = np.mean([r["update_rms"] for r in per.get("uniform", [])]) if "uniform" in per else np.nan
        for v in ("uniform", "per", "rank", "lap", "pal"):
            if v not in per:
                continue
            rs = per[v]
            u = np.mean([r["update_rms"] for r in rs])
            grad = np.mean([r["grad_rms"] for r in rs])
            denom = np.mean([r["denominator_rms"] for r in rs])
            lines.append(f"| {env} | {v} | {rs[0]['step']:,} | {rs[0]['lr']:.3g} | {rs[0]['eps']:g} | "
                         f"{grad:.2e} | {denom:.2e} | {u:.2e} | {u / ref:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
