"""The ``perx`` command: one subcommand per job, looked up in :data:`COMMANDS` and imported only when run."""

from __future__ import annotations

import importlib
import os
import sys

#: The registry: (command, "module:function" it runs, what it does), in the order ``perx --help`` lists them.
#: Each function takes (argv, prog=...) and returns an exit code; adding a command is its module plus one line.
COMMANDS = (
    ("cliffwalk", "perx.experiments.cliffwalk:main",
     "the Blind Cliffwalk study of PER Figures 1 and 2 (updates to convergence vs memory size)"),
    ("dqn", "perx.experiments.study:dqn_main",
     "train Double DQN with uniform, PER, rank, LAP, PAL or hybrid replay (one run, or seeds in lockstep)"),
    ("td3", "perx.experiments.study:td3_main",
     "train TD3 with uniform, PER, LAP or PAL replay on MuJoCo (one run, or seeds in lockstep)"),
    ("study", "perx.experiments.study:study_main",
     "run or resume a grid of DQN or TD3 runs (envs x variants x seeds), then plot it; study verify"),
    ("plot", "perx.experiments.study:plot_main", "learning curves and the table of 004 Table 2 for a study"),
    ("bench", "perx.bench:main",
     "time sample+update, add and extend against a uniform floor and peers (cpprb, tianshou)"),
    ("bench-agents", "perx.experiments.agent_bench:main",
     "replay's cost inside the Double DQN loop per variant, and lockstep throughput"),
    ("bench-td3", "perx.experiments.td3_overhead:main",
     "TD3's run time with perx, cpprb and Tianshou buffers swapped in (004 Table 3)"),
    ("bench-loop", "perx.experiments.loop_bench:main",
     "the buffer's time per step inside a TD3-style loop (fake env, real networks; CUDA if present)"),
    ("supervised", "perx.experiments.supervised:main",
     "prioritized supervised learning on class-imbalanced digits (PER Sec. 6, Figure 5)"),
    ("variants", "perx.experiments.variants:main",
     "the priority variants of PER Appendix A on the linear Blind Cliffwalk"),
    ("rank-tv", "perx.experiments.rank_tv:main",
     "total-variation distance of heap-mode rank-based sampling from the power law"),
    ("apex", "perx.experiments.apex:main",
     "Ape-X Double DQN on Ray: actors, a sharded prioritized replay, one learner (perx[ray])"),
    ("theory", "perx.experiments.theory:main",
     "check the loss/sampling equivalence (Fujimoto et al. 2020) exactly; plot the losses"),
)
_WIDTH = max(len(name) for name, _, _ in COMMANDS) + 2
USAGE = ("usage: perx <command> [options]\n\ncommands:\n"
         + "\n".join(f"  {name.ljust(_WIDTH)}{text}" for name, _, text in COMMANDS)
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
    for name, target, _ in COMMANDS:
        if name == command:
            module, function = target.split(":")
            return getattr(importlib.import_module(module), function)(rest, prog=f"perx {command}")
    print(f"perx: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
