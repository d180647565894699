"""perx.shared: actor processes feeding one learner's buffer through shared-memory rings."""

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

import perx
from perx.shared import SharedReplay
from tests.conftest import SAMPLERS

pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
CTX = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
SPEC = {"obs": ((4,), np.float32), "next_obs": ((4,), np.float32), "writer": ((), np.int64),
        "seq": ((), np.int64), "reward": ((), np.float64)}


def _rows(k, seq):
    """Rows that identify themselves: obs repeats seq, next_obs = obs + 1, reward = k * 1e6 + seq."""
    obs = np.repeat(seq[:, None], 4, axis=1).astype(np.float32)
    return {"obs": obs, "next_obs": obs + 1, "writer": np.full(len(seq), k, np.int64), "seq": seq,
            "reward": k * 1e6 + seq.astype(np.float64)}


def _actor(w, k, n, chunk, pause):
    rng = np.random.default_rng(k)
    start = 0
    while start < n:
        m = min(n - start, int(rng.integers(1, chunk + 1)))
        if m == 1 and rng.random() < 0.5:
            w.add(**{name: a[0] for name, a in _rows(k, np.arange(start, start + 1)).items()})
        else:
            w.extend(**_rows(k, np.arange(start, start + m)))
        start += m
        if pause:
            time.sleep(pause)


def _consistent(batch):
    seq = batch["seq"].astype(np.float32)
    np.testing.assert_array_equal(batch["obs"], np.repeat(seq[:, None], 4, axis=1))  # no torn row
    np.testing.assert_array_equal(batch["next_obs"], batch["obs"] + 1)
    np.testing.assert_array_equal(batch["reward"], batch["writer"] * 1e6 + batch["seq"])


def _learn(hub, procs, rng):
    deadline = time.monotonic() + 120
    while any(p.is_alive() for p in procs) or hub.pull():
        assert time.monotonic() < deadline, "the learner did not finish in 120 s"
        hub.pull()
        if len(hub.buffer) >= 32:
            batch = hub.sample(32, 0.5)
            _consistent(batch)
            hub.pull()  # more rows land (overwriting some sampled ones) before the update: stale ids skipped
            hub.update_priorities(batch.indices, rng.standard_normal(32))


@pytest.mark.parametrize("name", ["proportional", "rank", "lap", "uniform"])
def test_writer_processes_feed_one_buffer_with_no_torn_rows_and_every_invariant_kept(name):
    buf = perx.ReplayBuffer(2000, SAMPLERS[name](), seed=0, spec=SPEC)
    n = 3000
    with SharedReplay(buf, 3, ring=50, context=CTX) as hub:  # batches of up to 64 rows: published in parts
        procs = [CTX.Process(target=_actor, args=(hub.writer(k), k, n, 64, 0.0)) for k in range(3)]
        for p in procs:
            p.start()
        _learn(hub, procs, np.random.default_rng(0))
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        assert hub.pull() == 0 and hub.pulled == [n, n, n] and buf.next_index == 3 * n
    live = buf.get(np.arange(buf.next_index - len(buf), buf.next_index))
    _consistent(live)
    for k in range(3):  # each writer's rows arrive in its order, none lost or repeated
        seq = live["seq"][live["writer"] == k]
        np.testing.assert_array_equal(seq, np.arange(n - len(seq), n))
    if isinstance(buf.sampler, perx.Proportional):
        sampler = buf.sampler
        for now, rebuilt in zip((sampler._mass, sampler._heap), sampler._rebuilt(len(buf)), strict=True):
            np.testing.assert_array_equal(now, rebuilt)  # the trees equal trees rebuilt from the masses


def test_a_killed_writer_corrupts_nothing_and_the_others_go_on(tmp_path):
    buf = perx.ReplayBuffer(50_000, perx.Proportional(), seed=0, spec=SPEC)
    n = 4000
    with SharedReplay(buf, 3, ring=128, context=CTX) as hub:
        procs = [CTX.Process(target=_actor, args=(hub.writer(k), k, n, 16, 0.002)) for k in range(3)]
        for p in procs:
            p.start()
        time.sleep(0.3)
        os.kill(procs[1].pid, signal.SIGKILL)  # at whatever instant it has reached
        _learn(hub, procs, np.random.default_rng(1))
        assert procs[1].exitcode == -signal.SIGKILL
        assert hub.pulled[0] == n and hub.pulled[2] == n and hub.pulled[1] < n
    live = buf.get(np.arange(buf.next_index))
    _consistent(live)
    seq = live["seq"][live["writer"] == 1]
    np.testing.assert_array_equal(seq, np.arange(len(seq)))  # a prefix of its rows, each whole


def test_a_writer_killed_holding_its_lock_is_dropped_without_blocking_the_learner():
    buf = perx.ReplayBuffer(1000, perx.Proportional(), seed=0, spec=SPEC)
    with SharedReplay(buf, 2, ring=64, context=CTX, lock_timeout=0.2) as hub:
        w = hub.writer(0)

        def die_holding_the_lock(w):
            w.extend(**_rows(0, np.arange(5)))
            w._lock.acquire()
            os.kill(os.getpid(), signal.SIGKILL)

        p = CTX.Process(target=die_holding_the_lock, args=(w,))
        p.start()
        p.join(30)
        other = CTX.Process(target=_actor, args=(hub.writer(1), 1, 300, 10, 0.0))
        other.start()
        t = time.monotonic()
        while other.is_alive() or hub.pull():  # the other writer's rows keep coming while ring 0 is stuck
            hub.pull()
            assert time.monotonic() - t < 30
        # the 5 rows it published before it died are pulled (complete: the head moved after them), then the
        # ring is dropped
        assert hub.dropped == [0] and hub.pulled == [5, 300]
        rows = buf.get(np.arange(len(buf)))
        np.testing.assert_array_equal(np.sort(rows["seq"][rows["writer"] == 0]), np.arange(5))
        t = time.monotonic()
        hub.pull()
        assert time.monotonic() - t < 0.1  # the dropped ring is not waited for again


def test_a_pull_interrupted_after_copying_rows_never_adds_them_twice():
    buf = perx.ReplayBuffer(1000, perx.Proportional(), seed=0, spec=SPEC)
    with SharedReplay(buf, 1, ring=8, context=CTX) as hub:
        w = hub.writer(0)
        w.extend(**_rows(0, np.arange(6)))
        hub.pull()
        w.extend(**_rows(0, np.arange(6, 12)))  # wraps: two parts, [6, 8) and [0, 4)
        extend = buf.extend
        calls = []

        def interrupted(**fields):  # Ctrl-C once the first part is in the buffer, before the second
            if calls:
                raise KeyboardInterrupt
            extend(**fields)
            calls.append(len(fields["seq"]))

        buf.extend = interrupted
        with pytest.raises(KeyboardInterrupt):
            hub.pull()
        buf.extend = extend
        assert calls == [2] and hub.pulled == [8]
        hub.pull()
        seq = buf.get(np.arange(len(buf)))["seq"]
        np.testing.assert_array_equal(seq, np.arange(12))  # each row once, in order
        w.extend(**_rows(0, np.arange(12, 20)))  # and every slot was freed: a full ring's worth fits
        assert hub.pull() == 8 and len(buf) == 20


def test_rings_left_by_a_killed_learner_are_reported_and_removed_and_live_ones_kept():
    import secrets

    from perx import shared

    gone = CTX.Process(target=lambda: None)
    gone.start()
    gone.join(30)  # a pid that no process has now
    stale = os.path.join(shared._shm_dir(), f"perx-shared-{gone.pid}-{secrets.token_hex(4)}-0")
    with open(stale, "wb") as f:
        f.write(b"\0" * 4096)
    try:
        buf = perx.ReplayBuffer(100, perx.Uniform(), spec=SPEC)
        with pytest.warns(UserWarning, match=r"ring files of learners that are gone .*remove_stale_rings"):
            hub = SharedReplay(buf, 1, ring=16, context=CTX)
        live = hub.writer(0)._path  # this learner's ring: alive, listed nowhere
        assert stale in map(str, shared.stale_rings()) and live not in map(str, shared.stale_rings())
        assert shared.remove_stale_rings() >= 1
        assert not os.path.exists(stale) and os.path.exists(live)
        hub.close()
    finally:
        if os.path.exists(stale):
            os.unlink(stale)


def test_a_pull_interrupted_while_freeing_slots_leaves_the_writers_lock_free(tmp_path):
    from perx.shared import _TAIL

    buf = perx.ReplayBuffer(1000, perx.Uniform(), seed=0, spec=SPEC)
    with SharedReplay(buf, 1, ring=8, context=CTX, lock_timeout=0.2) as hub:
        w = hub.writer(0)
        w.extend(**_rows(0, np.arange(8)))
        ring = hub._rings[0]

        class Interrupted(np.ndarray):  # Ctrl-C at the tail's store, with the ring's lock held
            def __setitem__(self, i, v):
                if i == _TAIL:
                    raise KeyboardInterrupt
                super().__setitem__(i, v)

        header, ring.header = ring.header, ring.header.view(Interrupted)
        with pytest.raises(KeyboardInterrupt):
            hub.pull()
        ring.header = header
        assert hub.pulled == [8] and hub._locks[0].acquire(timeout=0.1)  # the lock was released
        hub._locks[0].release()
        assert hub.pull() == 0  # nothing pulled twice; this pull frees the slots
        w.extend(**_rows(0, np.arange(8, 16)), timeout=5)  # so a full ring's worth fits again
        assert hub.pull() == 8 and len(buf) == 16


def test_stale_ring_names_that_no_process_can_have_are_stale_not_errors(tmp_path):
    from perx import shared

    odd = tmp_path / "perx-shared-99999999999999999999-deadbeef-0"  # a pid beyond any C long
    odd.write_bytes(b"")
    assert shared.stale_rings(tmp_path) == [odd]
    assert shared.remove_stale_rings(tmp_path) == 1 and not odd.exists()
    assert shared.remove_stale_rings(tmp_path) == 0


def test_bad_rows_are_refused_in_the_writer_and_nothing_is_published():
    buf = perx.ReplayBuffer(100, perx.Uniform(), spec=SPEC)
    with SharedReplay(buf, 1, ring=16, context=CTX) as hub:
        w = hub.writer(0)  # used in this process: a writer needs no process of its own
        rows = _rows(0, np.arange(3))
        with pytest.raises(ValueError, match="missing"):
            w.extend(**{k: v for k, v in rows.items() if k != "seq"})
        with pytest.raises(ValueError, match=r"obs: expected shape \(batch, 4\)"):
            w.extend(**{**rows, "obs": np.zeros((3, 5), np.float32)})
        with pytest.raises(TypeError, match="seq: cannot cast dtype float64"):
            w.extend(**{**rows, "seq": np.zeros(3)})
        assert hub.pull() == 0 and len(buf) == 0
        w.extend(**rows)
        assert hub.pull() == 3
        np.testing.assert_array_equal(buf.get(np.arange(3))["seq"], np.arange(3))


def test_a_full_ring_times_out_and_a_gone_learner_is_reported():
    buf = perx.ReplayBuffer(100, perx.Uniform(), spec=SPEC)
    with SharedReplay(buf, 1, ring=8, context=CTX) as hub:
        w = hub.writer(0)
        w.extend(**_rows(0, np.arange(8)))
        with pytest.raises(TimeoutError, match=r"the ring stayed full for 0\.2 s"):
            w.extend(**_rows(0, np.arange(8, 10)), timeout=0.2)
        assert hub.pull() == 8
        w.extend(**_rows(0, np.arange(8, 10)), timeout=0.2)
        w._ring.header[3] = 2**31 - 2  # a learner pid that is not running: a full ring must not wait forever
        w.extend(**_rows(0, np.arange(10, 16)))
        with pytest.raises(RuntimeError, match=r"the learner's process \d+ has gone"):
            w.extend(**_rows(0, np.arange(16, 20)))


def test_the_hub_refuses_what_it_cannot_share():
    with pytest.raises(ValueError, match="buffer: its fields are not fixed yet"):
        SharedReplay(perx.ReplayBuffer(10), 2)
    with pytest.raises(ValueError, match="no episodes"):
        SharedReplay(perx.ReplayBuffer(10, episodes=perx.Episodes(), spec={
            "obs": (3, np.float32), "next_obs": (3, np.float32), "reward": ((), np.float32),
            "terminated": ((), bool), "truncated": ((), bool)}), 2)
    with pytest.raises(ValueError, match="writers: must be > 0"):
        SharedReplay(perx.ReplayBuffer(10, spec=SPEC), 0)
    with SharedReplay(perx.ReplayBuffer(10, spec=SPEC), 2) as hub, pytest.raises(ValueError, match=r"k: expected"):
        hub.writer(2)


def test_a_writer_that_dies_holding_its_lock_while_the_learner_copies_does_not_block_the_learner():
    buf = perx.ReplayBuffer(1000, perx.Proportional(), seed=0, spec=SPEC)
    with SharedReplay(buf, 1, ring=64, context=CTX, lock_timeout=0.2) as hub:
        w = hub.writer(0)
        w.extend(**_rows(0, np.arange(5)))
        extend = buf.extend

        def extend_while_the_writer_dies(**fields):  # the writer takes its lock and is killed mid-pull
            p = CTX.Process(target=lambda: (w._lock.acquire(), os.kill(os.getpid(), signal.SIGKILL)))
            p.start()
            p.join(30)
            w._ring.header[2] = p.pid  # (it is the ring's writer now)
            return extend(**fields)

        buf.extend = extend_while_the_writer_dies
        t = time.monotonic()
        assert hub.pull() == 5
        assert time.monotonic() - t < 10 and hub.dropped == [0] and len(buf) == 5


def test_add_takes_a_timeout_and_a_closed_hub_stops_its_writers():
    buf = perx.ReplayBuffer(100, perx.Uniform(), spec=SPEC)
    hub = SharedReplay(buf, 1, ring=2, context=CTX)
    w = hub.writer(0)
    one = {name: a[0] for name, a in _rows(0, np.arange(1)).items()}
    w.add(**one)
    w.add(**one)
    with pytest.raises(TimeoutError):
        w.add(**one, timeout=0.1)
    with pytest.raises(ValueError, match="timeout: expected seconds"):
        w.add(**one, timeout=-1)
    hub.close()
    with pytest.raises(RuntimeError, match="has gone"):
        w.add(**one)
    with pytest.raises(ValueError, match="lock_timeout: expected seconds > 0"):
        SharedReplay(buf, 1, lock_timeout=None)


def test_a_full_shm_refuses_the_hub_at_creation_and_leaves_no_ring_file(monkeypatch):
    # a sparse ring in a full /dev/shm would kill a writer with SIGBUS at a later store; the reservation
    # refuses the hub at once instead
    import errno

    from perx.shared import _shm_dir

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    before = set(os.listdir(_shm_dir()))
    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    with pytest.raises(MemoryError, match=r"ring: cannot map 3 rings of 100 rows .*No space left on device"):
        SharedReplay(perx.ReplayBuffer(10, spec=SPEC), 3, ring=100)
    assert {f for f in os.listdir(_shm_dir()) if f.startswith("perx-shared-")} <= before


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="no posix_fallocate here")
def test_a_rings_memory_is_reserved_when_the_hub_is_made():
    with SharedReplay(perx.ReplayBuffer(10, spec=SPEC), 2, ring=10_000) as hub:
        for ring in hub._rings:
            st = os.stat(ring.path)
            assert st.st_size > 10_000 * 8 * 4 and st.st_blocks * 512 >= st.st_size
