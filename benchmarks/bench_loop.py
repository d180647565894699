"""Benchmark script: the same as `perx bench-loop` (see perx/experiments/loop_bench.py).

    python benchmarks/bench_loop.py --out results/loop_bench.md
"""

import sys

from perx.experiments.loop_bench import main

if __name__ == "__main__":
    sys.exit(main(prog="python benchmarks/bench_loop.py"))
