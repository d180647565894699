"""``perx study verify <study>``: rerun the first steps of a study's runs and compare them with its files.

A run's numbers are a function of its config, the code and the machine: on one machine a rerun repeats
every digit (the agents seed every generator and checkpoints restore them exactly), but another CPU may
round differently (numba compiles its kernels for the host CPU; torch picks vector code by the CPU's
instruction set), and one different rounding sends a training run down another path. So this check
reports, per run, either agreement in every recorded digit of ``metrics.csv`` up to the step checked, or
the machine differences recorded in ``config.json`` together with a statistical comparison of the rerun
with the recorded values (paired by run and evaluation step).

Runs are rerun in the lockstep groups they were trained in (each run's config.json records its partners;
the grid's groups where it does not): the batched kernels round a run's numbers differently in groups of
different sizes, so a run alone, or in another group, would not repeat its group's digits.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from perx.experiments import study

#: metrics.csv columns compared (steps_per_second and runs_in_process describe the machine, not the run).
COMPARED = ("step", "episodes", "eval_return", "train_return", "loss")


def _fmt(value: Any) -> str:
    """A value as ``write_metrics`` writes it."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _recorded(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _machine_difference(run_dir: Path) -> dict[str, tuple[Any, Any]]:
    """{key: (recorded, here)} for the machine facts that differ; keys a run did not record show None."""
    from perx.agents.runner import machine

    here = machine()
    try:
        saved = json.loads((run_dir / "config.json").read_text()).get("machine", {})
    except (OSError, ValueError):
        saved = {}
    keys = ("cpu", "numba_target", "isa_level", "torch_cpu_capability", "cpu_features")
    return {k: (saved.get(k), here.get(k)) for k in keys if saved.get(k) != here.get(k)}


def _label(cfg: Any) -> str:
    """A run as the runner's ``lockstep`` record names it (not unique where runs share a variant)."""
    return f"{cfg.variant}/seed={cfg.seed}"


def _folder(name: str, cfg: Any) -> str:
    """A run as ``lockstep_runs`` names it: its folder under the environment's, unique in the grid."""
    return f"{name}/seed={cfg.seed}"


def recorded_groups(root: Path, groups: list[list[tuple[str, Any]]]
                    ) -> list[tuple[list[tuple[str, Any]], list[bool]]]:
    """The lockstep groups the runs were trained in, as (group, checked) pairs: ``group`` is rerun together,
    ``checked[i]`` says whether run i's files are compared with this rerun.

    A grid group whose runs record exactly its own members (or record nothing) is kept as it is. Other runs
    (a study regrouped between sessions, ``perx study --group``) are regrouped as their config.json records:
    by ``lockstep_runs`` (partners' folders) where written, else by ``lockstep`` (variant/seed, which must
    then name one run of the environment). A partner that was later retrained in another group is rerun
    (its config is the grid's) but checked only in its own group. Groups keep the order of their first run.
    """
    def record(name: str, cfg: Any) -> tuple[str, tuple[str, ...]] | None:
        try:
            saved = json.loads((study.run_dir(root, cfg.env_id, name, cfg.seed) / "config.json").read_text())
        except (OSError, ValueError):
            return None
        if "lockstep_runs" in saved:
            return "folder", tuple(saved["lockstep_runs"])
        return ("label", tuple(saved["lockstep"])) if "lockstep" in saved else None

    out: list[tuple[list[tuple[str, Any]], list[bool]]] = []
    index: dict[tuple[str, tuple[str, ...]], int] = {}  # (env, recorded partners) -> place in out
    by_name: dict[tuple[str, str, str], list[tuple[str, Any]]] = {}
    for group in groups:
        for run in group:
            name, cfg = run
            by_name.setdefault((cfg.env_id, "folder", _folder(name, cfg)), []).append(run)
            by_name.setdefault((cfg.env_id, "label", _label(cfg)), []).append(run)
    for group in groups:
        own = {"folder": tuple(_folder(n, c) for n, c in group), "label": tuple(_label(c) for _, c in group)}
        records = [record(n, c) for n, c in group]
        if all(r is None or r[1] == own[r[0]] for r in records):
            out.append((group, [True] * len(group)))
            continue
        for run, rec in zip(group, records, strict=True):
            name, cfg = run
            if rec is None:  # (no record: trained in its grid group)
                rec = ("folder", own["folder"])
            kind, partners = rec
            mine = _folder(name, cfg) if kind == "folder" else _label(cfg)
            where = str(study.run_dir(root, cfg.env_id, name, cfg.seed).relative_to(root))
            if mine not in partners:
                raise SystemExit(f"{where}: its config.json records lockstep partners {list(partners)} without "
                                 f"itself; it cannot be rerun as trained")
            key = (cfg.env_id, partners)
            if key not in index:
                members = []
                for p in partners:
                    found = by_name.get((cfg.env_id, kind, p), [])
                    if len(found) != 1:
                        raise SystemExit(f"{where}: records lockstep partners {list(partners)}, but the grid holds "
                                         f"{len(found)} runs named {p}; it cannot be rerun as trained")
                    members.append(found[0])
                index[key] = len(out)
                out.append((members, [False] * len(members)))
            members, checked = out[index[key]]
            checked[members.index(run)] = True
    return out


def verify(root: Path, steps: int | None = None, groups: int | None = None, sample_seed: int = 0,
           log=print, envs: list[str] | None = None) -> dict[str, Any]:
    """Rerun the first ``steps`` environment steps (default: up to the first evaluation) of the lockstep
    groups of the study in ``root`` (all, or a random sample of ``groups``) and compare.

    Returns {"runs": [{"run", "status" ("exact" or "differs"), "rows", "first_difference", "machine"}],
    "differences": [(rerun - recorded) eval_return per compared row of the runs that differ], "test": summary}.
    """
    spec_path = root / "study.json"
    if not spec_path.exists():
        raise SystemExit(f"{root}: no study.json (not a study folder)")
    spec = json.loads(spec_path.read_text())
    _, train = study.agent(spec.get("agent", "dqn"))
    all_groups = [(g, checked) for g, checked in recorded_groups(root, study.grid_runs(spec))
                  if all((study.run_dir(root, c.env_id, name, c.seed) / "metrics.csv").exists()
                         for (name, c), check in zip(g, checked, strict=True) if check)]
    if envs is not None:  # (ids as in the grid, or as the folders spell them)
        all_groups = [(g, checked) for g, checked in all_groups
                      if g[0][1].env_id in envs or g[0][1].env_id.replace("/", "-") in envs]
    if not all_groups:
        raise SystemExit(f"{root}: no lockstep group with metrics for all its runs"
                         + (f" in {envs}" if envs is not None else ""))
    chosen = list(range(len(all_groups)))
    if groups is not None and groups < len(chosen):
        chosen = sorted(np.random.default_rng(sample_seed).choice(len(chosen), size=groups, replace=False))
    runs, differences = [], []
    for gi in chosen:
        group, checked = all_groups[gi]
        configs = [c for _, c in group]
        first = configs[0]
        n = min(steps or first.eval_every, first.total_steps)
        if n < first.eval_every:
            raise SystemExit(f"--steps: {n} ends before the first evaluation (eval_every = {first.eval_every}); "
                             f"nothing would be compared")
        log(f"group {gi + 1}/{len(all_groups)}: {first.env_id} x{len(configs)}, rerunning {n:,} steps")
        rows = train(configs, None, stop_after=n)
        for (name, cfg), rerun, check in zip(group, rows, checked, strict=True):
            if not check:  # a partner retrained later in another group: checked there
                continue
            d = study.run_dir(root, cfg.env_id, name, cfg.seed)
            recorded = [r for r in _recorded(d) if int(float(r["step"])) <= n]
            mismatch = None
            for a, b in zip(rerun, recorded, strict=False):
                bad = [k for k in COMPARED if _fmt(a[k]) != b[k]]
                if bad:
                    mismatch = {"step": int(a["step"]), "fields": bad,
                                "rerun": {k: _fmt(a[k]) for k in bad}, "recorded": {k: b[k] for k in bad}}
                    break
            if mismatch is None and len(recorded) != len(rerun):
                mismatch = {"step": None, "fields": ["rows"], "rerun": len(rerun), "recorded": len(recorded)}
            entry = {"run": str(d.relative_to(root)), "status": "exact" if mismatch is None else "differs",
                     "rows": len(rerun), "first_difference": mismatch}
            if mismatch is not None:
                entry["machine"] = _machine_difference(d)
                differences += [a["eval_return"] - float(b["eval_return"])
                                for a, b in zip(rerun, recorded, strict=False)]
            runs.append(entry)
    return {"runs": runs, "differences": differences, "test": _compare(differences)}


def _compare(diffs: list[float]) -> dict[str, Any]:
    """Mean of the paired differences with a 95% t interval, and the Wilcoxon signed-rank test of a zero
    median (two-sided; needs 5 or more nonzero differences)."""
    if not diffs:
        return {}
    mean, half = study.t_interval(diffs)
    out: dict[str, Any] = {"pairs": len(diffs), "mean": mean, "ci95": half}
    nonzero = [x for x in diffs if x != 0]
    if len(nonzero) >= 5:
        from scipy import stats

        out["wilcoxon_p"] = float(stats.wilcoxon(nonzero).pvalue)
    return out


def report(result: dict[str, Any], root: Path, steps: int | None, envs: list[str] | None = None) -> str:
    runs = result["runs"]
    exact = sum(r["status"] == "exact" for r in runs)
    lines = [f"# Verification of {root.name}", "",
             f"Command: `perx study verify {root}" + (f" --steps {steps}" if steps else "")
             + (f" --envs {' '.join(envs)}" if envs else "") + "`", "",
             f"{exact} of {len(runs)} runs repeat every recorded digit of metrics.csv "
             f"({', '.join(COMPARED)}) up to the step checked.", "",
             "| run | status | rows compared | first difference | machine difference (recorded -> here) |",
             "|---|---|---|---|---|"]
    for r in runs:
        diff = r["first_difference"]
        where = "-" if diff is None else (f"step {diff['step']}: " + ", ".join(
            f"{k} {diff['recorded'][k]} -> {diff['rerun'][k]}" for k in diff["fields"])
            if diff["step"] is not None else f"{diff['recorded']} rows recorded, {diff['rerun']} rerun")
        mach = r.get("machine")
        mach_text = "-" if mach is None else ("none recorded differs" if not mach else "; ".join(
            f"{k}: {a} -> {b}" for k, a, b in ((k, *v) for k, v in mach.items()) if k != "cpu_features")
            + (" (cpu features differ)" if "cpu_features" in mach else ""))
        lines.append(f"| {r['run']} | {r['status']} | {r['rows']} | {where} | {mach_text} |")
    test = result["test"]
    if test:
        p = test.get("wilcoxon_p")
        lines += ["", f"Runs that differ: evaluation return rerun minus recorded over {test['pairs']} (run, step) "
                  f"pairs: mean {test['mean']:+.3f} ± {test['ci95']:.3f} (95% t interval)"
                  + (f", Wilcoxon signed-rank p = {p:.3f}" if p is not None else "")
                  + ". An interval that holds 0 (and a large p) is what runs from the same distribution give; "
                  "a different machine is expected to change the digits, not the distribution."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, prog: str = "perx study verify") -> int:
    parser = study.Parser(prog=prog, description="Rerun the first steps of a study's runs and "
                                     "compare them with its metrics.csv files (exit status 1 if any differ).")
    parser.add_argument("study", help="study name (results/<name>) or a folder")
    parser.add_argument("--steps", type=int, help="environment steps to rerun (default: to the first evaluation)")
    parser.add_argument("--groups", type=int, help="rerun a random sample of this many lockstep groups")
    parser.add_argument("--sample-seed", type=int, default=0, help="seed of the sample of groups")
    parser.add_argument("--envs", nargs="+", help="only the groups of these environments")
    parser.add_argument("--results", default=None, help="look for the study in this folder (default: runs/<study> "
                        "if it exists, else results/<study>)")
    parser.add_argument("--out", help="also write the report (markdown) here")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps: must be >= 1, got {args.steps}")
    if args.groups is not None and args.groups < 1:
        parser.error(f"--groups: must be >= 1, got {args.groups}")
    root = study.find_study(args.study, args.results)
    result = verify(root, args.steps, args.groups, args.sample_seed, envs=args.envs)
    text = report(result, root, args.steps, args.envs)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if all(r["status"] == "exact" for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())

