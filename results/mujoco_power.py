"""What a paired comparison of the mujoco-200k study can detect: per task and variant against uniform, the paired
differences of final scores (seed by seed, scaled by uniform's mean), their tests, and the smallest true mean
difference a two-sided paired t test at 0.05 would detect with 80% power given the observed spread (noncentral t;
the spread itself is estimated from the same few pairs, so this is a rough scale, not a guarantee). Beside it,
004 Table 1's gain of each variant over TD3 at the paper's horizon.

    python results/mujoco_power.py results/mujoco-200k/final.csv > results/mujoco-200k/power.md
"""

from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict

from scipy import stats

# 004 Table 1 (TD3 column, then TD3 + PER, LAP, PAL): average of the last 10 evaluations, 10 trials
TABLE_1 = {"HalfCheetah-v5": {"uniform": 13570.9, "per": 13927.8, "lap": 14836.5, "pal": 15012.2},
           "Hopper-v5": {"uniform": 3393.2, "per": 3275.5, "lap": 3246.9, "pal": 3129.1}}


def detectable(sd: float, n: int, power: float = 0.8, alpha: float = 0.05) -> float:
    """The true mean difference a two-sided one-sample t test on n pairs with spread sd detects with ``power``."""
    crit = stats.t.ppf(1 - alpha / 2, n - 1)

    def reach(nc: float) -> float:
        p = stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc)
        return 1.0 if math.isnan(p) else float(p)  # scipy's nct gives nan far in the tail, where power is 1

    lo, hi = 0.0, 40.0
    for _ in range(80):  # power grows with the noncentrality: bisect
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if reach(mid) < power else (lo, mid)
    return hi * sd / math.sqrt(n)


def main(path: str) -> None:
    scores: dict = defaultdict(dict)
    with open(path) as f:
        for r in csv.DictReader(f):
            scores[r["env"], r["variant"]][int(r["seed"])] = float(r["final_score"])
    envs = sorted({e for e, _ in scores})
    print(f"# Paired comparisons against uniform and what they can detect ({path})\n")
    print("Command: `python results/mujoco_power.py results/mujoco-200k/final.csv > results/mujoco-200k/power.md`."
          " Differences per seed, (x - u) / mean u; paired t and Wilcoxon signed-rank p (two-sided, raw); "
          "detectable: the true mean difference a paired t test at 0.05 finds with 80% power at the observed spread "
          "(noncentral t). 004's gain: Table 1, over TD3 at the end of the paper's runs (3M steps), 10 seeds.\n")
    print("| env | variant | pairs | mean difference | sd of differences | paired t p | Wilcoxon p | detectable "
          "(80% power) | 004 Table 1 gain |")
    print("|---|---|---|---|---|---|---|---|---|")
    for env in envs:
        u = scores[env, "uniform"]
        scale = abs(sum(u.values()) / len(u))
        for v in ("per", "lap", "pal"):
            x = scores.get((env, v), {})
            common = sorted(set(x) & set(u))
            n = len(common)
            if n < 3:
                continue
            d = [(x[k] - u[k]) / scale for k in common]
            mean = sum(d) / n
            sd = math.sqrt(sum((q - mean) ** 2 for q in d) / (n - 1))
            t_p = float(stats.ttest_1samp(d, 0.0).pvalue)
            w_p = float(stats.wilcoxon(d).pvalue) if any(d) else 1.0
            ref = TABLE_1.get(env)
            paper = f"{100 * (ref[v] - ref['uniform']) / ref['uniform']:+.1f}%" if ref else "-"
            print(f"| {env} | {v} | {n} | {100 * mean:+.1f}% | {100 * sd:.1f}% | {t_p:.3f} | {w_p:.3f} | "
                  f"{100 * detectable(sd, n):.0f}% | {paper} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/mujoco-200k/final.csv")
