"""Compressed observation rings: which codec, bytes per transition, and what sampling costs.

    python benchmarks/bench_compress.py --out results/compression.md

Needs ale-py (real Atari frames), cpprb (the peer), lz4 and zstandard (codecs compared); run it in a venv with
``pip install -e '.[bench,atari]' cpprb lz4 zstandard``.

Data. Atari: ``ALE/<Game>-v5`` with perx's DQN preprocessing (``perx.agents.envs.make_env``: 84x84 grey, frame
skip 4, sticky actions), a uniformly random policy, seed 0; --pool steps per game, the newest frame of each
step. Vectors: float32[8] random walks (each step adds N(0, 0.1) noise; an 8-float state such as LunarLander's
changes this way), 1000-step episodes.

1. Codecs, one frame (or one 32-byte vector) per block, as a replay ring stores them (any unit may be evicted or
   read alone): mean bytes per unit, and compress / decompress time per unit (median of 5 passes over the
   pool). perx's LZ4 runs compiled over the whole pool in one call (as the gather decodes inside its kernel); the
   lz4 (LZ4 block, C) and zstandard (zstd, C) packages and zlib are called once per unit from Python, as a
   Python-side codec would be.
2. Buffers, N transitions, ``Proportional(alpha=0.6)``: bytes per transition (the process's resident memory
   before and after building and filling each buffer, divided by N; perx's own ``nbytes`` beside it), and
   sample(B) + update_priorities(B) time, interleaved blocks, medians. Atari: perx Episodes(frame_stack=4)
   uncompressed and with compress="lz4", and cpprb's PrioritizedReplayBuffer with ``next_of="obs"`` and
   ``stack_compress="obs"`` (each frame stored once, cpprb's memory saving for stacks; cpprb's stacking axis is
   the last, so its observations are [84, 84, 4]). The buffers are filled by cycling through the pool's
   episodes (the pool's last step ends its episode). Vectors: perx without episodes (obs and next_obs stored),
   Episodes(next_obs="shared") with and without lz4, and cpprb with ``next_of="obs"``.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import zlib
from pathlib import Path

import numpy as np
from numba import njit

import perx
from bench_buffer import UPDATE_POOL, _fmt_time, _interleaved, _Values, cpu_model
from perx import _lz4

GAMES = ("Pong", "Breakout", "SpaceInvaders")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def atari_pool(game: str, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(frames uint8 [steps + 1, 84, 84], episode ends bool [steps]): the first frame of each episode is its
    reset frame; frame t + 1 is the newest frame after step t (a reset frame follows an ended step's final one
    in the next row only through ``starts``)."""
    from perx.agents.envs import make_env

    env = make_env(f"ALE/{game}-v5")
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    frames, ends = [obs[-1]], []
    for t in range(steps):
        obs, _, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
        ended = bool(term or trunc) or t == steps - 1
        frames.append(obs[-1])
        ends.append(ended)
        if ended and t < steps - 1:
            obs, _ = env.reset()
            frames.append(obs[-1])  # the next episode's first frame
    env.close()
    return np.stack(frames), np.array(ends)


def episodes_of(frames: np.ndarray, ends: np.ndarray) -> list[np.ndarray]:
    """Split the pool into episodes: each a frame array [steps + 1, 84, 84] (first frame .. final frame)."""
    out, start = [], 0
    for t in np.flatnonzero(ends):
        length = t + 1 - (sum(len(e) - 1 for e in out))
        out.append(frames[start : start + length + 1])
        start += length + 1
    return out


def stacks(ep: np.ndarray, k: int = 4) -> np.ndarray:
    """Stacks [len(ep), k, 84, 84] of an episode's frames, padded with its first frame (reset padding)."""
    idx = np.maximum(np.arange(len(ep))[:, None] - np.arange(k - 1, -1, -1), 0)
    return ep[idx]


# -- 1. codecs -----------------------------------------------------------------------------------------

def codec_rows(units: np.ndarray, label: str, passes: int = 5) -> list[dict]:
    import lz4.block
    import zstandard

    flat = np.ascontiguousarray(units).reshape(len(units), -1).view(np.uint8)
    n, size = flat.shape
    rows = []

    # perx's compiled LZ4 over the pool in one call
    table = np.zeros(1 << 12, np.int64)
    scratch = np.empty((n, _lz4.bound(size)), np.uint8)
    lengths = np.empty(n, np.int64)

    def perx_compress():
        stamp = 1
        for i in range(n):
            lengths[i] = _lz4.compress_into(flat[i], scratch[i], 0, table, stamp)
            stamp += size + 1

    out = np.empty_like(flat)

    def perx_decompress():
        _decode_all(scratch, lengths, out)

    perx_compress()
    perx_decompress()
    assert np.array_equal(out, flat)
    rows.append(_codec_row(label, "perx LZ4 (compiled, in-kernel)", lengths.mean(), size, perx_compress,
                           perx_decompress, n, passes))
    blocks = [lz4.block.compress(r.tobytes(), store_size=False) for r in flat]
    rows.append(_codec_row(label, "lz4 package (LZ4 block, C; a call per unit)", np.mean([len(b) for b in blocks]),
                           size, lambda: [lz4.block.compress(r.tobytes(), store_size=False) for r in flat],
                           lambda: [lz4.block.decompress(b, uncompressed_size=size) for b in blocks], n, passes))
    for level in (1, 3):
        c, d = zstandard.ZstdCompressor(level=level), zstandard.ZstdDecompressor()
        zb = [c.compress(r.tobytes()) for r in flat]
        rows.append(_codec_row(label, f"zstd level {level} (zstandard, C; a call per unit)",
                               np.mean([len(b) for b in zb]), size, lambda c=c: [c.compress(r.tobytes()) for r in flat],
                               lambda d=d, zb=zb: [d.decompress(b) for b in zb], n, passes))
    zb = [zlib.compress(r.tobytes(), 1) for r in flat]
    rows.append(_codec_row(label, "zlib level 1 (a call per unit)", np.mean([len(b) for b in zb]), size,
                           lambda: [zlib.compress(r.tobytes(), 1) for r in flat],
                           lambda: [zlib.decompress(b) for b in zb], n, passes))
    return rows


@njit(cache=False)
def _decode_all(blocks, lengths, out):
    for i in range(len(lengths)):
        _lz4.decompress_into(blocks[i], 0, lengths[i], out[i])



def _codec_row(data, codec, mean_bytes, size, compress, decompress, n, passes):
    def timed(fn):
        times = []
        for _ in range(passes):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) / n)
        return statistics.median(times)

    return {"data": data, "codec": codec, "bytes": float(mean_bytes), "ratio": size / float(mean_bytes),
            "compress": timed(compress), "decompress": timed(decompress)}


# -- 2. buffers -----------------------------------------------------------------------------------------

def _cycle(episodes, n: int):
    """(episode, steps to add from it) through the episodes, round and round, until n steps in all."""
    added = 0
    while added < n:
        for ep in episodes:
            m = min(len(ep) - 1, n - added)
            if m <= 0:
                break
            yield ep, m
            added += m


def fill_perx_atari(buf, episodes: list[np.ndarray], n: int) -> None:
    for ep, m in _cycle(episodes, n):
        s = stacks(ep)
        term = np.zeros(m, bool)
        term[-1] = m == len(ep) - 1
        trunc = np.zeros(m, bool)
        trunc[-1] = not term[-1]  # cut at n: ended as a truncation so the next fill starts fresh
        for a in range(0, m, 2000):
            b = min(m, a + 2000)
            buf.extend(obs=s[a:b], next_obs=s[a + 1 : b + 1], action=np.zeros(b - a, np.int64),
                       reward=np.zeros(b - a, np.float32), terminated=term[a:b], truncated=trunc[a:b])


def fill_cpprb_atari(buf, episodes: list[np.ndarray], n: int) -> None:
    for ep, m in _cycle(episodes, n):
        s = np.moveaxis(stacks(ep), 1, -1)  # cpprb stacks along the last axis
        done = np.zeros(m, np.float32)
        done[-1] = 1.0
        for a in range(0, m, 2000):
            b = min(m, a + 2000)
            buf.add(obs=s[a:b], next_obs=s[a + 1 : b + 1], act=np.zeros(b - a), rew=np.zeros(b - a),
                    done=done[a:b])
        buf.on_episode_end()


def vector_episodes(rng, count: int, length: int = 1000) -> list[np.ndarray]:
    return [np.cumsum(rng.normal(0, 0.1, (length + 1, 8)), axis=0).astype(np.float32) for _ in range(count)]


def fill_perx_vectors(buf, episodes, n):
    for ep, m in _cycle(episodes, n):
        end = np.zeros(m, bool)
        end[-1] = True
        buf.extend(obs=ep[:m], next_obs=ep[1 : m + 1], action=np.zeros(m, np.int64),
                   reward=np.zeros(m, np.float32), terminated=end, truncated=np.zeros(m, bool))


def fill_cpprb_vectors(buf, episodes, n):
    for ep, m in _cycle(episodes, n):
        done = np.zeros(m, np.float32)
        done[-1] = 1
        buf.add(obs=ep[:m], next_obs=ep[1 : m + 1], act=np.zeros(m), rew=np.zeros(m), done=done)
        buf.on_episode_end()


def perx_iteration(buf, b, values):
    def it():
        batch = buf.sample(b, beta=0.4)
        buf.update_priorities(batch.indices, next(values))
    return it


def cpprb_iteration(buf, b, values):
    def it():
        batch = buf.sample(b, beta=0.4)
        buf.update_priorities(batch["indexes"], next(values))
    return it


def warm_up(episodes) -> None:
    """Compile perx's kernels (and let numba's compiler take its memory) before any resident memory is counted."""
    for compress in (None, "lz4"):
        buf = perx.ReplayBuffer(300, perx.Proportional(alpha=0.6), seed=0,
                                episodes=perx.Episodes(frame_stack=4, compress=compress))
        fill_perx_atari(buf, episodes, 300)
        batch = buf.sample(32, beta=0.4)
        buf.update_priorities(batch.indices, np.ones(32))
    for episodes_cfg in (None, perx.Episodes(next_obs="shared"), perx.Episodes(next_obs="shared", compress="lz4")):
        buf = perx.ReplayBuffer(300, perx.Proportional(alpha=0.6), seed=0, episodes=episodes_cfg)
        fill_perx_vectors(buf, vector_episodes(np.random.default_rng(0), 1), 300)
        batch = buf.sample(32, beta=0.4)
        buf.update_priorities(batch.indices, np.ones(32))


def buffer_rows(group, n, builders, batch_sizes, blocks, calls, log) -> list[dict]:
    bufs, memory = {}, {}
    for name, (build, fill) in builders.items():
        gc.collect()
        before = rss()
        start = time.perf_counter()
        buf = build()
        fill(buf)
        seconds = time.perf_counter() - start
        memory[name] = ((rss() - before) / n, (buf.nbytes - buf.sampler.nbytes) / n
                        if isinstance(buf, perx.ReplayBuffer) else None, seconds)
        bufs[name] = buf
        log(f"  built {name}: {memory[name][0]:,.0f} B/transition (resident), fill {seconds:.1f} s")
    pool = np.random.default_rng(2).random((UPDATE_POOL, max(batch_sizes)))
    rows = []
    for b in batch_sizes:
        fns = {}
        for name, buf in bufs.items():
            values = _Values(pool)[b]
            fns[name] = (perx_iteration if isinstance(buf, perx.ReplayBuffer) else cpprb_iteration)(buf, b, values)
        cells = _interleaved(fns, blocks, calls if b <= 64 else max(10, calls // 4))
        ref = cells[next(iter(bufs))].median
        for name in bufs:
            rss_b, own_b, seconds = memory[name]
            rows.append({"group": group, "layout": name, "N": n, "B": b, "time": cells[name].median,
                         "ratio": cells[name].median / ref, "rss": rss_b, "own": own_b, "fill": seconds})
            log("  " + format_buffer_row(rows[-1]))
    bufs.clear()
    gc.collect()
    return rows


def format_buffer_row(r: dict) -> str:
    own = "-" if r["own"] is None else f"{r['own']:,.0f}"
    return (f"| {r['group']} | {r['layout']} | {r['N']:,} | {r['B']} | {_fmt_time(r['time'])} | {r['ratio']:.2f}x | "
            f"{r['rss']:,.0f} | {own} | {r['fill']:.1f} s |")


def format_codec_row(r: dict) -> str:
    return (f"| {r['data']} | {r['codec']} | {r['bytes']:,.0f} | {r['ratio']:.1f}x | {r['compress'] * 1e6:.2f} | "
            f"{r['decompress'] * 1e6:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pool", type=int, default=3000, help="steps of play per game (default 3000)")
    parser.add_argument("--atari-n", type=int, default=100_000, help="N of the Atari buffers (default 100,000)")
    parser.add_argument("--vector-n", type=int, default=1_000_000, help="N of the vector buffers (default 1e6)")
    parser.add_argument("--buffer-game", default="Breakout", help="the game whose frames fill the buffers")
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import cpprb

    log = lambda s: print(s, flush=True)  # noqa: E731
    load_before = os.getloadavg()
    pools = {}
    codec = []
    for game in GAMES:
        frames, ends = atari_pool(game, args.pool)
        pools[game] = (frames, ends)
        codec += codec_rows(frames, f"{game} frame uint8[84, 84]")
        for r in codec[-5:]:
            log(format_codec_row(r))
    vectors = vector_episodes(np.random.default_rng(0), 3)
    codec += codec_rows(np.concatenate(vectors)[: args.pool], "float32[8] vector")
    for r in codec[-5:]:
        log(format_codec_row(r))

    episodes = episodes_of(*pools[args.buffer_game])
    warm_up(episodes)
    n = args.atari_n
    env_atari = {"obs": {"shape": (84, 84, 4), "dtype": np.uint8}, "act": {}, "rew": {}, "done": {}}

    def perx_atari(compress):
        return lambda: perx.ReplayBuffer(n, perx.Proportional(alpha=0.6), seed=0,
                                         episodes=perx.Episodes(frame_stack=4, compress=compress))

    builders = {
        "perx Episodes(frame_stack=4)": (perx_atari(None), lambda b: fill_perx_atari(b, episodes, n)),
        "perx Episodes(frame_stack=4, compress='lz4')": (perx_atari("lz4"), lambda b: fill_perx_atari(b, episodes, n)),
        "cpprb next_of + stack_compress": (
            lambda: cpprb.PrioritizedReplayBuffer(n, env_atari, alpha=0.6, next_of="obs", stack_compress="obs"),
            lambda b: fill_cpprb_atari(b, episodes, n)),
    }
    rows = buffer_rows(f"{args.buffer_game} frames, stacks of 4", n, builders, (32, 256), args.blocks, args.calls,
                       log)
    nv = args.vector_n
    vec_eps = vector_episodes(np.random.default_rng(1), 50)
    env_vec = {"obs": {"shape": (8,), "dtype": np.float32}, "act": {}, "rew": {}, "done": {}}

    def perx_vec(episodes):
        return lambda: perx.ReplayBuffer(nv, perx.Proportional(alpha=0.6), seed=0, episodes=episodes)

    builders = {
        "perx, obs and next_obs stored (no episodes)": (perx_vec(None), lambda b: fill_perx_vectors(b, vec_eps, nv)),
        "perx Episodes(next_obs='shared')": (perx_vec(perx.Episodes(next_obs="shared")),
                                             lambda b: fill_perx_vectors(b, vec_eps, nv)),
        "perx Episodes(next_obs='shared', compress='lz4')": (
            perx_vec(perx.Episodes(next_obs="shared", compress="lz4")), lambda b: fill_perx_vectors(b, vec_eps, nv)),
        "cpprb next_of": (lambda: cpprb.PrioritizedReplayBuffer(nv, env_vec, alpha=0.6, next_of="obs"),
                          lambda b: fill_cpprb_vectors(b, vec_eps, nv)),
    }
    rows += buffer_rows("float32[8] vectors", nv, builders, (32, 256), args.blocks, args.calls, log)
    load_after = os.getloadavg()
    from importlib.metadata import version

    text = render(args, codec, rows, load_before, load_after, version("cpprb"))
    if args.out:
        args.out.write_text(text)
    print(text)


def render(args, codec, rows, load_before, load_after, cpprb_version) -> str:
    import lz4
    import zstandard

    command = "python benchmarks/bench_compress.py " + " ".join(sys.argv[1:])
    lines = ["# Compressed observation rings", "", f"Command: `{command}`", "",
             f"Machine: {platform.machine()} ({cpu_model()}), {os.cpu_count()} CPUs, Python "
             f"{platform.python_version()}, numpy {np.__version__}, perx {perx.__version__}, cpprb {cpprb_version}, "
             f"lz4 {lz4.__version__}, zstandard {zstandard.__version__}. Load average (1/5/15 min) before: "
             + "/".join(f"{x:.2f}" for x in load_before) + ", after: " + "/".join(f"{x:.2f}" for x in load_after)
             + ".", "",
             "What each part measures is in the benchmark's docstring (benchmarks/bench_compress.py).", "",
             "## Codecs: one unit per block", "",
             f"{args.pool} steps of random play per game. Time per unit, median of 5 passes.", "",
             "| data | codec | bytes per unit | ratio | compress µs | decompress µs |", "|---|---|---|---|---|---|"]
    lines += [format_codec_row(r) for r in codec]
    lines += ["", "## Buffers: bytes per transition and sample+update", "",
              "`Proportional(alpha=0.6)`, beta 0.4; ratio = time / the first layout of its group, same run, "
              "interleaved blocks, medians. Bytes per transition: resident memory added by building and filling the "
              "buffer / N (pages the process touched; the sampler's trees included), and perx's own count "
              "(`nbytes` less the sampler's). Fill: seconds to build and fill.", "",
              "| data | layout | N | B | sample+update | ratio | bytes/transition (resident) | bytes/transition "
              "(perx nbytes) | fill |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [format_buffer_row(r) for r in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
