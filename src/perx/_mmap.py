"""A buffer's large arrays kept in files on disk (``ReplayBuffer(..., memmap=folder)``).

The folder holds one ``.npy`` file per large array, mapped into memory with ``np.lib.format.open_memmap``: the
storage's rows (``rows.npy``; fields kept apart, ``apart-<k>.npy``) and, in an episodic buffer that stores
observations once, the observation ring (``units.npy``). Everything else (the sampler's trees and priorities,
episode links, the counter) stays in RAM and is written to ``state.npz`` (the format of ``ReplayBuffer.save``
without those members) when the buffer is closed. The operating system pages the mapped files in and out, so a
buffer may be larger than RAM; what sampling costs then depends on how much of the file the page cache holds
(benchmarks/bench_memmap.py).

Reopening (``ReplayBuffer.open``) is exact after ``close()`` (or a normal interpreter exit, which closes every
open memmap buffer) and refused otherwise. While a process has the buffer open, the folder holds ``open.json``
(host, pid); ``close()`` writes the state and then removes it. A folder that still has it after its process
has gone was not closed: the process was killed or crashed, rows it was writing may be torn and the
priorities since the last close are lost, and nothing on disk says which rows are intact; so it is refused,
naming the process. (An exact recovery to an earlier point would need a write-ahead log of every row the ring
overwrites: a second copy of the data, which is what a memmap buffer exists to avoid.)
"""

from __future__ import annotations

import atexit
import errno
import json
import mmap
import os
import secrets
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from perx import _atomic

if TYPE_CHECKING:
    from perx.buffer import ReplayBuffer

STATE = "state.npz"
MARKER = "open.json"


class MappedFileError(ValueError):
    """A file of a reopened memmap buffer that is not what its state needs (the message names it)."""


class MappedCreateError(MemoryError):
    """A file of a new memmap buffer that could not be created (the message names it and the OS error)."""


def _alive(pid: object) -> bool:
    """Whether process ``pid`` (> 0) runs on this host (``_atomic``'s check; 0 and negative ids name groups)."""
    return isinstance(pid, int) and pid > 0 and _atomic._alive(pid)


def _reserve(file: Path) -> None:
    """Allocate the disk blocks of a new (sparse) file now, so that a full disk refuses the buffer when it is
    created, with an error naming the file, instead of killing the process later: a store into a page of
    a mapped file that the file system cannot back raises SIGBUS, which Python cannot catch. Where the file
    system cannot reserve space (``posix_fallocate`` unsupported) the file stays sparse."""
    if not hasattr(os, "posix_fallocate"):  # (not on macOS or Windows)
        return
    fd = os.open(file, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
    finally:
        os.close(fd)


def row_pages(mm: np.memmap, slots: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) ranges in ``mm``'s mapping covering the rows ``slots`` of ``mm``: each starts on a page
    boundary and ends at a row's last byte; rows whose pages overlap (small rows sharing a page, neighbours)
    share one range, so no page is asked for twice."""
    page = mmap.PAGESIZE
    stride = mm.strides[0]
    # (np.memmap maps from the allocation-granularity boundary at or below the data's file offset)
    starts = np.unique(mm.offset % mmap.ALLOCATIONGRANULARITY + np.asarray(slots, np.int64) * stride).tolist()
    ranges: list[list[int]] = []
    for s in starts:
        first = s - s % page
        if ranges and first < ranges[-1][1]:  # its first page is the previous range's last
            ranges[-1][1] = s + stride
        else:
            ranges.append([first, s + stride])
    return [(first, end - first) for first, end in ranges]


def zeros(mapped: MappedFolder | None, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero-filled array: in RAM, or with ``mapped`` the folder's file ``name`` (``MappedFolder.array``)."""
    return np.zeros(shape, dtype) if mapped is None else mapped.array(name, shape, np.dtype(dtype))


class MappedFolder:
    """The files of one memmap buffer (internal; ``ReplayBuffer`` owns one).

    Args:
        path: the folder. New (``reopen=False``): it must not exist or be empty. Reopened: it must hold a
            closed buffer (``state.npz`` and no ``open.json``).
    """

    def __init__(self, path: str | os.PathLike, *, reopen: bool) -> None:
        if not isinstance(path, (str, os.PathLike)):
            name = "path" if reopen else "memmap"
            raise TypeError(f"{name}: expected a folder path (str or os.PathLike), got {path!r}")
        self.path = Path(path)
        #: the process that opened it: only that process closes it at exit (a forked child does not)
        self.pid = os.getpid()
        self.reopen = reopen
        self.closed = False
        self.arrays: dict[str, np.memmap] = {}
        #: ``ReplayBuffer.prefetch``: start the reads of every sampled row's pages before copying them
        self.prefetch = False
        self.created: list[Path] = []  # what this object created, for discard()
        if reopen:
            if not self.path.is_dir():
                raise FileNotFoundError(f"path: {str(self.path)!r} is not a folder holding a memmap buffer")
            self._check_closed()
            if not (self.path / STATE).is_file():
                raise FileNotFoundError(f"path: {str(self.path)!r} holds no memmap buffer (no {STATE})")
        elif self.path.exists():
            if not self.path.is_dir():
                raise FileExistsError(f"memmap: {str(self.path)!r} is a file, not a folder")
            if any(self.path.iterdir()):
                raise FileExistsError(
                    f"memmap: the folder {str(self.path)!r} is not empty; a new memmap buffer needs an empty or new "
                    f"folder (to reopen a closed one: ReplayBuffer.open({str(self.path)!r}))")
        else:
            missing = [p for p in (self.path, *self.path.parents) if not p.exists()]
            self.path.mkdir(parents=True)
            self.created += missing  # deepest first: removed in this order by discard()
        self._mark()

    def _check_closed(self) -> None:
        marker = self.path / MARKER
        try:
            info = json.loads(marker.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            info = {}
        host, pid = info.get("host", "?"), info.get("pid", -1)
        since = info.get("opened", "?")
        if host == _atomic._host() and _alive(pid):
            raise ValueError(f"path: the memmap buffer at {str(self.path)!r} is open in process {pid} on this host "
                             f"(since {since}); close it there first")
        raise ValueError(
            f"path: the memmap buffer at {str(self.path)!r} was not closed: process {pid} on host {host!r} opened it "
            f"at {since} and stopped without close() (killed or crashed). Rows it was writing may be torn and its "
            f"priorities since the last close are lost, and nothing on disk says which rows are intact, so it "
            f"cannot be reopened exactly. Start a new buffer (or load a file written by save())")

    def _mark(self) -> None:
        """Create open.json with its content in one step that fails if it exists (a hard link of a complete
        temporary file): of two processes opening the folder at once, exactly one gets it."""
        info = {"host": _atomic._host(), "pid": os.getpid(), "opened": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        tmp = self.path / f".{MARKER}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        tmp.write_text(json.dumps(info))
        try:
            os.link(tmp, self.path / MARKER)
        except FileExistsError:
            tmp.unlink()
            self._check_closed()  # raises, naming the process that got it
            raise ValueError(f"path: {str(self.path)!r} is being opened by another process") from None
        tmp.unlink()
        _fsync_dir(self.path)

    def array(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The array ``name`` of ``shape`` and ``dtype``: a new zero-filled file with its disk space reserved
        (:func:`_reserve`), or in a reopened folder the existing one, which must match. Returned as a plain ndarray
        over the mapping (the compiled kernels take no ndarray subclass)."""
        dtype = np.dtype(dtype)
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize == 0:
            return np.zeros(shape, dtype)  # nothing to keep (a zero-byte field): mmap refuses empty files
        file = self.path / f"{name}.npy"
        if self.reopen:  # (ReplayBuffer.open clears ``reopen`` once the state is loaded: later fields are new)
            if not file.exists():
                raise MappedFileError(f"path: {str(file)!r} is missing; the buffer's state needs {dtype}{list(shape)}")
            try:
                mm = np.lib.format.open_memmap(file, mode="r+")
            except (OSError, ValueError) as err:
                raise MappedFileError(f"path: {str(file)!r} is not a readable .npy array ({err})") from None
            if mm.shape != tuple(shape) or mm.dtype != dtype:
                raise MappedFileError(f"path: {str(file)!r} holds {mm.dtype}{list(mm.shape)}, but the buffer's "
                                      f"state needs {dtype}{list(shape)}")
        else:
            if not file.exists():
                self.created.insert(0, file)  # before creating it: a failed creation can leave the file
            try:
                mm = np.lib.format.open_memmap(file, mode="w+", dtype=dtype, shape=tuple(shape))
                _reserve(file)
            except (OSError, ValueError) as err:
                raise MappedCreateError(f"memmap: cannot create {str(file)!r} for {dtype}{list(shape)} "
                                  f"({int(np.prod(shape, dtype=np.int64)) * dtype.itemsize / 2**30:.3g} GiB): "
                                  f"{type(err).__name__}: {err}") from None
        # Replay reads rows at random: without this, each page fault reads the device's whole read-ahead
        # window around the page (8 MB on this project's test machine), so a buffer larger than RAM would read
        # megabytes per sampled row (benchmarks/bench_memmap.py measures both)
        raw = getattr(mm, "_mmap", None)
        if raw is not None and hasattr(mmap, "MADV_RANDOM"):
            raw.madvise(mmap.MADV_RANDOM)
        self.arrays[name] = mm
        return mm.view(np.ndarray)

    def prefetch_rows(self, slots: np.ndarray) -> None:
        """Ask the kernel to start reading the pages of rows ``slots`` (int64 [B]) of the row files (``rows``,
        ``apart-*``; not an episodic observation ring) and return at once: one madvise(MADV_WILLNEED) per range
        of :func:`row_pages`. The copy that follows then waits for reads already in flight together, where
        faulting the pages in one at a time waits for each read in turn (benchmarks/bench_memmap_beyond_ram.py
        measures both). Costs a system call per range when the pages are already in the page cache."""
        for name, mm in self.arrays.items():
            raw = getattr(mm, "_mmap", None)
            if raw is not None and (name == "rows" or name.startswith("apart-")):
                for first, length in row_pages(mm, slots):
                    raw.madvise(mmap.MADV_WILLNEED, first, length)

    def warm(self) -> None:
        """Read every mapped file once, sequentially, so its pages are in the page cache (when they fit in RAM):
        the fast way back to warm sampling after a reopen, since random page faults read one page each.
        (``posix_fadvise(WILLNEED)`` would not do: Linux reads only one read-ahead window for it, 8 MB on the
        benchmark machine.)"""
        chunk = bytearray(1 << 24)
        for name in self.arrays:
            with open(self.path / f"{name}.npy", "rb", buffering=0) as f:
                while f.readinto(chunk):
                    pass

    def discard(self) -> None:
        """Remove what this object created (files, then folders) and its marker: a buffer refused while it was
        being built leaves nothing behind."""
        self.closed = True  # (so the half-built buffer's finalizer writes nothing)
        self.arrays.clear()
        (self.path / MARKER).unlink(missing_ok=True)
        for p in self.created:
            try:
                p.rmdir() if p.is_dir() else p.unlink()
            except OSError:
                pass

    def flush(self) -> None:
        """Write every mapped array's dirty pages to its file (msync)."""
        for mm in self.arrays.values():
            mm.flush()

    @property
    def nbytes(self) -> int:
        return sum(mm.nbytes for mm in self.arrays.values())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def close(buf: ReplayBuffer, folder: MappedFolder) -> None:
    """Flush the mapped arrays, write ``state.npz`` (atomically), then remove ``open.json``: from then on the
    folder reopens exactly. The order matters: the state never describes rows not yet on disk."""
    from perx import _format

    folder.flush()
    _format.save(buf, folder.path / STATE, mapped=True)
    (folder.path / MARKER).unlink(missing_ok=True)
    _fsync_dir(folder.path)
    folder.closed = True


#: Open memmap buffers, closed at a normal interpreter exit (a killed process leaves its marker: refused).
_open: weakref.WeakSet[Any] = weakref.WeakSet()


def register(buf: ReplayBuffer) -> None:
    _open.add(buf)


@atexit.register
def _close_all() -> None:
    for buf in list(_open):
        try:
            folder = buf._mapped
            if folder is not None and folder.pid == os.getpid():  # not a forked child's copy of its parent's
                buf.close()
        except Exception:  # at exit: close what can be closed; a failure leaves its marker
            pass
