"""One replay buffer fed by several processes on one machine, through shared memory (no Ray, no GIL shared).

The learner process owns a :class:`perx.ReplayBuffer` (any sampler; in RAM or ``memmap=``) and a
:class:`SharedReplay` around it. Each actor process gets a :class:`SharedWriter` (``hub.writer(k)``, passed to
the process as an argument) and calls ``add``/``extend`` exactly as on a buffer. Each writer has a ring of its
own in shared memory (a file in ``/dev/shm``, mapped by both processes): it validates and converts a batch in its
own process (the buffer's checks: fields, shapes, dtypes, ranges), copies the rows into free ring slots, then
publishes them by advancing the ring's head. The learner's :meth:`SharedReplay.pull` (``sample`` calls it first)
moves every published row into the buffer with ``extend``, where it gets its id and maximal priority, and frees
the slots. So the sampler, its trees and every priority update stay in one process, and the buffer's own
invariants (no torn rows, sums equal to fsum, stale updates skipped) hold as they do in one process.

Why rings per writer rather than one shared buffer: a writer never waits for another, and a writer killed at
any instant cannot corrupt anything. Its head is advanced only after its rows are written, under a lock that
only that writer and the learner take (a lock's release and acquire are the memory barriers that make the rows
visible before the head); rows it was writing when killed are never published, and a lock it died holding is
detected (the learner's acquire times out, and the writer's process is gone), after which the learner drops
that ring. A writer whose ring is full waits for the learner (back-pressure) and gives up with an error if the
learner's process has gone.

Cost: each transition is copied twice (into the ring, then into the buffer); at 80 bytes a row that is far below
what sampling costs (benchmarks/bench_shared.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import secrets
import tempfile
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from perx._mmap import _alive, _reserve
from perx.storage import FieldSpec, Storage, _RowLayout
from perx.validation import _short, check_positive_int

# Ring header (int64): published head, consumed tail, writer pid, learner pid.
_HEAD, _TAIL, _WRITER, _LEARNER = 0, 1, 2, 3
_HEADER = 64  # bytes before the rows (one cache line)


def _check_timeout(timeout: object) -> None:
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout >= 0):
        raise ValueError(f"timeout: expected seconds >= 0 or None, got {_short(timeout)}")


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _unlink(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


_RING_NAME = re.compile(r"perx-shared-(\d+)-[0-9a-f]{8}-\d+")


def stale_rings(directory: str | os.PathLike | None = None) -> list[Path]:
    """Ring files whose learner process no longer runs on this host, in ``directory`` (default: where rings
    are made, ``/dev/shm`` or the temporary folder). A learner killed before :meth:`SharedReplay.close` (kill
    -9, a crash: no finalizer runs) leaves its rings there, holding memory until they are removed. (A learner
    in another PID namespace that shares the folder, a container with ``--ipc=host``, looks gone from here.)"""
    out = []
    for path in sorted(Path(directory if directory is not None else _shm_dir()).glob("perx-shared-*")):
        m = _RING_NAME.fullmatch(path.name)
        if m is not None and not _alive(int(m.group(1))) and os.access(path, os.W_OK):
            out.append(path)  # (only files this user could remove: others' are theirs to clean up)
    return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # (removed meanwhile)
        return 0


def remove_stale_rings(directory: str | os.PathLike | None = None) -> int:
    """Remove :func:`stale_rings` (writers still attached keep their mappings); returns how many were removed
    (a file another process removed first, or one this user may not remove, is skipped)."""
    removed = 0
    for path in stale_rings(directory):
        try:
            path.unlink()
            removed += 1
        except (FileNotFoundError, PermissionError):
            pass
    return removed


class _Ring:
    """A ring of ``size`` rows of the buffer's row layout in a mapped file, with its header."""

    def __init__(self, path: str, spec: dict[str, FieldSpec], size: int, *, create: bool) -> None:
        self.path, self.size = path, size
        layout = _RowLayout(spec)
        nbytes = _HEADER + size * layout.row_bytes
        self.mm = np.memmap(path, np.uint8, mode="w+" if create else "r+", shape=(nbytes,))
        if create:
            # commit the ring's memory now: a sparse file in a full /dev/shm would make a writer's later store
            # raise SIGBUS, which kills the process uncaught; a reservation that fails refuses the hub here
            _reserve(Path(path))
        self.header = self.mm[:8 * 8].view(np.int64)
        rows = self.mm[_HEADER:].reshape(size, layout.row_bytes)
        self.fields = {}
        for name, f in spec.items():
            start = layout.offset[name]
            self.fields[name] = rows[:, start : start + layout.size[name]].view(f.dtype).reshape(size, *f.shape)


class SharedWriter:
    """An actor process's handle on a :class:`SharedReplay` (picklable: pass it to the process).

    ``add(**transition)`` and ``extend(**transitions)`` take what ``ReplayBuffer.add``/``extend`` take (plain
    fields, no ``stream``) and refuse what they refuse, in the writer's process and before anything is written.
    They return once the rows are published (not when the learner has pulled them; ids are given by the
    learner's buffer). A full ring makes them wait for the learner; ``timeout`` (seconds, None: forever) bounds
    that wait (``TimeoutError``), and a learner process that has gone raises ``RuntimeError``.
    """

    def __init__(self, path: str, spec: dict[str, FieldSpec], size: int, lock: Any, index: int) -> None:
        self._path, self._spec, self._size, self._lock, self.index = path, spec, size, lock, index
        self._ring: _Ring | None = None
        self._check: Storage | None = None

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_ring", "_check")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._ring = self._check = None

    def _attach(self) -> _Ring:
        ring = _Ring(self._path, self._spec, self._size, create=False)
        with self._lock:
            ring.header[_WRITER] = os.getpid()
        self._check = Storage(1, self._spec)
        self._ring = ring
        return ring

    def add(self, *, timeout: float | None = None, **transition: Any) -> None:
        if self._check is None:
            self._attach()
        _check_timeout(timeout)
        arrays, _, _ = self._check.prepare(transition, batched=False)  # type: ignore[union-attr]
        self._publish({k: a[None] for k, a in arrays.items()}, 1, _deadline(timeout), timeout)

    def extend(self, *, timeout: float | None = None, **transitions: Any) -> None:
        """A batch of at most ``ring`` rows is published at once or not at all; a larger one goes in ring-sized
        parts, so a timeout (one deadline for the whole call) may leave its first parts published."""
        if self._check is None:
            self._attach()
        _check_timeout(timeout)
        arrays, rows, _ = self._check.prepare(transitions, batched=True)  # type: ignore[union-attr]
        deadline = _deadline(timeout)
        for start in range(0, rows, self._size):
            part = {k: a[start : start + self._size] for k, a in arrays.items()}
            self._publish(part, min(self._size, rows - start), deadline, timeout)

    def _publish(self, arrays: Mapping[str, np.ndarray], n: int, deadline: float | None,
                 timeout: float | None) -> None:
        ring = self._ring if self._ring is not None else self._attach()
        header, size = ring.header, self._size
        wait = 1e-4
        learner = int(header[_LEARNER])
        while True:
            with self._held(learner, deadline, timeout):
                head, tail = int(header[_HEAD]), int(header[_TAIL])
            if size - (head - tail) >= n:
                break
            if not _alive(learner):
                raise RuntimeError(f"SharedWriter {self.index}: the learner's process {learner} has gone; nothing "
                                   f"pulls this ring")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"SharedWriter {self.index}: the ring stayed full for {timeout} s (the learner "
                                   f"pulls more slowly than the actors add)")
            time.sleep(wait)
            wait = min(2 * wait, 0.01)
        first = head % size
        cut = min(n, size - first)
        for name, arr in arrays.items():  # rows beyond the head: the learner reads none of them yet
            dst = ring.fields[name]
            dst[first : first + cut] = arr[:cut]
            if cut < n:
                dst[: n - cut] = arr[cut:n]
        with self._held(learner, deadline, timeout):  # publish: the release makes the rows visible before the head
            header[_HEAD] = head + n

    @contextlib.contextmanager
    def _held(self, learner: int, deadline: float | None = None, timeout: float | None = None) -> Iterator[None]:
        """The ring's lock; RuntimeError if the learner's process dies holding it, TimeoutError past
        ``deadline``."""
        while not self._lock.acquire(timeout=1.0 if deadline is None else
                                     min(1.0, max(0.0, deadline - time.monotonic()))):
            if not _alive(learner):
                raise RuntimeError(f"SharedWriter {self.index}: the learner's process {learner} has gone")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"SharedWriter {self.index}: the ring's lock stayed held for {timeout} s")
        try:
            yield
        finally:
            self._lock.release()


class SharedReplay:
    """The learner's side: ``buffer`` fed by ``writers`` actor processes through rings of ``ring`` rows each.

    Args:
        buffer: the buffer (its fields fixed: ``spec=`` or a first add; plain fields, no episodes). Used by the
            learner's process only; call :meth:`pull` (or :meth:`sample`, which pulls first) to take in what the
            writers published.
        writers: number of writer handles (``writer(k)``, k < writers).
        ring: rows per writer ring (memory: ``ring * row_bytes`` per writer, in ``/dev/shm``).
        context: the ``multiprocessing`` context the actor processes are started with (its locks must match);
            default ``multiprocessing.get_context()``.
        lock_timeout: seconds the learner waits for a ring's lock before checking whether its writer died
            holding it (then the ring is dropped: :attr:`dropped`).
    """

    def __init__(self, buffer: Any, writers: int, *, ring: int = 65_536, context: Any = None,
                 lock_timeout: float = 1.0) -> None:
        from perx.buffer import ReplayBuffer

        if not isinstance(buffer, ReplayBuffer):
            raise TypeError(f"buffer: expected a perx.ReplayBuffer, got {_short(buffer)}")
        writers = check_positive_int(writers, "writers")
        ring = check_positive_int(ring, "ring")
        if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float)) or not lock_timeout > 0:
            raise ValueError(f"lock_timeout: expected seconds > 0, got {_short(lock_timeout)}")
        spec = buffer.spec
        if spec is None:
            raise ValueError("buffer: its fields are not fixed yet; build it with spec= (or add once) first")
        if buffer.episodes is not None or any(isinstance(f, dict) for f in spec.values()):
            raise ValueError("buffer: SharedReplay takes plain fields only (no episodes, no dict fields)")
        flat: dict[str, FieldSpec] = {k: f for k, f in spec.items() if isinstance(f, FieldSpec)}
        if _RowLayout(flat).loose:
            raise ValueError(f"buffer: every field must take bytes in a row; got {_short(spec)}")
        ctx = context if context is not None else multiprocessing.get_context()
        stale = stale_rings()
        if stale:
            held = sum(_size(p) for p in stale) / 2**20
            warnings.warn(f"{len(stale)} ring files of learners that are gone ({held:.1f} MiB) are in {_shm_dir()}: "
                          f"perx.shared.remove_stale_rings() removes them", stacklevel=2)
        self.buffer = buffer
        self._spec = flat
        self._size = ring
        self._lock_timeout = float(lock_timeout)
        tag = f"perx-shared-{os.getpid()}-{secrets.token_hex(4)}"
        self._rings: list[_Ring] = []
        self._locks = []
        paths = [str(Path(_shm_dir()) / f"{tag}-{k}") for k in range(writers)]
        try:
            for path in paths:
                r = _Ring(path, flat, ring, create=True)
                r.header[_LEARNER] = os.getpid()
                self._rings.append(r)
                self._locks.append(ctx.Lock())
        except OSError as err:
            _unlink(paths)  # (a file may exist though its mapping failed)
            raise MemoryError(f"ring: cannot map {writers} rings of {ring} rows of {_RowLayout(flat).row_bytes} "
                              f"bytes in {_shm_dir()} ({err})") from None
        except BaseException:
            _unlink(paths)
            raise
        # the rings' files go when this object does (or at exit), if close() was not called
        self._finalizer = weakref.finalize(self, _unlink, [r.path for r in self._rings])
        #: Indices of rings dropped because their writer died holding the ring's lock (their published rows
        #: were pulled first).
        self.dropped: list[int] = []
        #: Rows pulled from each writer so far (in the buffer).
        self.pulled = [0] * writers

    def writer(self, k: int) -> SharedWriter:
        """The handle for actor k (pass it to that process; one process per handle)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < len(self._rings):
            raise ValueError(f"k: expected an int in [0, {len(self._rings)}), got {_short(k)}")
        return SharedWriter(self._rings[k].path, self._spec, self._size, self._locks[k], int(k))

    def pull(self) -> int:
        """Move every row the writers have published into the buffer (``extend``, in ring order per writer);
        returns how many. O(rows pulled).

        Rows are counted as pulled (:attr:`pulled`) as soon as they are in the buffer, before their slots are
        freed: a pull interrupted (``KeyboardInterrupt``) anywhere but in the few bytecodes between an
        ``extend`` returning and the count does not add its rows again. A writer that
        died holding its ring's lock can write nothing more, and every row below its published head was
        complete before the head moved: those rows are still pulled, then the ring is dropped."""
        total = 0
        for k, ring in enumerate(self._rings):
            if k in self.dropped:
                continue
            lock = self._locks[k]
            dead = False
            if lock.acquire(timeout=self._lock_timeout):
                try:
                    head = int(ring.header[_HEAD])
                finally:
                    lock.release()
            elif not _alive(int(ring.header[_WRITER])):
                head, dead = int(ring.header[_HEAD]), True
            else:
                continue  # busy: next pull
            total += self._take(k, ring, head)
            if dead:
                self.dropped.append(k)
                continue
            if int(ring.header[_TAIL]) == self.pulled[k]:  # (only the learner writes the tail)
                continue
            # free the slots only after their rows are copied out; a writer that died holding the lock meanwhile
            # has its ring dropped (its rows so far are in the buffer)
            while not lock.acquire(timeout=self._lock_timeout):
                if not _alive(int(ring.header[_WRITER])):
                    total += self._take(k, ring, int(ring.header[_HEAD]))
                    self.dropped.append(k)
                    break
            else:
                try:
                    ring.header[_TAIL] = self.pulled[k]
                finally:  # (an interrupt here must not leave the writer's lock held)
                    lock.release()
        return total

    def _take(self, k: int, ring: _Ring, head: int) -> int:
        """Extend the buffer by ring k's rows from :attr:`pulled` [k] (may be ahead of the ring's tail, after an
        interrupted pull) up to ``head``; each part is counted the moment it is in the buffer."""
        start = self.pulled[k]
        n = head - start
        if n <= 0:
            return 0
        first = start % self._size
        cut = min(n, self._size - first)
        self.buffer.extend(**{name: f[first : first + cut] for name, f in ring.fields.items()})
        self.pulled[k] = start + cut
        if cut < n:
            self.buffer.extend(**{name: f[: n - cut] for name, f in ring.fields.items()})
            self.pulled[k] = head
        return n

    def sample(self, batch_size: int, beta: float = 1.0, **kwargs: Any) -> Any:
        """:meth:`pull`, then ``buffer.sample``."""
        self.pull()
        return self.buffer.sample(batch_size, beta, **kwargs)

    def update_priorities(self, indices: Any, td_errors: Any) -> int:
        return self.buffer.update_priorities(indices, td_errors)

    def close(self) -> None:
        """Remove the rings' files (writers still attached keep their mappings until they exit; their next wait
        for space raises, as if the learner had gone)."""
        for r in self._rings:
            r.header[_LEARNER] = 0
        _unlink([r.path for r in self._rings])
        self._rings = []

    def __enter__(self) -> SharedReplay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
