"""Memmap buffers (``ReplayBuffer(..., memmap=folder)``): fields in files on disk, reopened exactly after
``close()``, refused after a crash. The conformance suite also runs on memmap storage
(tests/samplers/test_conformance.py, the ``storage`` fixture)."""

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import perx
from perx.episodes import Episodes
from tests.conftest import SAMPLERS, transitions
from tests.test_episodes import LAYOUTS, World, check_all, feed

ROOT = Path(__file__).resolve().parents[1]


def _twins(name, folder, capacity=40, n=70):
    """The same buffer built twice, in RAM and on disk, with the same adds and one round of updates."""
    bufs = []
    for memmap in (None, folder):
        buf = perx.ReplayBuffer(capacity, SAMPLERS[name](), seed=3, memmap=memmap)
        buf.extend(**transitions(n))
        b = buf.sample(8, 0.5)
        buf.update_priorities(b.indices, np.linspace(0.1, 3.0, 8))
        bufs.append(buf)
    return bufs


def _same_batches(a, b, rounds=4, size=6):
    for _ in range(rounds):
        x, y = a.sample(size, 0.5), b.sample(size, 0.5)
        np.testing.assert_array_equal(x.indices, y.indices)
        np.testing.assert_array_equal(x.weights, y.weights)
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
        a.update_priorities(x.indices, np.arange(size) + 0.5)
        b.update_priorities(y.indices, np.arange(size) + 0.5)


@pytest.mark.parametrize("name", ["uniform", "proportional", "rank", "lap", "hybrid"])
def test_a_closed_memmap_buffer_reopens_and_samples_as_the_buffer_in_ram_would(name, tmp_path):
    ram, disk = _twins(name, tmp_path / "buf")
    disk.close()
    reopened = perx.ReplayBuffer.open(tmp_path / "buf")
    assert reopened.memmap == str(tmp_path / "buf") and len(reopened) == len(ram)
    _same_batches(ram, reopened)
    reopened.extend(**transitions(25, start=70))  # it carries on, and closes and reopens again
    ram.extend(**transitions(25, start=70))
    reopened.close()
    with pytest.raises(TypeError, match="warm: expected a bool"):  # refused before the folder is marked open
        perx.ReplayBuffer.open(tmp_path / "buf", warm="yes")
    _same_batches(ram, perx.ReplayBuffer.open(tmp_path / "buf", warm=True))  # (reads the files in first)


def test_the_rows_live_in_the_file_not_in_ram(tmp_path):
    buf = perx.ReplayBuffer(1000, perx.Proportional(), memmap=tmp_path / "b")
    buf.extend(**transitions(1000))
    rows = np.load(tmp_path / "b" / "rows.npy", mmap_mode="r")
    assert rows.shape == buf._storage.rows.shape and rows.dtype == np.uint8
    base = buf._storage.rows
    while isinstance(base, np.ndarray) and not isinstance(base, np.memmap):
        base = base.base
    assert isinstance(base, np.memmap)  # the storage's rows are a view of the mapping
    assert type(buf._storage.rows) is np.ndarray  # a plain ndarray over it: the compiled kernels take it
    buf.close()
    start = buf._storage._layout.offset["obs"]  # the file holds the rows as written
    rows = np.load(tmp_path / "b" / "rows.npy", mmap_mode="r")
    np.testing.assert_array_equal(np.ascontiguousarray(rows[:, start : start + 4]).view(np.float32)[:, 0],
                                  np.arange(1000, dtype=np.float32))
    got = perx.ReplayBuffer.open(tmp_path / "b").get(np.arange(1000))
    np.testing.assert_array_equal(got["obs"][:, 0], np.arange(1000))


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
def test_an_episodic_memmap_buffer_keeps_its_observation_ring_on_disk_and_reopens_exactly(layout, tmp_path):
    rng = np.random.default_rng(5)
    frames = layout.get("frame_stack")
    cfg = Episodes(gamma=0.8, streams=2, **layout, **({"frame_margin": 4 * frames} if frames else {}))
    ram = perx.ReplayBuffer(30, perx.Proportional(), seed=2, episodes=cfg)
    disk = perx.ReplayBuffer(30, perx.Proportional(), seed=2, episodes=cfg, memmap=tmp_path / "e")
    world = World(rng, 2, cfg.frame_stack, cfg.frame_padding)
    steps_before = len(world.steps)
    feed(ram, world, rng, 47, rounds=bool(frames))
    for step in world.steps[steps_before:]:  # the same steps into the memmap twin
        one = dict(step)
        disk.add(stream=one.pop("stream"), **one)
    if cfg.shared:
        assert (tmp_path / "e" / "units.npy").exists()
    disk.close()
    reopened = perx.ReplayBuffer.open(tmp_path / "e")
    _same_batches(ram, reopened)
    feed(reopened, world, rng, 90, rounds=bool(frames))  # carries on over the wrap-around
    check_all(reopened, world, cfg.n_step, 0.8)


@pytest.mark.parametrize("frame_stack", [None, 2])
def test_dict_observations_stored_once_keep_their_ring_on_disk_and_reopen_exactly(frame_stack, tmp_path):
    # a dict observation makes the buffer swap its episode store for the dict one at the first add: that store
    # must keep the ring in the folder too (it did not: the ring stayed in RAM, and reopening read zeros)
    cfg = Episodes(n_step=2, next_obs="shared", frame_stack=frame_stack)
    k = frame_stack or 1

    def stack(e, i):  # step i of episode e: episodes of 7 steps (the 7th truncated), frames numbered 100 * e + i
        frames = [100 * e + max(j, 0) for j in range(i - k + 1, i + 1)]
        a = np.array([[f, -f] for f in frames], np.float32)
        b = np.array([10 * f for f in frames], np.int64)
        return {"a": a, "b": b} if frame_stack else {"a": a[0], "b": b[0]}

    def obs(t):
        return stack(*divmod(t, 7))

    def final(t):  # the observation after step t, also after an episode's last step
        e, i = divmod(t, 7)
        return stack(e, i + 1)

    disk = perx.ReplayBuffer(8, perx.Proportional(), seed=0, episodes=cfg, memmap=tmp_path / "d")
    for t in range(13):
        disk.add(obs=obs(t), next_obs=final(t), reward=float(t), terminated=False, truncated=t % 7 == 6)
    assert (tmp_path / "d" / "units.npy").exists()
    ids = np.arange(5, 13)
    want = disk.get(ids)
    disk.close()
    got = perx.ReplayBuffer.open(tmp_path / "d").get(ids)
    for name in ("obs", "next_obs"):
        for key in ("a", "b"):
            np.testing.assert_array_equal(got[name][key], want[name][key])
    newest = [obs(t)["b"].reshape(-1)[-1] for t in ids]
    np.testing.assert_array_equal(got["obs"]["b"].reshape(len(ids), k)[:, -1], newest)


def test_save_writes_a_portable_copy_that_loads_in_ram(tmp_path):
    ram, disk = _twins("proportional", tmp_path / "buf")
    disk.save(tmp_path / "copy.npz")
    loaded = perx.ReplayBuffer.load(tmp_path / "copy.npz")
    assert loaded.memmap is None
    _same_batches(ram, loaded)


def test_a_new_memmap_buffer_refuses_a_folder_that_is_not_empty(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "other.txt").write_text("x")
    with pytest.raises(FileExistsError, match=r"memmap: the folder .* is not empty"):
        perx.ReplayBuffer(10, memmap=tmp_path / "b")
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError, match="is a file"):
        perx.ReplayBuffer(10, memmap=tmp_path / "f")
    with pytest.raises(TypeError, match="memmap: expected a folder path"):
        perx.ReplayBuffer(10, memmap=3)


def test_a_refused_buffer_leaves_no_folder_behind(tmp_path):
    sampler = perx.Uniform()
    perx.ReplayBuffer(5, sampler)
    with pytest.raises(ValueError, match=r"sampler: .* already bound"):
        perx.ReplayBuffer(5, sampler, memmap=tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()
    with pytest.raises(ValueError, match="an episodic buffer needs"):
        perx.ReplayBuffer(5, episodes=Episodes(), spec={"obs": (3, np.float32)}, memmap=tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_a_closed_buffer_refuses_every_call_and_closing_twice_is_harmless(tmp_path):
    buf = perx.ReplayBuffer(10, perx.Proportional(), memmap=tmp_path / "b")
    buf.extend(**transitions(5))
    with buf:
        pass
    buf.close()
    for call in (lambda: buf.sample(2), lambda: buf.add(**{k: v[0] for k, v in transitions(1).items()}),
                 lambda: buf.update_priorities([0], [1.0]), lambda: buf.save(tmp_path / "x.npz")):
        with pytest.raises(ValueError, match=r"the buffer is closed .*ReplayBuffer.open reopens it"):
            call()
    ram = perx.ReplayBuffer(10)
    ram.close()
    with pytest.raises(ValueError, match=r"^sample: the buffer is closed$"):
        ram.sample(1)


def test_a_memmap_buffer_cannot_be_pickled_or_copied(tmp_path):
    buf = perx.ReplayBuffer(10, memmap=tmp_path / "b")
    buf.extend(**transitions(3))
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        pickle.dumps(buf)
    import copy

    for make in (copy.copy, copy.deepcopy):  # (a shallow copy would share the files and the open folder)
        with pytest.raises(TypeError, match="cannot be pickled or copied"):
            make(buf)


def test_an_open_buffer_cannot_be_opened_twice(tmp_path):
    buf = perx.ReplayBuffer(10, memmap=tmp_path / "b")
    buf.extend(**transitions(3))
    buf.close()
    first = perx.ReplayBuffer.open(tmp_path / "b")
    with pytest.raises(ValueError, match=f"is open in process {os.getpid()} on this host"):
        perx.ReplayBuffer.open(tmp_path / "b")
    first.close()
    perx.ReplayBuffer.open(tmp_path / "b").close()


def test_damaged_files_are_refused_and_the_folder_stays_closed(tmp_path):
    buf = perx.ReplayBuffer(10, memmap=tmp_path / "b")
    buf.extend(**transitions(6))
    buf.close()
    rows = tmp_path / "b" / "rows.npy"
    good = rows.read_bytes()
    np.save(rows, np.zeros((9, 3), np.uint8))  # wrong shape
    with pytest.raises(ValueError, match=r"rows.npy' holds uint8\[9, 3\], but the buffer's state needs"):
        perx.ReplayBuffer.open(tmp_path / "b")
    rows.unlink()
    with pytest.raises(ValueError, match=r"rows\.npy' is missing"):
        perx.ReplayBuffer.open(tmp_path / "b")
    rows.write_bytes(good)
    state = tmp_path / "b" / "state.npz"
    blob = bytearray(state.read_bytes())
    state.write_bytes(bytes(blob[: len(blob) // 2]))
    with pytest.raises(ValueError, match=r"cannot open the memmap buffer .*state.npz is truncated or corrupted"):
        perx.ReplayBuffer.open(tmp_path / "b")
    with pytest.raises(ValueError, match="a memmap buffer's state"):  # the state file is not a saved buffer
        perx.ReplayBuffer.load(_state_of_a_fresh_memmap_buffer(tmp_path / "c"))
    with pytest.raises(FileNotFoundError, match="is not a folder holding a memmap buffer"):
        perx.ReplayBuffer.open(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no memmap buffer"):
        perx.ReplayBuffer.open(tmp_path / "empty")


def _state_of_a_fresh_memmap_buffer(folder):
    buf = perx.ReplayBuffer(4, memmap=folder)
    buf.extend(**transitions(2))
    buf.close()
    return folder / "state.npz"


_CHILD = """
import sys, numpy as np, perx
sys.path.insert(0, {root!r})
from tests.conftest import transitions
buf = perx.ReplayBuffer(5000, perx.Proportional(), seed=0, memmap={folder!r})
k = 0
while True:
    buf.extend(**transitions(64, start=k))
    b = buf.sample(32, 0.4)
    buf.update_priorities(b.indices, np.ones(32))
    k += 64
    if k == 64 * 100:
        print("writing", flush=True)
    if {stop} and k >= {stop}:
        break
"""


def _child(folder, stop):
    code = textwrap.dedent(_CHILD.format(root=str(ROOT), folder=str(folder), stop=stop))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def test_a_buffer_whose_process_was_killed_mid_write_is_refused(tmp_path):
    proc = _child(tmp_path / "b", 0)
    try:
        assert proc.stdout.readline().strip() == "writing"  # well into the ring's second lap
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    with pytest.raises(ValueError, match=rf"was not closed: process {proc.pid} on host .* stopped without close"):
        perx.ReplayBuffer.open(tmp_path / "b")


def test_a_process_that_exits_without_close_leaves_a_buffer_that_reopens(tmp_path):
    proc = _child(tmp_path / "b", 64 * 30)
    assert proc.wait(timeout=120) == 0
    buf = perx.ReplayBuffer.open(tmp_path / "b")
    assert buf.next_index == 64 * 30 and len(buf) == 64 * 30
    np.testing.assert_array_equal(buf.get(np.arange(1900, 1920))["obs"][:, 0], np.arange(1900, 1920))


def test_of_two_opens_at_once_exactly_one_gets_the_folder(tmp_path, monkeypatch):
    buf = perx.ReplayBuffer(10, memmap=tmp_path / "b")
    buf.extend(**transitions(3))
    buf.close()
    first = perx.ReplayBuffer.open(tmp_path / "b")
    # the second passes the check before the first has marked the folder (the race): creating the marker fails
    monkeypatch.setattr(perx._mmap.MappedFolder, "_check_closed", lambda self: None)
    with pytest.raises(ValueError, match="is being opened by another process"):
        perx.ReplayBuffer.open(tmp_path / "b")
    monkeypatch.undo()
    assert len(first) == 3
    first.close()


def test_a_forked_child_never_closes_its_parents_buffer(tmp_path):
    buf = perx.ReplayBuffer(10, memmap=tmp_path / "b")
    buf.extend(**transitions(2))
    pid = os.fork()
    if pid == 0:  # what a child's normal exit runs: the atexit close and garbage collection; both must pass
        import gc

        perx._mmap._close_all()
        del buf
        gc.collect()
        os._exit(0)  # (not sys.exit: that would go on running pytest in the child)
    os.waitpid(pid, 0)
    assert (tmp_path / "b" / "open.json").exists() and not (tmp_path / "b" / "state.npz").exists()
    buf.extend(**transitions(3, start=2))
    buf.close()
    assert len(perx.ReplayBuffer.open(tmp_path / "b")) == 5


def test_a_buffer_dropped_without_close_is_closed_and_reopens(tmp_path):
    def build():
        buf = perx.ReplayBuffer(10, perx.Proportional(), memmap=tmp_path / "b")
        buf.extend(**transitions(4))

    build()
    import gc

    gc.collect()
    assert len(perx.ReplayBuffer.open(tmp_path / "b")) == 4


def test_a_file_that_cannot_be_created_leaves_no_folder(tmp_path):
    with pytest.raises(MemoryError, match="memmap: cannot create"):
        perx.ReplayBuffer(2**40, spec={"x": ((2**16,), np.uint8)}, memmap=tmp_path / "new" / "buf")
    assert not (tmp_path / "new").exists()


def test_a_full_disk_refuses_the_buffer_at_creation_naming_the_file(tmp_path, monkeypatch):
    import errno
    import os

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    with pytest.raises(MemoryError, match=r"cannot create '.*rows\.npy'.*No space left on device"):
        perx.ReplayBuffer(1000, spec={"x": ((8,), np.float32)}, memmap=tmp_path / "new" / "buf")
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(not hasattr(__import__("os"), "posix_fallocate"), reason="no posix_fallocate here")
def test_a_new_buffer_file_has_its_disk_space_reserved(tmp_path):
    # a sparse file would let a later store into an unbacked page raise SIGBUS on a full disk
    import os

    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    try:
        with open(probe, "r+b") as f:
            os.posix_fallocate(f.fileno(), 0, 1 << 20)
    except OSError:
        pytest.skip("this file system cannot reserve space (the file stays sparse)")
    buf = perx.ReplayBuffer(100_000, spec={"x": ((8,), np.float32)}, memmap=tmp_path / "b")
    st = os.stat(tmp_path / "b" / "rows.npy")
    assert st.st_size >= 100_000 * 32 and st.st_blocks * 512 >= st.st_size
    buf.close()


def test_opening_something_that_is_not_a_folder_says_so(tmp_path):
    (tmp_path / "b.npz").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="is not a folder holding a memmap buffer"):
        perx.ReplayBuffer.open(tmp_path / "b.npz")
    with pytest.raises(TypeError, match="path: expected a folder path"):
        perx.ReplayBuffer.open(123)


@pytest.mark.parametrize("name", ["uniform", "proportional", "rank", "lap"])
def test_a_prefetching_memmap_buffer_draws_the_batches_the_buffer_in_ram_draws(name, tmp_path):
    ram, disk = _twins(name, tmp_path / "buf")
    before = disk.sample(20, 0.5)  # drawn by the fused call
    ram.sample(20, 0.5)
    disk.prefetch = True
    assert disk.prefetch and disk._storage._layout.unfused  # draw, prefetch, then copy: no fused call
    _same_batches(ram, disk, size=20)
    for batch in (before, disk.sample(20, 0.5)):  # neither refills in one call, which would skip the prefetch
        with pytest.raises(ValueError, match="no prefetch"):
            disk.sample(20, 0.5, out=batch)
    disk.prefetch = False
    assert not disk._storage._layout.unfused
    b = disk.sample(20, 0.5)
    disk.sample(20, 0.5, out=b)  # fused again


def test_a_prefetch_set_before_the_first_add_applies_to_the_layout_made_then(tmp_path):
    buf = perx.ReplayBuffer(50, perx.Proportional(), memmap=tmp_path / "b")
    buf.prefetch = True
    buf.extend(**transitions(30))
    assert buf._storage._layout.unfused and buf.sample(8, 0.5).indices.shape == (8,)


def test_prefetch_covers_the_pages_of_each_sampled_row(tmp_path):
    import mmap

    from perx._mmap import row_pages

    # rows of 7,069 bytes (an 84x84 frame and more) after a .npy header: rows straddle page boundaries
    mm = np.lib.format.open_memmap(tmp_path / "rows.npy", mode="w+", dtype=np.uint8, shape=(40, 7069))
    mm[:] = np.random.default_rng(0).integers(0, 256, mm.shape, dtype=np.uint8)
    mapping = np.frombuffer(mm._mmap, np.uint8)
    slots = np.array([0, 39, 7, 7, 22])
    ranges = row_pages(mm, slots)
    assert len(ranges) == 4  # one per distinct row
    for (start, length), row in zip(ranges, sorted(set(slots.tolist())), strict=True):
        assert start % mmap.PAGESIZE == 0 and start + length <= len(mapping)
        np.testing.assert_array_equal(mapping[start + length - 7069 : start + length], mm[row])
        assert length - 7069 < mmap.PAGESIZE  # from the page holding the row's first byte, no earlier
    del mapping
    # rows of 80 bytes: rows on one page share a range, and every sampled row lies inside a range
    small = np.lib.format.open_memmap(tmp_path / "small.npy", mode="w+", dtype=np.uint8, shape=(1000, 80))
    slots = np.array([0, 1, 2, 40, 41, 900])
    ranges = row_pages(small, slots)
    assert len(ranges) < len(slots)
    at = small.offset % mmap.ALLOCATIONGRANULARITY + slots * 80
    assert all(any(s <= a and a + 80 <= s + n for s, n in ranges) for a in at.tolist())
    assert all(s % mmap.PAGESIZE == 0 for s, _ in ranges)
    pages = [p for s, n in ranges for p in range(s // mmap.PAGESIZE, (s + n - 1) // mmap.PAGESIZE + 1)]
    assert len(pages) == len(set(pages))  # no page asked for twice


def test_prefetch_is_refused_where_it_cannot_apply_and_the_setting_stays(tmp_path):
    ram = perx.ReplayBuffer(10)
    with pytest.raises(ValueError, match="prefetch: only a memmap buffer"):
        ram.prefetch = True
    assert ram.prefetch is False
    ram.prefetch = False  # (a no-op, not an error)
    disk = perx.ReplayBuffer(10, memmap=tmp_path / "b")
    with pytest.raises(TypeError, match="prefetch: expected a bool, got 1"):
        disk.prefetch = 1
    assert disk.prefetch is False
    disk.close()
    with pytest.raises(ValueError, match="prefetch: the buffer is closed"):
        disk.prefetch = True
