"""Forward and forward+backward times of the lockstep networks (perx.agents.stacked), one torch thread.

    python benchmarks/bench_stacked_nets.py
    PYTHONPATH=<other checkout>/src python benchmarks/bench_stacked_nets.py   # another version, to compare

The MinAtar network for 15 runs on a channels-last (HWC) input as the DQN agent builds it: observations of
Breakout and SpaceInvaders under random play (8% of their values are ones: the convolution scatters them),
and a dense input of the same shape (the convolution unfolds it); the Nature CNN (Atari, 84x84x4) for 1 and
4 runs; batch 32; medians of 10 calls after 2.
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


def observations(game: str, n: int) -> torch.Tensor:
    """n observations of a MinAtar game under random play, as the DQN agent feeds them: [n, C, 10, 10]
    float32, channels-last in memory."""
    from perx.agents.envs import make_env, network_input

    env = make_env(f"MinAtar/{game}-v0")
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    frames = []
    while len(frames) < n:
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if rng.random() < 0.2:
            frames.append(obs)
        if terminated or truncated:
            obs, _ = env.reset()
    return torch.from_numpy(network_input(np.stack(frames), f"MinAtar/{game}-v0"))


def main() -> None:
    torch.set_num_threads(1)
    cases = []
    for game in ("Breakout", "SpaceInvaders"):
        x = observations(game, 15 * 32)
        cases.append((f"MinAtar net, {game}", 15, lambda c=x.shape[1]: stacked.minatar_net(c, 6),
                      x.view(15, 32, *x.shape[1:])))
    dense = torch.rand(15, 32, 10, 10, 4).permute(0, 1, 4, 2, 3)
    cases.append(("MinAtar net, dense input", 15, lambda: stacked.minatar_net(4, 6), dense))
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
