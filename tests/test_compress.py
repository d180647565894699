"""Compressed observation rings (``perx.Episodes(compress="lz4")``, issue 40 item 3).

The codec is checked against the ``lz4`` package in both directions (its blocks decode here, ours decode there),
and the compressed buffer against the uncompressed one (itself checked against brute force in test_episodes)
and against the brute-force reference directly: same batches, same windows, after wrap-around, arena growth,
save and load. Damaged blocks are refused when a file is loaded, naming the member.
"""

import numpy as np
import pytest

import perx
from perx import _lz4
from perx.episodes import Episodes
from tests.test_episodes import World, check_all, feed

lz4_block = pytest.importorskip("lz4.block")


def _compress(data: np.ndarray) -> np.ndarray:
    table = np.zeros(1 << 12, np.int64)
    out = np.empty(_lz4.bound(len(data)), np.uint8)
    return out[: _lz4.compress_into(data, out, 0, table, 1)]


def _inputs():
    rng = np.random.default_rng(0)
    cases = [np.zeros(0, np.uint8), np.zeros(12, np.uint8), np.zeros(13, np.uint8), np.zeros(7056, np.uint8),
             rng.integers(0, 256, 7056).astype(np.uint8),  # incompressible
             rng.integers(0, 3, 5000).astype(np.uint8),  # short matches
             np.repeat(rng.integers(0, 256, 300), 25).astype(np.uint8),  # runs (literal and match lengths > 15 + 255)
             np.tile(rng.integers(0, 256, 70_000), 2).astype(np.uint8),  # a repeat beyond the 65535-byte window
             rng.standard_normal(8).astype(np.float32).view(np.uint8)]
    for off in range(1, 21):  # every short back-reference distance, with matches that end near the row's end
        for n in (off * 30, off * 30 + 7, 700 + off):
            cases.append(np.tile(rng.integers(0, 256, off), n // off + 1)[:n].astype(np.uint8))
            cases.append(np.concatenate([rng.integers(0, 256, 9), np.tile(rng.integers(0, 256, off), n)[:n],
                                         rng.integers(0, 256, 11)]).astype(np.uint8))
    for n in range(40):  # every length around the format's end rules (12 and 5 bytes)
        cases.append(rng.integers(0, 2, n).astype(np.uint8))
        cases.append(np.tile(rng.integers(0, 256, 3), 20)[:n].astype(np.uint8))
    return cases


def test_blocks_round_trip_and_agree_with_the_lz4_package():
    for data in _inputs():
        ours = _compress(data)
        assert len(ours) <= _lz4.bound(len(data))
        assert lz4_block.decompress(ours.tobytes(), uncompressed_size=len(data)) == data.tobytes()
        theirs = np.frombuffer(lz4_block.compress(data.tobytes(), store_size=False), np.uint8)
        for block in (ours, theirs):
            out = np.full(len(data) + 64, 0xAB, np.uint8)  # a row exactly the unit's size, guarded behind it
            assert _lz4.decompress_into(block, 0, len(block), out[: len(data)]) == len(data)
            np.testing.assert_array_equal(out[: len(data)], data)
            assert (out[len(data):] == 0xAB).all()


def test_the_decoder_refuses_truncated_and_damaged_blocks_without_leaving_its_row():
    rng = np.random.default_rng(1)
    data = np.repeat(rng.integers(0, 4, 600), 7).astype(np.uint8)
    block = _compress(data)
    guard = 4096
    for cut in range(len(block)):  # every truncation: malformed or short, never the whole unit
        out = np.zeros(len(data) + guard, np.uint8)
        written = _lz4.decompress_into(block, 0, cut, out[: len(data)])
        assert written != len(data)
        assert not out[len(data):].any()
    damaged_seen = 0
    for _ in range(2000):  # random byte changes: refused, or decoded to something, but always inside the row
        bad = block.copy()
        bad[rng.integers(len(bad))] = rng.integers(256)
        out = np.zeros(len(data) + guard, np.uint8)
        written = _lz4.decompress_into(bad, 0, len(bad), out[: len(data)])
        assert -1 <= written <= len(data)
        assert not out[len(data):].any()
        damaged_seen += written != len(data) or not np.array_equal(out[: len(data)], data)
    assert damaged_seen > 1000
    # a back-reference before the start of the output
    assert _lz4.decompress_into(np.array([0x04, 0x01, 0x00, 0x00], np.uint8), 0, 4, np.zeros(8, np.uint8)) == -1


SHARED = [dict(n_step=1, next_obs="shared"), dict(n_step=4, next_obs="shared"), dict(n_step=3, frame_stack=4),
          dict(n_step=1, frame_stack=2, frame_padding="zero"), dict(n_step=5, frame_stack=3, frame_padding="zero")]


@pytest.mark.parametrize("layout", SHARED, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
@pytest.mark.parametrize("streams", [1, 3])
def test_a_compressed_ring_matches_brute_force(layout, streams):
    rng = np.random.default_rng(streams)
    frames = layout.get("frame_stack")
    margin = {"frame_margin": (frames - 1) * 2 * streams} if frames else {}
    cfg = Episodes(gamma=0.9, streams=streams, compress="lz4", **layout, **margin)
    buf = perx.ReplayBuffer(int(rng.choice([7, 20, 64])), perx.Uniform(), seed=0, episodes=cfg)
    world = World(rng, streams, cfg.frame_stack, cfg.frame_padding)
    for total in (5, 30, 90, 200):
        feed(buf, world, rng, total, rounds=bool(frames))
        check_all(buf, world, cfg.n_step, 0.9)


def _frames(rng, count, k):
    """Mostly-dark 24x24 uint8 frames with a few bright pixels (compressible, like an Atari screen)."""
    out = np.zeros((count, 24, 24), np.uint8)
    for f in out:
        f[rng.integers(0, 24, 6), rng.integers(0, 24, 6)] = rng.integers(1, 256, 6)
    return out


def _twins(rng, capacity, streams, k, steps, batch_rows):
    """An uncompressed and a compressed buffer fed the same frame-stack steps (``batch_rows`` steps per extend)."""
    bufs = [perx.ReplayBuffer(capacity, perx.Proportional(), seed=3,
                              episodes=Episodes(n_step=3, streams=streams, frame_stack=k, compress=c,
                                                frame_margin=(k - 1) * streams * 2))
            for c in (None, "lz4")]
    stacks = [np.repeat(_frames(rng, 1, k), k, axis=0) for _ in range(streams)]
    pending: list = []
    for _ in range(steps):
        for e in range(streams):
            new = _frames(rng, 1, k)
            nxt = np.concatenate([stacks[e][1:], new])
            end = rng.random() < 0.03
            pending.append(dict(obs=stacks[e], next_obs=nxt, reward=float(rng.random()), terminated=end,
                                truncated=False, stream=e))
            stacks[e] = np.repeat(_frames(rng, 1, k), k, axis=0) if end else nxt
        if len(pending) >= batch_rows:
            fields = {key: np.array([p[key] for p in pending]) for key in pending[0]}
            stream = fields.pop("stream")
            for buf in bufs:
                buf.extend(stream=stream, **fields)
            pending = []
    return bufs


@pytest.mark.parametrize("batch_rows", [1, 4, 150])  # 150 rows: more than the ring holds in one extend
def test_the_arena_grows_and_wraps_and_samples_stay_exact(batch_rows, monkeypatch):
    monkeypatch.setattr(_lz4, "INITIAL", 256)  # grow many times
    rng = np.random.default_rng(batch_rows)
    plain, packed = _twins(rng, capacity=60, streams=2, k=4, steps=300, batch_rows=batch_rows)
    assert packed.episodes.compress == "lz4"
    live = np.arange(max(0, plain.next_index - plain.capacity), plain.next_index)
    a, b = plain.get(live), packed.get(live)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    for _ in range(3):
        x, y = plain.sample(32), packed.sample(32)
        np.testing.assert_array_equal(x.indices, y.indices)
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    ring = packed._episodes.packed
    live_bytes = ring.live_bytes(packed.next_index)
    assert ring.arena.nbytes <= 1.5 * live_bytes + 4 * _lz4.bound(ring.unit) + 1024


def test_a_compressed_buffer_saves_loads_and_carries_on(tmp_path):
    rng = np.random.default_rng(7)
    _, packed = _twins(rng, capacity=50, streams=2, k=3, steps=80, batch_rows=2)
    packed.save(tmp_path / "c.npz")
    twin = perx.ReplayBuffer.load(tmp_path / "c.npz")
    assert twin.episodes.config() == packed.episodes.config()
    for _ in range(3):
        x, y = packed.sample(16), twin.sample(16)
        np.testing.assert_array_equal(x.indices, y.indices)
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    # the file holds the compressed blocks, not the frames
    from tests.test_hardening import members

    _, arrays = members(tmp_path / "c.npz")
    frames = arrays["episodes/units_lz4_lengths"]
    assert len(frames) == min(packed.next_index, packed._episodes.ring) and "episodes/units" not in arrays
    assert arrays["episodes/units_lz4"].nbytes < 0.5 * len(frames) * 24 * 24


def test_damaged_blocks_in_a_file_are_refused_naming_it(tmp_path):
    from tests.test_episodes import _crafted
    from tests.test_hardening import members

    rng = np.random.default_rng(8)
    _, packed = _twins(rng, capacity=30, streams=1, k=2, steps=40, batch_rows=1)
    path = tmp_path / "ok.npz"
    packed.save(path)
    _, arrays = members(path)
    blocks, lengths = arrays["episodes/units_lz4"], arrays["episodes/units_lz4_lengths"]
    # a flipped bit on disk: the file's checksums catch it, as for any member
    raw = bytearray(path.read_bytes())
    at = bytes(raw).find(blocks.tobytes())
    assert at > 0
    raw[at + len(blocks) // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="truncated or corrupted"):
        perx.ReplayBuffer.load(path)
    # a crafted file (checksums right): a block that does not decode to one unit
    bad = blocks.copy()
    bad[: lengths[0]] = 0xFF  # a literal run longer than the block
    crafted = _crafted(tmp_path, packed, episodes__units_lz4=bad)
    with pytest.raises(ValueError, match="units_lz4: block 0") as info:
        perx.ReplayBuffer.load(crafted)
    assert str(crafted) in str(info.value)
    wrong = lengths.copy()
    wrong[0] += 1
    crafted = _crafted(tmp_path, packed, episodes__units_lz4_lengths=wrong)
    with pytest.raises(ValueError, match="units_lz4_lengths"):
        perx.ReplayBuffer.load(crafted)


def test_compression_is_refused_where_it_does_not_apply(tmp_path):
    with pytest.raises(ValueError, match=r"compress.*next_obs='stored'"):
        Episodes(compress="lz4")
    with pytest.raises(ValueError, match="compress"):
        Episodes(next_obs="shared", compress="zip")
    with pytest.raises(ValueError, match="memmap"):
        perx.ReplayBuffer(10, memmap=tmp_path / "m", episodes=Episodes(frame_stack=2, compress="lz4"))
    assert not (tmp_path / "m").exists()
    with pytest.raises(ValueError, match="compress: dict observations"):
        perx.ReplayBuffer(10, episodes=Episodes(next_obs="shared", compress="lz4"),
                          spec={"obs": {"a": ((2,), np.float32)}, "next_obs": {"a": ((2,), np.float32)},
                                "reward": ((), np.float32), "terminated": ((), bool), "truncated": ((), bool)})


def _decoded(ring: _lz4.PackedUnits, i: int) -> np.ndarray:
    out = np.empty((1, ring.unit), np.uint8)
    _lz4.unpack_row(out, 0, ring.arena, ring.offs[i % ring.ring], ring.lens[i % ring.ring])
    return out[0]


def test_a_block_outside_the_arena_is_refused_not_read():
    """Offsets of a grown arena read against the old one (a buffer shared by threads without lock=True): the
    decoder must not read past the arena's end."""
    unit = np.arange(64, dtype=np.uint8)
    ring = _lz4.PackedUnits(4, (64,), np.dtype(np.uint8))
    ring.put(np.array([0], np.int64), unit[None])
    off, length = int(ring.offs[0]), int(ring.lens[0])
    np.testing.assert_array_equal(_decoded(ring, 0), unit)
    out = np.empty((1, 64), np.uint8)
    stale = ring.arena[: off + length - 1]  # the block's last byte lies beyond this arena
    with pytest.raises(ValueError, match="does not decode to one unit"):
        _lz4.unpack_row(out, 0, stale, off, length)
    with pytest.raises(ValueError, match="does not decode to one unit"):
        _lz4.unpack_row(out, 0, ring.arena, -1, length)


@pytest.mark.parametrize("seed", range(20))
def test_every_live_unit_survives_random_batches_growth_gaps_and_restores(seed, monkeypatch):
    """Batches of any size (larger than the ring too: skipped ids), a tiny arena that wraps and grows, and
    save/restore round trips: every unit still in the ring decodes to what was put."""
    monkeypatch.setattr(_lz4, "INITIAL", 64)
    rng = np.random.default_rng(seed)
    ring_size, unit = int(rng.integers(2, 30)), int(rng.integers(13, 60))
    ring = _lz4.PackedUnits(ring_size, (unit,), np.dtype(np.uint8))
    reference: dict[int, np.ndarray] = {}
    next_id = 0
    for _ in range(40):
        if next_id and rng.random() < 0.1:
            ids = np.arange(max(0, next_id - ring_size), next_id)
            blocks, lengths = ring.blocks(ids)
            ring = _lz4.PackedUnits(ring_size, (unit,), np.dtype(np.uint8))
            ring.restore(ids, blocks, lengths, "units_lz4")
        rows = int(rng.integers(1, 3 * ring_size))
        values = np.zeros((rows, unit), np.uint8)
        for v in values:  # incompressible, blank, or a random head: blocks of very different lengths
            kind = rng.integers(3)
            v[: unit if kind == 0 else 0 if kind == 1 else int(rng.integers(1, unit))] = rng.integers(0, 256)
            if kind == 0:
                v[:] = rng.integers(0, 256, unit)
        ids = np.arange(next_id, next_id + rows)
        kept = slice(max(0, rows - ring_size), rows)  # as EpisodeStore.write: only what the ring keeps
        ring.put(ids[kept], values[kept])
        reference.update(zip(ids[kept].tolist(), values[kept], strict=True))
        next_id += rows
        for i in range(max(0, next_id - ring_size), next_id):
            np.testing.assert_array_equal(_decoded(ring, i), reference[i], err_msg=f"seed {seed}, id {i}")


def test_a_file_whose_ring_has_no_blocks_is_refused(tmp_path):
    from tests.test_episodes import _crafted

    rng = np.random.default_rng(9)
    _, packed = _twins(rng, capacity=8, streams=1, k=2, steps=5, batch_rows=1)
    path = _crafted(tmp_path, packed, episodes__units_lz4=np.zeros(0, np.uint8),
                    episodes__units_lz4_lengths=np.full(5, -1, np.int32))
    with pytest.raises(ValueError, match="units_lz4_lengths"):
        perx.ReplayBuffer.load(path)


def test_units_after_a_batch_larger_than_the_ring_stay_readable(monkeypatch):
    """A batch of more rows than the ring skips ids; its first kept unit wraps to the arena's start, and the
    skipped ids must not let the next units be written over it (a first version measured the free space from
    the head before the batch)."""
    monkeypatch.setattr(_lz4, "INITIAL", 64)
    capacity, size = 14, 16
    bufs = [perx.ReplayBuffer(capacity, perx.Uniform(), seed=0, episodes=Episodes(next_obs="shared", compress=c))
            for c in (None, "lz4")]

    def extend(obs):
        for buf in bufs:
            buf.extend(obs=obs, next_obs=np.zeros_like(obs), reward=np.zeros(len(obs), np.float32),
                       terminated=np.ones(len(obs), bool), truncated=np.zeros(len(obs), bool))

    small = np.zeros((1, size), np.uint8)
    small[0, :3] = (1, 2, 3)
    extend(small)  # one short block at the arena's start
    batch = np.zeros((2 * capacity, size), np.uint8)
    batch[capacity] = np.random.default_rng(0).integers(0, 256, size)  # an incompressible first kept unit
    extend(batch)
    live = np.arange(bufs[0].next_index - capacity, bufs[0].next_index)
    plain, packed = (buf.get(live) for buf in bufs)
    np.testing.assert_array_equal(packed["obs"], plain["obs"])
    np.testing.assert_array_equal(packed["next_obs"], plain["next_obs"])


def test_the_arena_shrinks_once_its_units_compress_better_and_samples_stay_exact(monkeypatch):
    """Incompressible frames grow the arena; blank frames after them leave it mostly empty: within one ring's
    worth of writes it is compacted to 1.5x the live bytes (while over SHRINK_AT times them), and the buffer
    still returns what the uncompressed one does."""
    monkeypatch.setattr(_lz4, "INITIAL", 256)
    capacity, size = 40, 32
    bufs = [perx.ReplayBuffer(capacity, perx.Uniform(), seed=0, episodes=Episodes(next_obs="shared", compress=c))
            for c in (None, "lz4")]
    rng = np.random.default_rng(0)

    def extend(obs):
        for buf in bufs:
            buf.extend(obs=obs, next_obs=obs, reward=np.zeros(len(obs), np.float32),
                       terminated=np.ones(len(obs), bool), truncated=np.zeros(len(obs), bool))

    def same():
        live = np.arange(max(0, bufs[0].next_index - capacity), bufs[0].next_index)
        for key, value in bufs[0].get(live).items():
            np.testing.assert_array_equal(bufs[1].get(live)[key], value)
        x, y = (buf.sample(16) for buf in bufs)
        np.testing.assert_array_equal(x["obs"], y["obs"])

    for _ in range(capacity):
        extend(rng.integers(0, 256, (1, size), dtype=np.uint8))
    same()
    ring = bufs[1]._episodes.packed  # (made by the first add)
    grown = ring.arena.nbytes
    assert grown >= capacity * size  # every unit is stored whole, plus its header
    sizes = []
    for _ in range(capacity):  # one at a time; the arena is measured once per ring's worth of ids
        extend(np.zeros((1, size), np.uint8))
        sizes.append(ring.arena.nbytes)
        same()
    live = ring.live_bytes(bufs[1].next_index)
    slack = 2 * _lz4.bound(ring.unit)
    assert live < capacity * 16 and ring.arena.nbytes <= 1.5 * live + slack < grown / 2, (sizes, live)
    assert sizes[-1] < grown and min(sizes) == sizes[-1]
    for _ in range(3 * capacity):  # a steady state: no further shrink below what the live units need
        extend(np.zeros((1, size), np.uint8))
    same()
    assert ring.arena.nbytes >= ring.live_bytes(bufs[1].next_index)


def test_an_arena_under_initial_is_not_shrunk():
    ring = _lz4.PackedUnits(100, (64,), np.dtype(np.uint8))
    first = ring.arena.nbytes
    ring.put(np.arange(300), np.zeros((300, 64), np.uint8))
    assert ring.arena.nbytes == first  # blank units: far below 1/3 of the arena, but under INITIAL
