"""The ``perx`` command: one subcommand per job (``perx bench``; more with later studies)."""

from __future__ import annotations

import os
import sys

#: (command, what it does), in the order ``perx --help`` lists them.
COMMANDS = (
    ("cliffwalk", "the Blind Cliffwalk study of PER Figures 1 and 2 (updates to convergence vs memory size)"),
    ("dqn", "train Double DQN with uniform, PER, rank, LAP, PAL or hybrid replay (one run, or seeds in lockstep)"),
    ("td3", "train TD3 with uniform, PER, LAP or PAL replay on MuJoCo (one run, or seeds in lockstep)"),
    ("study", "run or resume a grid of DQN or TD3 runs (envs x variants x seeds), then plot it; study verify"),
    ("plot", "learning curves and the table of 004 Table 2 for a study"),
    ("bench", "time sample+update, add and extend against a uniform floor and peers (cpprb, tianshou)"),
    ("bench-agents", "replay's cost inside the Double DQN loop per variant, and lockstep throughput"),
    ("bench-td3", "TD3's run time with perx, cpprb and Tianshou buffers swapped in (004 Table 3)"),
    ("bench-loop", "the buffer's time per step inside a TD3-style loop (fake env, real networks; CUDA if present)"),
    ("supervised", "prioritized supervised learning on class-imbalanced digits (PER Sec. 6, Figure 5)"),
    ("variants", "the priority variants of PER Appendix A on the linear Blind Cliffwalk"),
    ("rank-tv", "total-variation distance of heap-mode rank-based sampling from the power law"),
    ("apex", "Ape-X Double DQN on Ray: actors, a sharded prioritized replay, one learner (perx[ray])"),
    ("theory", "check the loss/sampling equivalence (Fujimoto et al. 2020) exactly; plot the losses"),
)
_WIDTH = max(len(name) for name, _ in COMMANDS) + 2
USAGE = ("usage: perx <command> [options]\n\ncommands:\n"
         + "\n".join(f"  {name.ljust(_WIDTH)}{text}" for name, text in COMMANDS)
         + "\n\nRun `perx <command> --help` for a command's options. Outputs go to runs/ (which git ignores) "
           "unless --out says otherwise.")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:  # `perx --help | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout at exit: into the void, not the pipe
        return 0


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "bench":
        from perx.bench import main as bench_main

        return bench_main(rest, prog="perx bench")
    if command == "cliffwalk":
        from perx.experiments.cliffwalk import main as cliffwalk_main

        return cliffwalk_main(rest, prog="perx cliffwalk")
    if command == "bench-td3":
        from perx.experiments.td3_overhead import main as td3_overhead_main

        return td3_overhead_main(rest, prog="perx bench-td3")
    if command == "bench-loop":
        from perx.experiments.loop_bench import main as loop_bench_main

        return loop_bench_main(rest, prog="perx bench-loop")
    if command == "bench-agents":
        from perx.experiments.agent_bench import main as agent_bench_main

        return agent_bench_main(rest, prog="perx bench-agents")
    if command in ("dqn", "td3", "study", "plot"):
        from perx.experiments import study

        run = {"dqn": study.dqn_main, "td3": study.td3_main, "study": study.study_main,
               "plot": study.plot_main}[command]
        return run(rest, prog=f"perx {command}")
    if command == "supervised":
        from perx.experiments.supervised import main as supervised_main

        return supervised_main(rest, prog="perx supervised")
    if command == "variants":
        from perx.experiments.variants import main as variants_main

        return variants_main(rest, prog="perx variants")
    if command == "rank-tv":
        from perx.experiments.rank_tv import main as rank_tv_main

        return rank_tv_main(rest, prog="perx rank-tv")
    if command == "apex":
        from perx.experiments.apex import main as apex_main

        return apex_main(rest, prog="perx apex")
    if command == "theory":
        from perx.experiments.theory import main as theory_main

        return theory_main(rest, prog="perx theory")
    print(f"perx: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
