"""Benchmark script: the same as `perx bench-td3` (see perx/experiments/td3_overhead.py).

    python benchmarks/bench_td3_overhead.py --out results/td3_overhead.md
"""

import sys

from perx.experiments.td3_overhead import main

if __name__ == "__main__":
    sys.exit(main(prog="python benchmarks/bench_td3_overhead.py"))
