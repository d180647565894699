"""One add to an episodic buffer: the scalar one-step path against the batched path, in one run.

    python benchmarks/bench_episodic_add.py

A MinAtar-shaped step (bool obs [10, 10, 4]) into a 100k buffer with ``perx.Proportional`` and
``perx.Episodes(next_obs="shared")`` (as the DQN agent stores it), episodes of 500 steps; then a plain
buffer without episodes for the floor. Medians of 19,000 adds after 1,000, three interleaved rounds.
"""

import time

import numpy as np

import perx
from perx.episodes import EpisodeStore


def adds(episodes: bool, n: int = 20_000) -> float:
    rng = np.random.default_rng(0)
    kw = {"episodes": perx.Episodes(next_obs="shared")} if episodes else {}
    buf = perx.ReplayBuffer(100_000, perx.Proportional(alpha=0.6, eps=1e-10), **kw)
    frames = [rng.random((10, 10, 4)) < 0.1 for _ in range(64)]
    obs, times = frames[-1], []
    for i in range(n):
        nxt = frames[i % 64]
        t = time.perf_counter()
        buf.add(obs=obs, next_obs=nxt, action=1, reward=0.0, terminated=False, truncated=i % 500 == 499)
        times.append(time.perf_counter() - t)
        obs = nxt
    return 1e6 * float(np.median(times[1000:]))


def main() -> None:
    rows = {"episodic, one-step path": [], "episodic, batched path": [], "no episodes (floor)": []}
    for _ in range(3):
        for name in rows:
            EpisodeStore.one_step_path = name != "episodic, batched path"
            rows[name].append(adds(episodes=name != "no episodes (floor)"))
    EpisodeStore.one_step_path = True
    floor = np.median(rows["no episodes (floor)"])
    print("| add | median us | ratio to the floor | rounds |\n|---|---|---|---|")
    for name, ts in rows.items():
        print(f"| {name} | {np.median(ts):.1f} | {np.median(ts) / floor:.2f}x | {', '.join(f'{t:.1f}' for t in ts)} |")


if __name__ == "__main__":
    main()
