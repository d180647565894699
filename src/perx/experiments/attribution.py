"""Which setting makes Double DQN with PER collapse on MinAtar (issue 36)? The analysis of the
``minatar-attribution`` grid: per cell its final score against uniform replay at the same RMSprop eps, the
size of its parameter updates against uniform's, the IS weights it trains with, and the main effects and
interactions of the 2^3 factorial (RMSprop eps x IS normalisation x step size).

    perx study minatar-attribution --config results/minatar-attribution.toml
    python -m perx.experiments.attribution results/minatar-attribution [--checkpoints <folder with checkpoints>]

Update sizes need the runs' checkpoints (not committed: they hold replay buffers); they are measured once
into ``update_sizes.csv`` beside the study, and later calls read that file, so the table and figure
regenerate from committed files alone.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from perx.experiments import study

#: The factors of the grid and the level the published settings (000/004 as perx ran them) take.
FACTORS = {"optimizer_eps": (0.01, 1e-5), "normalize": ("buffer", "batch"), "lr_scale": (0.25, 1.0)}
FACTOR_NAMES = {"optimizer_eps": "RMSprop eps 0.01 -> 1e-5", "normalize": "IS normalisation buffer -> batch",
                "lr_scale": "step size eta/4 -> eta"}


def cell_fields(spec: dict, name: str) -> dict[str, Any]:
    """A cell's resolved settings: its config fields over the study's base config."""
    from perx.agents.dqn import DQNConfig

    cfg = DQNConfig(**{**spec.get("config", {}), "env_id": spec["envs"][0], **study.cell_overrides(spec, name)})
    s = cfg.settings()
    return {"variant": cfg.variant, "optimizer_eps": cfg.optimizer_eps, "normalize": s.get("normalize"),
            "lr_scale": s["lr_scale"], "priority_eps": s.get("priority_eps"), "priority_clip": s.get("priority_clip")}


def measure_update_sizes(study_dir: Path, checkpoints: Path, updates: int, log=print) -> list[dict]:
    """Restore every checkpointed run under ``checkpoints`` and measure ``updates`` further updates
    (:func:`perx.experiments.step_sizes.measure`); rows keyed by env, cell and seed."""
    import torch

    from perx.agents.runner import flush_denormals
    from perx.experiments.step_sizes import checkpointed_runs, measure

    torch.set_num_threads(1)
    rows = []
    with flush_denormals():
        for run in checkpointed_runs(checkpoints):
            m = measure(run, updates)
            m.update(env=run.parents[1].name, cell=run.parent.name, seed=int(run.name.split("=")[1]))
            rows.append(m)
            log(f"{m['env']} {m['cell']} seed {m['seed']}: update {m['update_rms']:.2e}, "
                f"mean IS weight {m['weight_mean']:.2e}")
    keys = ["env", "cell", "seed", "step", "lr", "eps", "grad_rms", "denominator_rms", "update_rms", "weight_mean",
            "weight_median"]
    with open(study_dir / "update_sizes.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return rows


def read_update_sizes(study_dir: Path) -> list[dict]:
    path = study_dir / "update_sizes.csv"
    if not path.exists():
        return []
    with open(path) as f:
        return [{k: (v if k in ("env", "cell") else float(v)) for k, v in r.items()} for r in csv.DictReader(f)]


def analyse(study_dir: Path, sizes: list[dict]) -> dict[str, Any]:
    """Per env and cell: final scores per seed, gain over uniform at the same eps, update size and IS weight
    relative to / of the cell; main effects and two-way interactions of the factorial on the gain."""
    spec = json.loads((study_dir / "study.json").read_text())
    data = study.collect(study_dir)
    cells = list(spec["cells"])
    fields = {c: cell_fields(spec, c) for c in cells}
    out: dict[str, Any] = {"cells": cells, "fields": fields, "envs": {}}
    for env, per_cell in sorted(data.items()):
        scores = {c: {s: study.final_score(rows) for s, rows in per_cell.get(c, {}).items() if rows} for c in cells}
        uniform = {fields[c]["optimizer_eps"]: c for c in cells if fields[c]["variant"] == "uniform"}
        size = {c: [r for r in sizes if r["env"] == env and r["cell"] == c] for c in cells}
        table = {}
        for c in cells:
            if not scores[c]:
                continue
            ref = uniform.get(fields[c]["optimizer_eps"])
            mean, half = study.t_interval(list(scores[c].values()))
            ref_mean = np.mean(list(scores[ref].values())) if ref and scores.get(ref) else np.nan
            upd = np.mean([r["update_rms"] for r in size[c]]) if size[c] else np.nan
            ref_upd = np.mean([r["update_rms"] for r in size[ref]]) if ref and size[ref] else np.nan
            table[c] = {"seeds": scores[c], "mean": mean, "ci95": half, "gain": study.gain(mean, ref_mean),
                        "update_ratio": upd / ref_upd, "update_rms": upd,
                        "weight_mean": np.mean([r["weight_mean"] for r in size[c]]) if size[c] else np.nan}
        out["envs"][env] = {"table": table, "effects": _effects(table, fields)}
    return out


def _factorial_cells(fields: dict) -> dict[tuple, str]:
    """{(level index per factor): cell} for the PER cells of the 2^3 grid (no floor or clip change)."""
    out = {}
    for c, f in fields.items():
        if f["variant"] != "per" or f["priority_clip"] is not None or f["priority_eps"] != 1e-10:
            continue
        key = tuple(FACTORS[k].index(f[k]) if f[k] in FACTORS[k] else None for k in FACTORS)
        if None not in key:
            out[key] = c
    return out


def _effects(table: dict, fields: dict) -> dict[str, float]:
    """Main effects (mean gain at the second level minus at the first, over the other factors' levels) and
    two-way interactions (half the difference of one factor's effect between the other's levels), in gain
    units; nan until all 8 cells have scores."""
    cells = _factorial_cells(fields)
    if len(cells) < 8 or any(cells[k] not in table for k in cells):
        return {}
    g = {k: table[c]["gain"] for k, c in cells.items()}
    names = list(FACTORS)
    out = {}
    for i, name in enumerate(names):
        hi = np.mean([v for k, v in g.items() if k[i] == 1])
        lo = np.mean([v for k, v in g.items() if k[i] == 0])
        out[name] = hi - lo
    for i, j in itertools.combinations(range(3), 2):
        def effect_i(level_j: int, i=i, j=j) -> float:
            return (np.mean([v for k, v in g.items() if k[i] == 1 and k[j] == level_j])
                    - np.mean([v for k, v in g.items() if k[i] == 0 and k[j] == level_j]))
        out[f"{names[i]} x {names[j]}"] = (effect_i(1) - effect_i(0)) / 2
    return out


def _num(x: float, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, fmt)


def report(result: dict[str, Any], study_dir: Path) -> str:
    lines = [f"# {study_dir.name}: what makes PER collapse", "",
             f"`python -m perx.experiments.attribution {study_dir}` (scores from metrics.csv; update sizes from "
             "update_sizes.csv, measured from each run's last checkpoint at 250k steps).", "",
             "Final score: mean of the 10 evaluations at 25k..250k steps (10 episodes each, epsilon 0.001), "
             "mean over 3 seeds with a 95% t interval. Gain: (score - uniform's) / uniform's, uniform at the same "
             "RMSprop eps. Update: RMS parameter change per update over 50 updates, relative to uniform's at the "
             "same eps. IS weight: mean weight of the sampled transitions in those updates.", ""]
    for env, res in result["envs"].items():
        lines += [f"## {env}", "", "| cell | eps | IS norm | step | floor | clip | final score | gain vs uniform | "
                  "update / uniform's | mean IS weight |", "|---|---|---|---|---|---|---|---|---|---|"]
        for c in result["cells"]:
            if c not in res["table"]:
                continue
            t, f = res["table"][c], result["fields"][c]
            per = f["variant"] != "uniform"
            lines.append(
                f"| {c} | {f['optimizer_eps']:g} | {f['normalize'] or '-'} | "
                f"{'eta' if f['lr_scale'] == 1 else 'eta/4' if f['lr_scale'] == 0.25 else f['lr_scale']} | "
                f"{_num(f['priority_eps'], 'g') if per else '-'} | {f['priority_clip'] or '-'} | "
                f"{t['mean']:.2f} ± {t['ci95']:.2f} | {_num(100 * t['gain'], '+.0f')}% | "
                f"{_num(t['update_ratio'], '.3f')} | {_num(t['weight_mean'], '.2e') if per else '1'} |")
        if res["effects"]:
            lines += ["", "Effects on the gain of the 2^3 factorial (floor 1e-10, no clip), in percentage points: "
                      "main effect = mean gain at the second level minus at the first; interaction = half the "
                      "change of the first factor's effect between the second's levels.", "",
                      "| effect | percentage points |", "|---|---|"]
            for k, v in res["effects"].items():
                name = FACTOR_NAMES.get(k, k)
                lines.append(f"| {name} | {100 * v:+.0f} |")
        lines.append("")
    return "\n".join(lines)


def figure(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(result["envs"])
    fig, axes = plt.subplots(1, len(envs), figsize=(6.5 * len(envs), 4.8), squeeze=False, layout="constrained")
    for ax, env in zip(axes[0], envs, strict=True):
        table = result["envs"][env]["table"]
        for c, t in table.items():
            f = result["fields"][c]
            if f["variant"] == "uniform" or np.isnan(t["update_ratio"]):
                continue
            marker = "o" if f["normalize"] == "batch" else ("s" if f["priority_clip"] is None and
                                                            f["priority_eps"] == 1e-10 else "D")
            color = "tab:blue" if f["optimizer_eps"] == 1e-5 else "tab:red"
            ax.errorbar(t["update_ratio"], t["mean"], yerr=t["ci95"], fmt=marker, color=color,
                        mfc=color if f["lr_scale"] == 1 else "white", capsize=2)
        for c, t in table.items():
            if result["fields"][c]["variant"] == "uniform":
                color = "tab:blue" if result["fields"][c]["optimizer_eps"] == 1e-5 else "tab:red"
                ax.axhline(t["mean"], color=color, linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel("update size / uniform's (same eps)")
        ax.set_ylabel("final score (mean of 10 evaluations)")
        ax.set_title(env)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color="tab:red", marker="o", linestyle="", label="RMSprop eps 0.01"),
               Line2D([], [], color="tab:blue", marker="o", linestyle="", label="RMSprop eps 1e-5"),
               Line2D([], [], color="gray", marker="o", linestyle="", label="IS weights / batch max"),
               Line2D([], [], color="gray", marker="s", linestyle="", label="IS weights / buffer max"),
               Line2D([], [], color="gray", marker="D", linestyle="", label="buffer max, floor 1e-6 or clip 1"),
               Line2D([], [], color="gray", marker="o", mfc="white", linestyle="", label="step eta/4 (hollow)"),
               Line2D([], [], color="gray", linestyle="--", label="uniform (same eps)")]
    fig.legend(handles=handles, loc="outside right center", fontsize=8)
    fig.suptitle("PER on MinAtar at 250k steps: score against update size (3 seeds, 95% t intervals, cut at 0)")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", help="the study folder, e.g. results/minatar-attribution")
    parser.add_argument("--checkpoints", help="a folder with the same runs and their checkpoints: measure the "
                        "update sizes from them (written to update_sizes.csv in the study folder)")
    parser.add_argument("--updates", type=int, default=50)
    args = parser.parse_args(argv)
    root = Path(args.study)
    sizes = (measure_update_sizes(root, Path(args.checkpoints), args.updates) if args.checkpoints
             else read_update_sizes(root))
    result = analyse(root, sizes)
    text = report(result, root)
    (root / "attribution.md").write_text(text)
    figure(result, root / "attribution.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
