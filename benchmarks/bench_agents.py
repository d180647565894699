"""Benchmark script: the same as `perx bench-agents` (see perx/experiments/agent_bench.py).

    python benchmarks/bench_agents.py --out results/agents_bench.md
"""

import sys

from perx.experiments.agent_bench import main

if __name__ == "__main__":
    sys.exit(main(prog="python benchmarks/bench_agents.py"))
