"""Where shard checkpoints live: a local folder, or any fsspec URL for a cluster without a shared file system.

A shard restarted on another node must find its checkpoint and its incarnation file (``shard-<k>.perx`` and
``shard-<k>.json``) where it left them. A local folder works on one node, or where every node mounts the same
folder (NFS, a cluster file system). Elsewhere give a URL that every node can reach: ``s3://bucket/run``,
``gs://...``, ``az://...``, ``hdfs://...``, ``sftp://...`` (any protocol fsspec knows, with its package
installed: s3fs, gcsfs, adlfs, ...), or ``file:///path`` (a local folder through fsspec, as tests use).

Writes are atomic whatever the target: a checkpoint is saved to a local temporary file (the core's atomic save),
uploaded under a temporary name and then moved over the final name, so a reader sees the old file or the new
one, never half of one (an object store's move is a copy, which publishes the object whole). Reading
downloads to a local temporary file first, because the core's loader checks the archive's members in place.
The cost is one extra local copy of the buffer per save and per restore, on the shard's node.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from perx import ReplayBuffer


def is_url(location: str | os.PathLike) -> bool:
    """Whether ``location`` names an fsspec URL (``protocol://...``) rather than a local path."""
    return isinstance(location, str) and "://" in location


class CheckpointStore:
    """A folder of named files: local (``pathlib``) or remote (``fsspec``), with atomic writes.

    Args:
        location: a local folder (created if missing) or an fsspec URL (``s3://bucket/prefix``, ...).

    Raises:
        ImportError: a URL without fsspec installed (``pip install fsspec`` plus the protocol's package).
        ValueError (naming ``checkpoint_dir``): a URL whose protocol fsspec does not know.
    """

    def __init__(self, location: str | os.PathLike) -> None:
        self.url = is_url(location)
        if self.url:
            try:
                import fsspec
            except ImportError as err:  # pragma: no cover - fsspec comes with the ray extra
                raise ImportError(f"checkpoint_dir: {location!r} is a URL, which needs fsspec "
                                  f"(pip install fsspec and the package of its protocol)") from err
            try:
                self.fs, root = fsspec.core.url_to_fs(str(location))
            except (ValueError, ImportError) as err:
                raise ValueError(f"checkpoint_dir: cannot open {location!r}: {err}") from err
            self.root = root.rstrip("/")
            self.location = str(location).rstrip("/")
            self.fs.makedirs(self.root, exist_ok=True)
        else:
            self.root = str(Path(location).resolve())
            self.location = self.root
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def __reduce__(self) -> tuple[Any, ...]:
        return (CheckpointStore, (self.location,))  # rebuilt (and reconnected) in each process

    def __repr__(self) -> str:
        return f"CheckpointStore({self.location!r})"

    def name(self, name: str) -> str:
        """The full path or URL of ``name`` in this store (for messages and records)."""
        return f"{self.location}/{name}"

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def exists(self, name: str) -> bool:
        return self.fs.exists(self._path(name)) if self.url else os.path.exists(self._path(name))

    def remove(self, name: str) -> None:
        """Delete ``name`` if it exists."""
        if self.url:
            if self.fs.exists(self._path(name)):
                self.fs.rm(self._path(name))
        else:
            Path(self._path(name)).unlink(missing_ok=True)

    # -- small files (incarnation records) --------------------------------------------------------
    def read_json(self, name: str) -> dict[str, Any]:
        if self.url:
            with self.fs.open(self._path(name), "rb") as f:
                return json.loads(f.read())
        return json.loads(Path(self._path(name)).read_text())

    def write_json(self, name: str, payload: dict[str, Any]) -> None:
        """Write ``payload`` as ``name`` atomically (a temporary name, then a rename or move)."""
        data = json.dumps(payload).encode()
        tmp = self._path(f".{name}.{os.getpid()}.tmp")
        if self.url:
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, self._path(name))
        else:
            Path(tmp).write_bytes(data)
            os.replace(tmp, self._path(name))

    # -- buffers ------------------------------------------------------------------------------------
    def save_buffer(self, name: str, buffer: ReplayBuffer) -> None:
        """``buffer.save`` to ``name``, atomically (for a URL: saved locally, uploaded, then moved)."""
        if not self.url:
            buffer.save(self._path(name))
            return
        with tempfile.TemporaryDirectory(prefix="perx-ckpt-") as local:
            path = os.path.join(local, name)
            buffer.save(path)
            tmp = self._path(f".{name}.{os.getpid()}.tmp")
            self.fs.put_file(path, tmp)
            self.fs.mv(tmp, self._path(name))

    def load_buffer(self, name: str) -> ReplayBuffer:
        """``ReplayBuffer.load`` of ``name`` (for a URL: downloaded to a local temporary file first)."""
        if not self.url:
            return ReplayBuffer.load(self._path(name))
        with tempfile.TemporaryDirectory(prefix="perx-ckpt-") as local:
            path = os.path.join(local, name)
            self.fs.get_file(self._path(name), path)
            return ReplayBuffer.load(path)
