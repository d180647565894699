"""Forward and forward+backward times of the lockstep networks (perx.agents.stacked), one torch thread.

    python benchmarks/bench_stacked_nets.py
    PYTHONPATH=<other checkout>/src python benchmarks/bench_stacked_nets.py   # another version, to compare

The MinAtar network for 15 runs on a channels-last (HWC) input as the DQN agent builds it, and the Nature
CNN (Atari, 84x84x4) for 1 and 4 runs; batch 32; medians of 10 calls after 2.
"""

import time

import numpy as np
import torch

from perx.agents import stacked


def median_ms(f, n: int = 10) -> float:
    for _ in range(2):
        f()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def main() -> None:
    torch.set_num_threads(1)
    cases = [("MinAtar net", 15, lambda: stacked.minatar_net(4, 6),
              (torch.rand(15, 32, 10, 10, 4) < 0.1).float().permute(0, 1, 4, 2, 3))]
    for runs in (1, 4):
        cases.append(("Nature CNN", runs, lambda: stacked.nature_cnn(4, 6), torch.rand(runs, 32, 4, 84, 84)))
    print("| network | runs | forward ms | forward+backward ms |\n|---|---|---|---|")
    for name, runs, make, x in cases:
        net = stacked.StackedNet(make, list(range(runs)))

        def both(net=net, x=x):
            net.zero_grad(set_to_none=True)
            net(x).sum().backward()

        with torch.no_grad():
            forward = median_ms(lambda net=net, x=x: net(x))
        print(f"| {name} | {runs} | {forward:.2f} | {median_ms(both):.2f} |")


if __name__ == "__main__":
    main()
