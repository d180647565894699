"""Atomic file writes: a temporary file in the target's folder, fsynced, then renamed over the target.

A process killed mid-write leaves its temporary file behind. Names carry the host and process id
(``.<name>.perx-<host>-<pid>-<random>.tmp``), so the next save of the same target can tell a
leftover (its process is gone) from a save still running (its process is alive, on this host)
and remove only the leftovers.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

_in_progress: set[str] = set()
_guard = threading.Lock()


def _host() -> str:
    return socket.gethostname().replace(os.sep, "_") or "host"


def _prefix(path: Path) -> str:
    return f".{path.name}.perx-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # (no process; a pid no process can have, from a crafted name)
        return False
    except (PermissionError, OSError):
        return True  # exists, owned by someone else (or cannot tell: keep the file)
    return True


def leftovers(path: Path) -> list[Path]:
    """Temporary files of earlier saves of ``path`` whose process has gone (same host only)."""
    folder = path.parent
    prefix, host, me = _prefix(path), _host(), os.getpid()
    found: list[Path] = []
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        return found
    for entry in entries:
        if not (entry.startswith(prefix) and entry.endswith(".tmp")):
            continue
        parts = entry[len(prefix) : -len(".tmp")].rsplit("-", 2)
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        with _guard:
            running_here = str(folder / entry) in _in_progress
        if (pid == me and not running_here) or (pid != me and not _alive(pid)):
            found.append(folder / entry)
    return found


def write(path: Path, fill: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` atomically with ``fill(file)``; remove leftovers of killed earlier saves first."""
    for old in leftovers(path):
        try:
            old.unlink()
        except FileNotFoundError:
            pass  # removed by a concurrent save of the same path
    tmp = path.parent / f"{_prefix(path)}{_host()}-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    with _guard:
        _in_progress.add(str(tmp))
    try:
        with open(tmp, "xb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        with _guard:
            _in_progress.discard(str(tmp))
