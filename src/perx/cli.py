"""The ``perx`` command: one subcommand per job, looked up in :data:`COMMANDS` and imported only when run."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

#: The registry: (command, "module:function" it runs, what it does), in the order ``perx --help`` lists them.
#: Each function takes (argv, prog=...) and returns an exit code; adding a command is its module plus one line.
#: The benchmarks are files of the repository's benchmarks/ folder, not of the installed package: their commands
#: run them from a source checkout (``pip install -e .``).
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
    ("bench", "benchmarks/bench_buffer.py:main",
     "time sample+update, add and extend against a uniform floor and peers (cpprb, tianshou)"),
    ("bench-agents", "benchmarks/bench_agents.py:main",
     "replay's cost inside the Double DQN loop per variant, and lockstep throughput"),
    ("bench-td3", "benchmarks/bench_td3_overhead.py:main",
     "TD3's run time with perx, cpprb and Tianshou buffers swapped in (004 Table 3)"),
    ("bench-loop", "benchmarks/bench_loop.py:main",
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


def resolve(target: str) -> Callable[..., int]:
    """The function a :data:`COMMANDS` target names: ``package.module:function``, or ``benchmarks/file.py:function``
    for a benchmark of the source checkout (its folder goes on ``sys.path``, so benchmarks import each other
    as they do when run as scripts, and worker processes they spawn find them)."""
    where, function = target.rsplit(":", 1)
    if not where.startswith("benchmarks/"):
        return getattr(importlib.import_module(where), function)
    folder = Path(__file__).resolve().parents[2] / "benchmarks"  # <checkout>/src/perx/cli.py
    if not (folder / Path(where).name).is_file():
        raise SystemExit(f"perx: {where} is not here: the benchmarks live in the repository, not in the installed "
                         f"package; run this command from a source checkout installed with `pip install -e .`")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return getattr(importlib.import_module(Path(where).stem), function)


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
            return resolve(target)(rest, prog=f"perx {command}")
    print(f"perx: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
