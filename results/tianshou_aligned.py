"""perx's uniform TD3 against Tianshou's TD3 benchmark, with the two x-axes aligned (issue 41, item 1).

Tianshou's MuJoCo benchmark (v0.4.0, examples/mujoco/mujoco_td3.py) collects its 25,000 random-action steps
*before* the trainer starts, and the trainer's ``env_step``, the x-axis of its curves and of result.json, counts
from 0 after them (tianshou/trainer/offpolicy.py at v0.4.0: ``env_step, gradient_step = 0, 0`` and
``env_step += result["n/st"]`` per collect; the test return is logged at that step, and its
examples/mujoco/tools.py copies the step into result.json unchanged). perx counts every environment step, the
random ones included. So Tianshou at x has made x critic updates after 25,000 + x environment steps, and the run
of perx that has made as many updates is perx at x + 25,000. This script compares the two both ways: aligned
(perx at s against Tianshou at s - 25,000) and as docs/td3.md first did (both at s).

Tianshou's numbers (mean and standard deviation over its 10 seeds of the 10-episode test return) are those of
its repository at commit c302433, docs/_static/js/mujoco/benchmark/<env>-v3/result.json, rows "TD3", up to
300,000; ``--tianshou DIR`` re-reads them from such a folder (a local checkout) and checks they are the same.
perx's runs: results/mujoco-hc10 (10 seeds, HalfCheetah), results/mujoco (3 seeds), results/mujoco-200k (the
seeds committed so far); uniform TD3 on the v5 tasks in each.

    python results/tianshou_aligned.py > results/tianshou_aligned.md
"""
import argparse
import json
import statistics
from pathlib import Path

from scipy import stats

from perx.experiments.study import collect

OFFSET = 25_000  # Tianshou's random-start steps, outside its x-axis (start_timesteps)
ROOT = Path(__file__).resolve().parent
#: Tianshou TD3, {env: {env_step: (mean, sd over 10 seeds)}} (commit c302433, result.json; see the docstring)
TIANSHOU = {
    "HalfCheetah": {
        5000: (-491.8, 108.8), 10000: (-262.0, 291.8), 15000: (939.4, 527.7), 20000: (1252.1, 495.5),
        25000: (2023.2, 523.9), 30000: (2470.4, 572.3), 35000: (2749.4, 599.0), 40000: (3034.0, 779.7),
        45000: (3414.1, 557.2), 50000: (3891.1, 538.9), 55000: (3770.0, 880.9), 60000: (4215.1, 338.4),
        65000: (4181.9, 574.3), 70000: (4451.9, 650.4), 75000: (4715.3, 387.3), 80000: (4977.9, 332.4),
        85000: (4896.9, 437.0), 90000: (5098.3, 380.6), 95000: (5064.5, 376.1), 100000: (5335.8, 376.5),
        105000: (5467.5, 373.8), 110000: (5548.1, 376.2), 115000: (5569.3, 518.2), 120000: (5557.9, 501.5),
        125000: (5722.4, 351.7), 130000: (5758.6, 424.8), 135000: (5848.0, 496.2), 140000: (6062.8, 456.8),
        145000: (5828.4, 584.3), 150000: (6110.8, 399.8), 155000: (6158.0, 451.4), 160000: (6261.0, 455.5),
        165000: (6117.2, 576.7), 170000: (6360.7, 465.9), 175000: (6488.1, 564.2), 180000: (6485.5, 523.2),
        185000: (6511.1, 624.1), 190000: (6623.9, 606.1), 195000: (6753.4, 578.1), 200000: (6720.7, 617.2),
        205000: (6882.3, 679.7), 210000: (6880.5, 707.3), 215000: (6899.3, 623.3), 220000: (6959.4, 532.1),
        225000: (6920.9, 511.4), 230000: (7056.5, 597.4), 235000: (7163.6, 656.2), 240000: (7138.8, 625.1),
        245000: (7201.8, 736.8), 250000: (7254.6, 704.2), 255000: (7104.4, 774.2), 260000: (7358.3, 657.1),
        265000: (7387.0, 690.7), 270000: (7399.3, 627.3), 275000: (7461.2, 752.3), 280000: (7507.7, 668.2),
        285000: (7564.7, 704.8), 290000: (7651.9, 744.0), 295000: (7639.7, 683.6), 300000: (7545.8, 716.8),
    },
    "Hopper": {
        0: (47.5, 36.1), 5000: (181.2, 11.9), 10000: (195.6, 28.2), 15000: (196.3, 38.9),
        20000: (246.0, 64.8), 25000: (226.7, 45.6), 30000: (244.7, 37.5), 35000: (230.0, 31.2),
        40000: (261.7, 26.9), 45000: (329.7, 58.8), 50000: (321.4, 45.2), 55000: (403.0, 213.6),
        60000: (341.5, 98.1), 65000: (461.5, 232.9), 70000: (346.7, 94.5), 75000: (336.0, 81.5),
        80000: (391.5, 149.1), 85000: (544.4, 227.6), 90000: (710.7, 549.5), 95000: (500.1, 247.3),
        100000: (596.5, 287.8), 105000: (623.8, 327.6), 110000: (513.4, 255.1), 115000: (495.6, 212.4),
        120000: (555.7, 227.2), 125000: (718.9, 723.6), 130000: (680.9, 460.8), 135000: (520.9, 214.5),
        140000: (650.3, 461.5), 145000: (684.4, 475.1), 150000: (696.6, 409.8), 155000: (927.7, 772.3),
        160000: (625.2, 477.6), 165000: (794.8, 506.2), 170000: (1005.2, 853.9), 175000: (845.2, 627.3),
        180000: (854.2, 463.3), 185000: (882.8, 611.5), 190000: (881.5, 520.6), 195000: (936.8, 578.8),
        200000: (887.2, 649.3), 205000: (1003.2, 720.0), 210000: (1259.8, 918.6), 215000: (1218.8, 909.6),
        220000: (1454.8, 961.2), 225000: (1120.3, 742.6), 230000: (1388.7, 971.9), 235000: (1141.3, 584.6),
        240000: (1218.7, 673.0), 245000: (1227.7, 779.7), 250000: (1426.1, 883.1), 255000: (1356.3, 913.1),
        260000: (1519.8, 974.5), 265000: (1430.9, 1039.3), 270000: (1697.1, 967.8), 275000: (1505.3, 877.8),
        280000: (1616.9, 1006.5), 285000: (1595.7, 880.9), 290000: (1669.9, 788.7), 295000: (1680.3, 771.5),
        300000: (1583.4, 639.2),
    },
    "Walker2d": {
        0: (6.4, 12.8), 5000: (158.8, 149.1), 10000: (328.1, 149.4), 15000: (233.9, 69.3),
        20000: (201.1, 80.6), 25000: (225.4, 94.8), 30000: (239.6, 96.1), 35000: (269.2, 32.2),
        40000: (320.8, 73.2), 45000: (343.9, 128.5), 50000: (302.3, 90.5), 55000: (312.9, 84.1),
        60000: (352.7, 106.8), 65000: (326.8, 94.8), 70000: (330.9, 83.0), 75000: (372.7, 84.5),
        80000: (375.4, 115.8), 85000: (400.8, 161.3), 90000: (388.8, 102.2), 95000: (372.0, 93.9),
        100000: (483.2, 173.9), 105000: (434.0, 230.4), 110000: (399.9, 146.1), 115000: (429.9, 186.4),
        120000: (516.4, 239.1), 125000: (443.0, 141.9), 130000: (557.6, 265.7), 135000: (469.2, 133.6),
        140000: (524.7, 422.2), 145000: (684.3, 423.5), 150000: (734.8, 482.4), 155000: (683.6, 305.6),
        160000: (611.7, 144.1), 165000: (706.4, 360.0), 170000: (601.0, 169.8), 175000: (661.2, 281.8),
        180000: (705.4, 239.8), 185000: (794.1, 374.2), 190000: (824.0, 398.4), 195000: (699.2, 208.2),
        200000: (941.3, 365.0), 205000: (1112.0, 558.4), 210000: (841.7, 344.7), 215000: (855.6, 342.4),
        220000: (1082.3, 419.9), 225000: (996.7, 303.0), 230000: (1110.1, 637.8), 235000: (986.5, 486.8),
        240000: (1052.8, 331.3), 245000: (976.1, 312.0), 250000: (1073.2, 401.6), 255000: (1027.5, 452.9),
        260000: (1255.6, 366.9), 265000: (1134.8, 633.6), 270000: (1350.5, 514.1), 275000: (1528.3, 639.9),
        280000: (1561.4, 624.7), 285000: (1394.1, 755.5), 290000: (1487.9, 619.5), 295000: (1613.1, 429.2),
        300000: (1663.5, 444.9),
    },
}
STUDIES = [("mujoco-hc10", "HalfCheetah"), ("mujoco", "HalfCheetah"), ("mujoco", "Hopper"),
           ("mujoco-200k", "HalfCheetah"), ("mujoco-200k", "Hopper")]


def check_against(folder: Path) -> None:
    for env, curve in TIANSHOU.items():
        rows = json.loads((folder / f"{env}-v3" / "result.json").read_text())
        got = {r["env_step"]: (round(r["rew"], 1), round(r["rew_std"], 1)) for r in rows if r["Agent"] == "TD3"}
        bad = [s for s, v in curve.items() if got.get(s) != v]
        if bad:
            raise SystemExit(f"{env}: the embedded values differ from {folder} at steps {bad[:5]}")


def returns(study: str, env: str) -> dict[int, list[float]]:
    """{step: eval returns of the uniform runs, one per seed}"""
    out: dict[int, list[float]] = {}
    for rows in collect(ROOT / study).get(f"{env}-v5", {}).get("uniform", {}).values():
        for row in rows:
            out.setdefault(int(row["step"]), []).append(row["eval_return"])
    return out


def welch(values: list[float], ref: tuple[float, float]) -> tuple[float, float]:
    """Welch's t and two-sided p of perx's seeds against Tianshou's mean and sd over 10 seeds."""
    if len(values) < 2:
        return float("nan"), float("nan")
    t, p = stats.ttest_ind_from_stats(statistics.mean(values), statistics.stdev(values), len(values), *ref, 10,
                                      equal_var=False)
    return float(t), float(p)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tianshou", type=Path, help="docs/_static/js/mujoco/benchmark of a Tianshou checkout")
    args = parser.parse_args()
    if args.tianshou:
        check_against(args.tianshou)
    print("# perx's uniform TD3 against Tianshou's TD3 benchmark, x-axes aligned\n")
    print("`python results/tianshou_aligned.py > results/tianshou_aligned.md` (the script's docstring says why "
          f"and where each number comes from). Aligned: perx at step s against Tianshou at s - {OFFSET:,} (the same "
          "number of updates); unaligned: both at s. Welch t of perx's seeds against Tianshou's 10; perx at steps "
          "from 30,000 (the first evaluation after learning starts).\n")
    for study, env in STUDIES:
        runs = returns(study, env)
        ts = TIANSHOU[env]
        steps = [s for s in sorted(runs) if s >= OFFSET + 5_000 and s - OFFSET in ts]
        if not steps:
            continue
        seeds = len(runs[steps[-1]])
        print(f"## {env}: results/{study} ({seeds} seed{'s' if seeds != 1 else ''})\n")
        print("| perx step | perx mean ± sd | Tianshou at step - 25k | t, p (aligned) | Tianshou at step | "
              "t (unaligned) |")
        print("|---|---|---|---|---|---|")
        aligned_p, unaligned_p = [], []
        if steps[-1] > 100_000:  # (a long run: every 10,000 steps)
            steps = [s for s in steps if s % 10_000 == 0]
        for s in steps:
            v = runs[s]
            sd = f" ± {statistics.stdev(v):,.0f}" if len(v) > 1 else ""
            t, p = welch(v, ts[s - OFFSET])
            tu, pu = welch(v, ts[s]) if s in ts else (float("nan"), float("nan"))
            aligned_p.append(p)
            unaligned_p.append(pu)
            m, msd = ts[s - OFFSET]
            cell = f"{ts[s][0]:,.0f} ± {ts[s][1]:,.0f}" if s in ts else "-"
            tests = (f"{t:.2f}, {p:.3f}", f"{tu:.2f}") if len(v) > 1 else ("-", "-")
            print(f"| {s:,} | {statistics.mean(v):,.0f}{sd} | {m:,.0f} ± {msd:,.0f} | {tests[0]} | {cell} | "
                  f"{tests[1]} |")
        if seeds > 1:
            print(f"\nEvaluations with p < 0.05: aligned {sum(p < 0.05 for p in aligned_p)} of {len(steps)}, "
                  f"unaligned {sum(p < 0.05 for p in unaligned_p)} of {len(steps)}.")
        print()


if __name__ == "__main__":
    main()
