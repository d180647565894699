"""Benchmark script: the same as `perx bench` (see perx/bench.py for what is timed and how).

    python benchmarks/bench_buffer.py --out results/bench.md
"""

import sys

from perx.bench import main

if __name__ == "__main__":
    sys.exit(main())
