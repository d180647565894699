"""``perx dqn`` (one run, or seeds in lockstep), ``perx study`` (a resumable grid of envs x variants x seeds)
and ``perx plot`` (learning curves with 95% bands, and the table of 004 Table 2).

Layout: ``results/<study>/<env>/<variant>/seed=<s>/{metrics.csv, config.json, done, checkpoint/}``
(``<env>`` is the id with ``/`` -> ``-``), ``results/<study>/study.json`` (the grid), and from ``perx plot``
``curves.png``, ``final.csv``, ``table.md``. ``checkpoint/`` is not meant for git (it holds the replay
buffer); the rest is.

The grid is cut into lockstep groups, fixed by the grid alone: the runs of one environment in the order
variant, seed, ``group`` at a time. Each group trains in one process (networks stacked along a run axis,
one torch thread), ``workers`` processes at a time. A finished run has a ``done`` file and is skipped; an
interrupted group restarts from its runs' last checkpoint and continues exactly as if never interrupted
(same groups, same order: the grid decides them).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib
import json
import math
import multiprocessing as mp
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from perx.agents.dqn import DQNConfig
from perx.agents.runner import RENAMED, renamed
from perx.experiments._stats import bootstrap_interval, holm

PAPER_VARIANTS = ("uniform", "per", "rank", "lap", "pal")

DEFAULT_ENVS = ("MinAtar/Breakout-v0", "MinAtar/SpaceInvaders-v0")
#: Variants in the order tables and legends list them (DQN's and TD3's together).
ORDER = ("uniform", "per", "rank", "lap", "pal")


#: The agents a study can run: name -> (module, its config class, the study's defaults). A module holds a config
#: dataclass, its ``VARIANTS``, and ``train(configs, dirs, progress=...)`` for runs in lockstep (optionally
#: ``PRIORITY_RULES``/``SIZED_RULES`` for variant labels such as ``per+staleness``); adding an agent is that module
#: and one line here. Defaults' ``variants`` None: every one of the module's ``VARIANTS``.
AGENTS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # the five of 004 Table 2 (VARIANTS also holds the App. A hybrid, run on request)
    "dqn": ("perx.agents.dqn", "DQNConfig",
            {"envs": list(DEFAULT_ENVS), "variants": list(PAPER_VARIANTS), "total_steps": 500_000}),
    "td3": ("perx.agents.td3", "TD3Config",
            {"envs": ["Hopper-v5", "HalfCheetah-v5"], "variants": None, "total_steps": 100_000}),
}


def agent(name: str):
    """(config class, train function) of an agent named in :data:`AGENTS`."""
    if name not in AGENTS:
        raise SystemExit(f"agent: one of {sorted(AGENTS)}, got {name!r}")
    module = importlib.import_module(AGENTS[name][0])
    return getattr(module, AGENTS[name][1]), module.train


def env_dir(env_id: str) -> str:
    return env_id.replace("/", "-")


def run_dir(root: Path, env_id: str, variant: str, seed: int) -> Path:
    return root / env_dir(env_id) / variant / f"seed={seed}"


def label(cfg: Any) -> str:
    """A run's variant name in a study: the variant, plus ``+rule`` for a 000 App. A priority rule."""
    rule = getattr(cfg, "priority_rule", None)
    return cfg.variant if rule is None else f"{cfg.variant}+{rule}"


def split_label(name: str) -> dict[str, Any]:
    """``"per+learning-progress"`` -> {"variant": "per", "priority_rule": "learning-progress"}."""
    variant, _, rule = name.partition("+")
    return {"variant": variant, **({"priority_rule": rule} if rule else {})}


def _coerce(field: dataclasses.Field, text: str) -> Any:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    if text.lower() == "none":
        return None
    if "int" in kind and "." not in text and "e" not in text.lower():
        return int(text)
    if "float" in kind or "int" in kind:
        value = float(text)
        return int(value) if "int" in kind and "float" not in kind else value
    return text


class Parser(argparse.ArgumentParser):
    """argparse, with a refusal on one line (the program, the argument and the value) and exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def refuse(prog: str, message: str):
    """Exit with status 2 and one line naming what was refused (before anything is written)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_overrides(pairs: list[str], config_class: type = DQNConfig, prog: str = "perx") -> dict[str, Any]:
    """``key=value`` strings -> config fields, typed like the field."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        key = RENAMED.get(key.strip().replace("-", "_"), key.strip().replace("-", "_"))
        if key not in fields or not _:
            refuse(prog, f"--set: expected FIELD=VALUE with a {config_class.__name__} field, got {pair!r}; "
                         f"fields: {', '.join(sorted(fields))}")
        try:
            out[key] = _coerce(fields[key], value.strip())
        except ValueError:
            refuse(prog, f"--set: {key} takes a {fields[key].type}, got {value.strip()!r}")
    return out


def check_configs(prog: str, configs: list[Any]) -> None:
    """Refuse (exit 2, one line) what would fail or train nothing, before any file is written."""
    from perx.agents.envs import check_env_id

    first = configs[0]
    try:
        check_env_id(first.env_id)
    except ValueError as err:
        refuse(prog, f"--{err}")
    if first.total_steps < 1:
        refuse(prog, f"--steps: must be >= 1, got {first.total_steps}")
    starts = getattr(first, "learning_starts", None) or getattr(first, "start_steps", 0)
    if first.total_steps < starts:
        name = "learning_starts" if hasattr(first, "learning_starts") else "start_steps"
        refuse(prog, f"--steps: {first.total_steps} ends before the first update ({name} = {starts}): nothing would "
                     f"be trained; give more steps or --set {name}=...")
    for cfg in configs:
        try:
            cfg.settings()
        except ValueError as err:
            refuse(prog, str(err))


def cell_overrides(spec: dict, name: str) -> dict[str, Any]:
    """The config fields a run label stands for: a named cell of ``spec["cells"]`` (any config fields, its
    ``variant`` included), else a variant with an optional ``+rule``."""
    cells = spec.get("cells", {})
    if name in cells:
        return dict(cells[name])
    return split_label(name)


def grid_runs(spec: dict) -> list[list[tuple[str, Any]]]:
    """The lockstep groups of a study spec, in a fixed order, as (label, config) pairs.

    Runs are listed variant by variant (every seed of the first variant, then the next), or with
    ``order = "seeds"`` seed by seed (every variant of the first seed, then the next), so that with a
    group size that is a multiple of the number of variants each finished group is a complete
    comparison of all variants on some seeds; ``interleave = true`` then runs the first group of every
    environment before the second of any, so that finished groups cover every environment early. Runs that
    must not share a process (they differ in a field
    every run of a lockstep group shares, such as the optimiser's eps) go to separate groups, in the order
    they first appear; each such set is then cut into groups of ``group`` runs.
    """
    base = renamed(spec.get("config", {}))
    config_class, _ = agent(spec.get("agent", "dqn"))
    shared = importlib.import_module(config_class.__module__).SHARED
    order = spec.get("order", "variants")
    if order not in ("variants", "seeds"):
        raise SystemExit(f"order: 'variants' or 'seeds', got {order!r}")
    per_env: list[list[list[tuple[str, Any]]]] = []
    for env_id in spec["envs"]:
        pairs = ([(v, s) for v in spec["variants"] for s in spec["seeds"]] if order == "variants"
                 else [(v, s) for s in spec["seeds"] for v in spec["variants"]])
        sets: dict[tuple, list[tuple[str, Any]]] = {}
        for v, s in pairs:
            cfg = config_class(**{**base, "env_id": env_id, **cell_overrides(spec, v), "seed": s})
            sets.setdefault(tuple(getattr(cfg, f) for f in shared), []).append((v, cfg))
        per_env.append([runs[i:i + size] for runs in sets.values()
                        for size in [spec.get("group", len(runs))] for i in range(0, len(runs), size)])
    if spec.get("interleave", False):  # the first group of every env, then the second of every env, ...
        return [g for k in range(max(map(len, per_env))) for groups in per_env if k < len(groups)
                for g in [groups[k]]]
    return [g for groups in per_env for g in groups]


def grid(spec: dict) -> list[list[Any]]:
    """The lockstep groups of a study spec as lists of configs (see :func:`grid_runs`)."""
    return [[cfg for _, cfg in group] for group in grid_runs(spec)]


def _train_group(job: tuple[list[Any], list[str], int]) -> str:
    configs, dirs, position = job
    train = importlib.import_module(type(configs[0]).__module__).train  # the config's own agent
    start = time.time()
    train(configs, dirs, progress=position >= 0)
    return f"{configs[0].env_id} x{len(configs)} done in {time.time() - start:.0f} s"


#: Spec fields that only schedule the runs (which share a process, in what order), not what runs.
SCHEDULING = ("group", "interleave")


def _members(groups: list[list[tuple[str, Any]]]) -> dict[tuple[str, str, int], tuple]:
    """Each run's group, as (env, label, seed) -> the group's runs in order."""
    out = {}
    for g in groups:
        key = tuple((c.env_id, name, c.seed) for name, c in g)
        for run in key:
            out[run] = key
    return out


def _regroup_check(root: Path, old: list[list[tuple[str, Any]]], new: list[list[tuple[str, Any]]]) -> None:
    """Refuse a regrouping that moves an unfinished run with a checkpoint into another group: it would resume
    beside other partners, and its numbers would mix two groups' rounding (finished runs record theirs)."""
    before, after = _members(old), _members(new)
    busy = [str(d.relative_to(root)) for g in new for name, c in g
            for d in [run_dir(root, c.env_id, name, c.seed)]
            if before.get((c.env_id, name, c.seed)) != after[(c.env_id, name, c.seed)]
            and not (d / "done").exists() and (d / "checkpoint").is_dir() and any((d / "checkpoint").iterdir())]
    if busy:
        raise SystemExit(f"group: cannot regroup while runs {busy} have checkpoints of their old group; finish "
                         f"them with the old group size, or remove their folders to start them again")


def run_study(root: Path, spec: dict, workers: int, log=print) -> None:
    """Run (or resume) the grid ``spec`` in ``root``. ``group`` and ``interleave`` may change between
    sessions (a study regrouped to fit the time at hand) unless an unfinished run has a checkpoint;
    study.json keeps the earlier values under ``regrouped``."""
    root.mkdir(parents=True, exist_ok=True)
    saved = root / "study.json"
    groups = grid_runs(spec)
    if saved.exists():
        old = json.loads(saved.read_text())
        history = old.pop("regrouped", [])
        if old != spec:
            same_runs = ({k: v for k, v in old.items() if k not in SCHEDULING}
                         == {k: v for k, v in spec.items() if k not in SCHEDULING})
            if not same_runs:
                raise SystemExit(f"{saved} describes another grid; use another study name or remove it. "
                                 f"Saved: {old}")
            old_groups = grid_runs(old)
            if _members(old_groups) != _members(groups):  # (a spelled-out default changes nothing)
                _regroup_check(root, old_groups, groups)
                history.append({k: old.get(k) for k in SCHEDULING})
                log(f"{root.name}: regrouped ({', '.join(f'{k} {old.get(k)} -> {spec.get(k)}' for k in SCHEDULING)}"
                    f"); finished runs keep the partners their config.json records")
            saved.write_text(json.dumps({**spec, "regrouped": history} if history else spec, indent=2) + "\n")
    else:
        saved.write_text(json.dumps(spec, indent=2) + "\n")
    jobs = []
    for group in groups:
        # a finished run is never trained again (after a regrouping, a group may hold finished runs)
        todo = [(cfg, d) for name, cfg in group for d in [run_dir(root, cfg.env_id, name, cfg.seed)]
                if not (d / "done").exists()]
        if not todo:
            continue
        configs, dirs = [c for c, _ in todo], [d for _, d in todo]
        jobs.append((configs, [str(d) for d in dirs], len(jobs) % max(workers, 1)))
    total = sum(len(c) for c in groups)
    log(f"{root.name}: {total} runs in {len(groups)} lockstep groups; {len(jobs)} groups to run, {workers} workers")
    if not jobs:
        return
    if workers <= 1:
        for job in jobs:
            log(_train_group(job))
        return
    ctx = mp.get_context("spawn")
    bar = None
    try:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc=f"{root.name} groups", unit="group", position=workers)
    except ImportError:  # pragma: no cover - tqdm is in the agents extra
        pass
    with ctx.Pool(workers, maxtasksperchild=1) as pool:
        for message in pool.imap_unordered(_train_group, jobs):
            log(message)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()


# -- plotting -----------------------------------------------------------------------------------------

def read_metrics(path: Path) -> list[dict]:
    with open(path) as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def collect(root: Path) -> dict:
    """{env: {variant: {seed: rows}}} for every run with metrics (finished or not)."""
    out: dict = {}
    for path in sorted(root.glob("*/*/seed=*/metrics.csv")):
        seed = int(path.parent.name.split("=")[1])
        out.setdefault(path.parents[2].name, {}).setdefault(path.parents[1].name, {})[seed] = read_metrics(path)
    return out


def t_interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (Student t; 0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    from scipy import stats

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n))


def mean_cell(values: list[float]) -> str:
    """A table cell: the mean with its 95% t half-width, or with one value "x (1 seed)": no interval exists,
    and "± 0.00" would claim a certainty one seed cannot give."""
    mean, half = t_interval(values)
    return f"{mean:.2f} (1 seed)" if len(values) < 2 else f"{mean:.2f} ± {half:.2f}"


def overlapping_best(scores: dict[str, list[float]]) -> set[str]:
    """The variants 004 Table 1 prints in bold: those whose 95% t interval intersects the interval of the
    highest mean. Empty when a variant has fewer than 2 seeds (no interval) or there is only one variant."""
    if len(scores) < 2 or any(len(v) < 2 for v in scores.values()):
        return set()
    intervals = {k: t_interval(v) for k, v in scores.items()}
    best_mean, best_half = max(intervals.values(), key=lambda mh: mh[0])
    return {k for k, (m, h) in intervals.items() if m + h >= best_mean - best_half}


def final_score(rows: list[dict], last: int = 10) -> float:
    """Mean evaluation return over the last ``last`` evaluations (004 D.2)."""
    tail = rows[-last:]
    return sum(r["eval_return"] for r in tail) / len(tail)


def gain(x: float, y: float) -> float:
    """(x - y) / |y| (004 Table 2); nan when y is 0."""
    return (x - y) / abs(y) if y != 0 else float("nan")


def plot(root: Path, log=print) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = collect(root)
    if not data:
        raise SystemExit(f"{root}: no metrics.csv found")
    envs = sorted(data)
    found = {v for e in envs for v in data[e]}
    variants = [v for v in ORDER if v in found] + sorted(found - set(ORDER))  # then App. A rule variants
    fig, axes = plt.subplots(1, len(envs), figsize=(5.5 * len(envs) + 2.5, 4.4), squeeze=False, layout="constrained")
    finals: dict = {}
    for ax, env in zip(axes[0], envs, strict=True):
        for v in variants:
            seeds = data[env].get(v, {})
            if not seeds:
                continue
            steps = sorted({r["step"] for rows in seeds.values() for r in rows})
            xs, means, lows, highs = [], [], [], []
            for s in steps:
                vals = [r["eval_return"] for rows in seeds.values() for r in rows if r["step"] == s]
                if len(vals) == len(seeds):  # only steps every seed reached
                    low, high = bootstrap_interval(vals)
                    xs.append(s)
                    means.append(sum(vals) / len(vals))
                    lows.append(low)
                    highs.append(high)
            color = f"C{variants.index(v) % 10}"  # one colour per variant in every panel
            ax.plot(xs, means, label=v, color=color)
            ax.fill_between(xs, lows, highs, color=color, alpha=0.15, linewidth=0)
            finals.setdefault(env, {})[v] = seeds
        counts = {v: len(seeds) for v, seeds in data[env].items() if seeds}
        n = sorted(set(counts.values()))
        ax.set_title(f"{env} ({n[0]} seed{'s' if n[0] > 1 else ''})" if len(n) == 1 else
                     f"{env} (seeds: " + ", ".join(f"{v} {c}" for v, c in counts.items()) + ")", fontsize=10)
        ax.set_xlabel("environment steps")
        ax.set_ylabel("evaluation return")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1e6:g}M" if x >= 1e6 else f"{x / 1e3:g}k")
        ax.grid(alpha=0.3)
    # one legend for all panels, outside them: it never covers a curve
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="outside right center", fontsize=8, frameon=False)
    # Final scores at the step every run of an environment has reached (a study in progress compares
    # like with like); finished studies use each run's last 10 evaluations.
    common = {env: min(int(rows[-1]["step"]) for v in finals[env].values() for rows in v.values() if rows)
              for env in finals}
    finals = {env: {v: {s: final_score([r for r in rows if r["step"] <= common[env]])
                        for s, rows in seeds.items() if rows} for v, seeds in per_v.items()}
              for env, per_v in finals.items()}
    fig.suptitle(f"{root.name}: mean over seeds; band: 95% percentile bootstrap of the mean", fontsize=10)
    fig.savefig(root / "curves.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    lines = [f"# {root.name}: final scores and gains", "",
             "Final score: mean evaluation return over the last 10 evaluations of each run (004 D.2) up to the "
             "step every run of the environment has reached (" + ", ".join(f"{e}: {common[e]:,}" for e in envs)
             + "); mean over seeds with the half-width of a 95% t interval; bold where that interval intersects the "
             "interval of the environment's highest mean (004 Table 1). Gain of x over y: (x - y) / |y| "
             "per environment (004 Table 2), then mean and median over environments.", "",
             "| env | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    with open(root / "final.csv", "w") as f:
        f.write("env,variant,seed,final_score,steps\n")
        for env in envs:
            for v in variants:
                for s, score in sorted(finals.get(env, {}).get(v, {}).items()):
                    f.write(f"{env},{v},{s},{score:.4f},{common[env]}\n")
    means = {env: {v: t_interval(list(finals[env][v].values())) for v in finals.get(env, {})} for env in envs}
    for env in envs:
        scores = {v: list(seeds.values()) for v, seeds in finals.get(env, {}).items()}
        bold = overlapping_best(scores)
        cells = [("-" if v not in scores else f"**{mean_cell(scores[v])}**" if v in bold else mean_cell(scores[v]))
                 for v in variants]
        lines.append(f"| {env} | " + " | ".join(cells) + " |")
    for ref in ("uniform", "per"):
        if ref not in variants:  # say why instead of a table of dashes
            lines += ["", f"(No gain over {ref}: this study has no {ref} runs.)"]
            log(f"{root.name}: no gain over {ref} (no {ref} runs in this study)")
            continue
        lines += ["", f"| gain over {ref} | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
        for stat in ("mean", "median"):
            cells = []
            for v in variants:
                gains = [gain(means[e][v][0], means[e][ref][0]) for e in envs if v in means[e] and ref in means[e]]
                gains = [g for g in gains if not math.isnan(g)]
                if not gains:
                    cells.append("-")
                    continue
                value = sum(gains) / len(gains) if stat == "mean" else sorted(gains)[len(gains) // 2] if len(
                    gains) % 2 else (sorted(gains)[len(gains) // 2 - 1] + sorted(gains)[len(gains) // 2]) / 2
                cells.append(f"{100 * value:+.1f}%")
            lines.append(f"| {stat} | " + " | ".join(cells) + " |")
        if len(envs) > 1:  # 000 Table 1's count: on how many games the variant's mean is above the reference's
            cells = [f"{sum(means[e][v][0] > means[e][ref][0] for e in envs if v in means[e] and ref in means[e])}"
                     f"/{sum(1 for e in envs if v in means[e] and ref in means[e])}" if v != ref else "-"
                     for v in variants]
            lines.append("| games above | " + " | ".join(cells) + " |")
    lines += _paired_lines(finals, envs, variants)
    lines += _pooled_lines(finals, envs, variants)
    lines += _train_return_lines(data, envs, variants)
    (root / "table.md").write_text("\n".join(lines) + "\n")
    log(f"wrote {root / 'curves.png'}, {root / 'table.md'}, {root / 'final.csv'}")
    return {"finals": finals, "means": means}


def _pooled_lines(finals: dict, envs: list, variants: list, min_pairs: int = 6) -> list[str]:
    """Each variant against uniform over all games at once: per (game, seed) the paired difference scaled by
    the game's mean uniform score, (x - u) / |mean u| (004 Table 2's gain, seed by seed); its mean with a 95% t
    interval, the pairs above 0, and the two-sided Wilcoxon signed-rank p (Holm over the table's tests). One
    game's 5 seeds alone cannot reach p < 0.0625 with the signed-rank test; the pooled pairs can."""
    from scipy import stats

    if "uniform" not in variants or len(envs) < 2:
        return []
    rows, ps = [], []
    for v in variants:
        if v == "uniform":
            continue
        diffs = []
        for env in envs:
            a, u = finals.get(env, {}).get(v, {}), finals.get(env, {}).get("uniform", {})
            common = sorted(set(a) & set(u))
            scale = abs(sum(u.values()) / len(u)) if u else 0.0
            if scale > 0:
                diffs += [(a[k] - u[k]) / scale for k in common]
        if len(diffs) < min_pairs:
            continue
        mean, half = t_interval(diffs)
        p = float(stats.wilcoxon(diffs).pvalue) if any(d != 0 for d in diffs) else 1.0
        rows.append((v, len(diffs), mean, half, sum(d > 0 for d in diffs)))
        ps.append(p)
    if not rows:
        return []
    out = ["", f"| pooled over games vs uniform: (x - u) / mean u per (game, seed) | pairs | mean ± 95% t | "
           f"pairs above 0 | Wilcoxon p (Holm over {len(rows)}) |", "|---|---|---|---|---|"]
    for (v, n, mean, half, above), p, adj in zip(rows, ps, holm(ps), strict=True):
        out.append(f"| {v} | {n} | {100 * mean:+.1f}% ± {100 * half:.1f}% | {above}/{n} | {p:.3f} ({adj:.3f}) |")
    return out


def _train_return_lines(data: dict, envs: list, variants: list) -> list[str]:
    """Training returns (``train_return``: the mean of each run's last 10 training episodes) at the middle and
    at the end of the runs, mean over seeds with a 95% t interval: the quantity the MinAtar paper plots."""
    ends = [int(max(r["step"] for seeds in data[e].values() for rows in seeds.values() for r in rows)) for e in envs]
    if not ends:
        return []
    end = min(ends)
    marks = sorted({end // 2, end})
    out = ["", "| training return (last 10 episodes) | step | " + " | ".join(variants) + " |",
           "|---|---|" + "---|" * len(variants)]
    for env in envs:
        for step in marks:
            cells = []
            for v in variants:
                vals = [r["train_return"] for rows in data[env].get(v, {}).values() for r in rows
                        if int(r["step"]) == step and not math.isnan(r["train_return"])]
                cells.append(mean_cell(vals) if vals else "-")
            out.append(f"| {env} | {step:,} | " + " | ".join(cells) + " |")
    return out


def _paired_lines(finals: dict, envs: list, variants: list, min_pairs: int = 5) -> list[str]:
    """Per environment, each variant against uniform and per, paired by seed (a seed fixes the environment's
    and the network's randomness in every variant): the seeds on which it scored higher, and the two-sided
    p-value of the Wilcoxon signed-rank test (exact for small samples), raw and Holm-adjusted over the family
    of every test in that table (one table per reference). Needs min_pairs common seeds."""
    from scipy import stats

    out = []
    for ref in ("uniform", "per"):
        if ref not in variants:
            continue
        cells: dict[tuple[str, str], tuple[int, int, float]] = {}
        for env in envs:
            for v in variants:
                a, b = finals.get(env, {}).get(v, {}), finals.get(env, {}).get(ref, {})
                common = sorted(set(a) & set(b))
                if v == ref or len(common) < min_pairs:
                    continue
                x = [a[k] for k in common]
                y = [b[k] for k in common]
                higher = sum(p > q for p, q in zip(x, y, strict=True))
                p = stats.wilcoxon(x, y).pvalue if any(p != q for p, q in zip(x, y, strict=True)) else 1.0
                cells[env, v] = (higher, len(common), float(p))
        if not cells:  # fewer than min_pairs common seeds everywhere: no table
            continue
        adjusted = dict(zip(cells, holm([c[2] for c in cells.values()]), strict=True))
        out += ["", f"| paired by seed vs {ref}: seeds higher, Wilcoxon p (Holm over the {len(cells)} tests of "
                f"this table) | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
        for env in envs:
            row = [f"{cells[env, v][0]}/{cells[env, v][1]}, p = {cells[env, v][2]:.3f} "
                   f"(Holm {adjusted[env, v]:.3f})" if (env, v) in cells else "-" for v in variants]
            out.append(f"| {env} | " + " | ".join(row) + " |")
    return out


# -- commands -----------------------------------------------------------------------------------------

def dqn_main(argv: list[str] | None = None, prog: str = "perx dqn", agent_name: str = "dqn") -> int:
    config_class, train = agent(agent_name)
    module = importlib.import_module(config_class.__module__)
    defaults = config_class()
    parser = Parser(prog=prog, description=f"Train {agent_name.upper()} with a perx replay variant "
                    f"(docs/{agent_name}.md).")
    parser.add_argument("--env", default=defaults.env_id, help=f"Gymnasium id (default {defaults.env_id}); "
                        + ("MinAtar/<Game>-v0, ALE/<Game>-v5 or e.g. CartPole-v1" if agent_name == "dqn"
                           else "a MuJoCo v5 task or Pendulum-v1"))
    parser.add_argument("--variant", default=defaults.variant, choices=sorted(module.VARIANTS),
                        help=f"replay variant (default {defaults.variant})")
    presets = getattr(module, "PRESETS", None)
    if presets is not None:
        parser.add_argument("--preset", default=defaults.preset, choices=list(presets),
                            help=getattr(module, "PRESET_HELP", "named settings; see the agent's docs"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds, trained in lockstep (default 0)")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"total environment steps (default {defaults.total_steps:,})")
    parser.add_argument("--device", default="cpu", help="torch device of the networks (default cpu)")
    parser.add_argument("--out", default=f"runs/{agent_name}",
                        help=f"output folder, one subfolder per run (default runs/{agent_name}, which git ignores)")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help=f"any {config_class.__name__} field")
    args = parser.parse_args(argv)
    extra = parse_overrides(args.set, config_class, prog)
    if args.steps is not None:
        extra["total_steps"] = args.steps
    if presets is not None:
        extra.setdefault("preset", args.preset)
    try:
        configs = [config_class(env_id=args.env, variant=args.variant, seed=s, device=args.device, **extra)
                   for s in args.seeds]
    except (ValueError, TypeError) as err:
        refuse(prog, str(err))
    check_configs(prog, configs)
    root = Path(args.out)
    dirs = [run_dir(root, c.env_id, label(c), c.seed) for c in configs]
    rows = train(configs, dirs, progress=True, log=print)
    for c, r, d in zip(configs, rows, dirs, strict=True):
        if not r:
            continue
        last = r[-1]
        trained = any(not math.isnan(row["loss"]) for row in r)
        print(f"seed {c.seed}: final evaluation return {last['eval_return']:.2f} at step {int(last['step']):,}"
              + ("" if trained else " (no update was made: the run ended before learning started)") + f"; {d}")
    return 0


def td3_main(argv: list[str] | None = None, prog: str = "perx td3") -> int:
    return dqn_main(argv, prog, "td3")


def study_spec(args: argparse.Namespace) -> dict:
    """The grid: the agent's defaults, then the TOML file, then the flags."""
    given: dict[str, Any] = {}
    if args.config:
        with open(args.config, "rb") as f:
            given = tomllib.load(f)
    name = args.agent or given.get("agent", "dqn")
    if name not in AGENTS:
        raise SystemExit(f"agent: one of {sorted(AGENTS)}, got {name!r}")
    defaults = dict(AGENTS[name][2])
    if defaults["variants"] is None:
        defaults["variants"] = list(importlib.import_module(AGENTS[name][0]).VARIANTS)
    spec: dict[str, Any] = {"envs": defaults["envs"], "variants": defaults["variants"], "seeds": [0, 1, 2], **given}
    spec["config"] = {"total_steps": defaults["total_steps"], **given.get("config", {})}
    if name != "dqn":
        spec["agent"] = name
    if args.envs:
        spec["envs"] = args.envs
    if args.variants:
        spec["variants"] = args.variants
    if args.seeds is not None:
        spec["seeds"] = list(range(args.seeds))
    if args.steps is not None:
        spec.setdefault("config", {})["total_steps"] = args.steps
    if args.group is not None:
        spec["group"] = args.group
    config_class, _ = agent(spec.get("agent", "dqn"))
    spec.setdefault("config", {}).update(parse_overrides(args.set, config_class))
    known = importlib.import_module(config_class.__module__).VARIANTS
    cells = spec.get("cells", {})
    if cells and not given.get("variants") and not args.variants:
        spec["variants"] = list(cells)  # a grid of named cells runs all of them unless told otherwise
    for name, fields in cells.items():
        bad = set(fields) - {f.name for f in dataclasses.fields(config_class)}
        if bad or "variant" not in fields:
            raise SystemExit(f"cells.{name}: needs a variant and only {config_class.__name__} fields; "
                             f"unknown {sorted(bad)}" if bad else f"cells.{name}: needs a variant")
    unknown = {v for v in spec["variants"] if v not in cells and split_label(v)["variant"] not in known}
    rules = {split_label(v).get("priority_rule") for v in spec["variants"] if v not in cells} - {None}
    module = importlib.import_module(config_class.__module__)
    if rules and hasattr(module, "PRIORITY_RULES"):
        names = {*module.PRIORITY_RULES, *getattr(module, "SIZED_RULES", {})}
        if rules - names:
            raise SystemExit(f"variants: unknown priority rules {sorted(rules - names)}; known "
                             f"{sorted(names)} (as per+learning-progress, rank+staleness)")
    if unknown:
        raise SystemExit(f"variants: unknown {sorted(unknown)}; known {sorted(known)}")
    return spec


def find_study(name: str, results: str | None) -> Path:
    """A study's folder: ``name`` itself if it is a folder, else ``<results>/<name>``; without ``results``,
    ``runs/<name>`` (where studies run by default) if it exists, else ``results/<name>`` (the committed ones)."""
    if Path(name).is_dir():
        return Path(name)
    if results is not None:
        return Path(results) / name
    for root in ("runs", "results"):
        if (Path(root) / name).is_dir():
            return Path(root) / name
    return Path("runs") / name


def study_main(argv: list[str] | None = None, prog: str = "perx study") -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "verify":
        from perx.experiments import verify

        return verify.main(argv[1:], prog=f"{prog} verify")
    parser = Parser(prog=prog, description="Run (or resume) a grid of DQN or TD3 runs, then plot it "
                    "(docs/dqn.md). `perx study verify <study>` reruns its first steps and compares.")
    parser.add_argument("name", help="study name: <results>/<name>/")
    parser.add_argument("--config", help="TOML file with agent, envs, variants, seeds, group and [config] fields")
    parser.add_argument("--agent", choices=tuple(AGENTS), help="default dqn (MinAtar); td3: MuJoCo")
    parser.add_argument("--envs", nargs="+", help="Gymnasium ids (default: the TOML's, else MinAtar Breakout and "
                        "SpaceInvaders)")
    parser.add_argument("--variants", nargs="+", help="variants or cells (default: the TOML's, else all five)")
    parser.add_argument("--seeds", type=int, help="number of seeds (0..n-1)")
    parser.add_argument("--steps", type=int, help="environment steps per run")
    parser.add_argument("--group", type=int, help="runs per lockstep group (default: all runs of an env)")
    parser.add_argument("--workers", type=int, default=2, help="processes (one torch thread each; default 2)")
    parser.add_argument("--results", default="runs", help="folder of studies (default runs/, which git ignores; "
                        "the committed studies are in results/: --results results regenerates them)")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="any DQNConfig field")
    args = parser.parse_args(argv)
    if args.workers < 1:
        refuse(prog, f"--workers: must be >= 1, got {args.workers}")
    if args.seeds is not None and args.seeds < 1:
        refuse(prog, f"--seeds: must be >= 1, got {args.seeds}")
    if args.group is not None and args.group < 1:
        refuse(prog, f"--group: must be >= 1, got {args.group}")
    root = Path(args.results) / args.name
    spec = study_spec(args)
    for group in grid(spec):
        check_configs(prog, group)
    run_study(root, spec, args.workers)
    plot(root)
    return 0


def plot_main(argv: list[str] | None = None, prog: str = "perx plot") -> int:
    parser = Parser(prog=prog, description="Curves and tables of a study (curves.png, table.md, final.csv in its "
                    "folder).")
    parser.add_argument("study", help="study name or folder: runs/<name> if it exists, else results/<name>")
    parser.add_argument("--results", default=None, help="look for the study in this folder instead")
    args = parser.parse_args(argv)
    root = find_study(args.study, args.results)
    if not root.is_dir():
        refuse(prog, f"study: no folder {root} (nor {args.study!r} itself)")
    plot(root)
    return 0


if __name__ == "__main__":
    sys.exit(study_main())
