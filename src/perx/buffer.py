"""The replay buffer: a circular storage of named fields composed with a sampler.

Indices handed out (by ``add``, ``extend`` and ``sample``) are monotonic insertion ids, int64. An
update whose id has since been overwritten is skipped and not counted (stale), so priorities never
land on the wrong transition, with no extra argument (see :mod:`perx.storage`).

Invariant: every public method either succeeds or raises before changing anything.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from perx._validation import (
    _short,
    as_index_array,
    as_value_array,
    check_batch_size,
    check_capacity,
    check_real,
)
from perx.samplers.base import Sampler, check_sampler
from perx.samplers.uniform import Uniform
from perx.storage import FieldSpec, Storage

FORMAT = "perx.ReplayBuffer"
FORMAT_VERSION = 1


class Batch(Mapping):
    """A sampled batch: ``batch["obs"]`` etc. ([B, *shape] arrays), plus metadata.

    Attributes:
        indices: int64 [B] insertion ids, for ``update_priorities``.
        weights: float64 [B] importance-sampling weights (all 1 for uniform sampling).
        probabilities: float64 [B] exact P(i) of each returned transition under the current priorities.
        data: dict of field name -> array.
    """

    __slots__ = ("data", "indices", "probabilities", "weights")

    def __init__(self, data: dict[str, np.ndarray], indices: np.ndarray, weights: np.ndarray,
                 probabilities: np.ndarray) -> None:
        self.data = data
        self.indices = indices
        self.weights = weights
        self.probabilities = probabilities

    def __getitem__(self, key: str) -> np.ndarray:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.indices)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.data.items())
        return f"Batch(size={len(self)}, {fields})"


class ReplayBuffer:
    """Experience replay with any perx sampler (uniform, proportional PER, ...).

    Args:
        capacity: number of transitions kept; the oldest is overwritten first. Must be > 0.
        sampler: the replay strategy, e.g. ``perx.Proportional(alpha=0.6)``; default ``perx.Uniform()``.
            A sampler belongs to one buffer.
        seed: if given, reseeds the sampler's generator with ``np.random.default_rng(seed)``.
        spec: optional ``{name: (shape, dtype)}`` fixing the fields up front; otherwise the first
            ``add``/``extend`` fixes them. ``terminated`` and ``truncated`` are ordinary fields.

    Example:
        >>> buf = ReplayBuffer(capacity=1000, sampler=perx.Proportional(alpha=0.6), seed=0)
        >>> idx = buf.add(obs=o, action=a, reward=r, next_obs=o2, terminated=False, truncated=False)
        >>> batch = buf.sample(32, beta=0.4)
        >>> buf.update_priorities(batch.indices, td_errors)
    """

    def __init__(self, capacity: int, sampler: Sampler | None = None, *, seed: int | None = None,
                 spec: Mapping | None = None) -> None:
        capacity = check_capacity(capacity)
        sampler = Uniform() if sampler is None else check_sampler(sampler)
        storage = Storage(capacity, spec)
        sampler._bind(capacity)
        if seed is not None:
            sampler.reseed(seed)
        self._storage = storage
        self.sampler = sampler

    # -- facts -----------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._storage.capacity

    def __len__(self) -> int:
        n = self._storage.next_id
        cap = self._storage.capacity
        return n if n < cap else cap

    @property
    def next_index(self) -> int:
        """The id the next added transition will get (= total number ever added)."""
        return self._storage.next_id

    @property
    def spec(self) -> dict[str, FieldSpec] | None:
        return self._storage.spec

    def __repr__(self) -> str:
        return f"ReplayBuffer(capacity={self.capacity}, size={len(self)}, sampler={self.sampler!r})"

    # -- writing ---------------------------------------------------------------------------------
    def add(self, **transition: Any) -> np.ndarray:
        """Store one transition at maximal priority. O(fields + log N).

        Returns:
            int64 [1]: its id, usable with ``update_priorities`` and ``set_priorities``.

        Raises:
            ValueError / TypeError: missing or extra fields, wrong shapes, unsafe dtypes; nothing is
                stored then.
        """
        arrays, rows, new_spec = self._storage.prepare(transition, batched=False)
        ids, slots = self._storage.write(arrays, rows, new_spec, batched=False)
        self.sampler.on_add(slots, ids)
        return ids

    def extend(self, **transitions: Any) -> np.ndarray:
        """Store a batch of transitions (axis 0 = batch) at maximal priority, without a Python loop.

        Returns:
            int64 [n]: their ids in order. If n > capacity only the last ``capacity`` are kept and the
            earlier ids are stale at once.

        Raises:
            ValueError / TypeError: as ``add``, or fields with different batch lengths; nothing is
                stored then.
        """
        arrays, rows, new_spec = self._storage.prepare(transitions, batched=True)
        if rows == 0:
            return np.empty(0, np.int64)
        ids, slots = self._storage.write(arrays, rows, new_spec, batched=True)
        self.sampler.on_add(slots, ids[rows - len(slots):])
        return ids

    # -- sampling --------------------------------------------------------------------------------
    def sample(self, batch_size: int, beta: float = 1.0) -> Batch:
        """Draw a batch with replacement, with IS weights for exponent ``beta``.

        Args:
            batch_size: B > 0.
            beta: IS exponent in [0, 1] (000 Sec. 3.4); default 1, full correction. Anneal it with
                ``perx.LinearSchedule``. Ignored by samplers without IS weights.

        Returns:
            a :class:`Batch`. Cost: O(B log N) plus the copy of B rows of every field.

        Raises:
            ValueError: empty buffer, batch_size <= 0, beta outside [0, 1].
        """
        if type(batch_size) is not int or batch_size <= 0:
            batch_size = check_batch_size(batch_size)
        if type(beta) is not float or not 0.0 <= beta <= 1.0:
            beta = _check_beta(beta)
        size = len(self)
        if size == 0:
            raise ValueError("sample: the buffer is empty; add transitions before sampling")
        storage = self._storage
        slots, ids, probs, weights = self.sampler.sample(batch_size, beta, size, storage.next_id)
        data = {name: arr[slots] for name, arr in storage.data.items()}
        return Batch(data, ids, weights, probs)

    # -- priorities ------------------------------------------------------------------------------
    def update_priorities(self, indices, td_errors) -> int:
        """Set priorities from TD errors of any sign (the sampler maps them, e.g. |delta| + eps).

        Args:
            indices: ids from ``sample``/``add``/``extend``, int [B].
            td_errors: float [B], finite.

        Returns:
            how many were applied; ids overwritten since they were issued are skipped (stale).
            Duplicate ids: applied in order, so the last one wins (each is counted).

        Raises:
            ValueError / TypeError: NaN or inf, different lengths, ids never issued, non-integer ids.
                No priority changes then.
        """
        ids, values = self._update_args(indices, td_errors, "td_errors")
        return self.sampler.update(ids, values, self._storage.next_id, raw=False)

    def set_priorities(self, indices, priorities) -> int:
        """Set raw priorities p_i directly (finite, >= 0; no eps, no abs); alpha still applies.

        Same contract as :meth:`update_priorities`; negative priorities are refused.
        """
        ids, values = self._update_args(indices, priorities, "priorities")
        return self.sampler.update(ids, values, self._storage.next_id, raw=True)

    @staticmethod
    def _update_args(indices, values, name):
        if not (type(indices) is np.ndarray and indices.dtype == np.int64 and indices.ndim == 1):
            indices = as_index_array(indices, "indices")
        n = indices.shape[0]
        if not (type(values) is np.ndarray and values.dtype == np.float64 and values.ndim == 1
                and values.shape[0] == n):
            values = as_value_array(values, name, length=n)
        return indices, values

    def probabilities(self, indices=None, batch_size: int | None = None) -> np.ndarray:
        """Exact per-draw sampling probabilities P(i) (float64) of live ``indices``, or of every
        stored transition in slot order when ``indices`` is None.

        ``batch_size``: for samplers whose distribution depends on it (``perx.RankBased``'s segments,
        ``perx.Greedy``'s top-k), the probabilities of ``sample(batch_size)``; ignored by the others.
        """
        size = len(self)
        if size == 0:
            raise ValueError("probabilities: the buffer is empty")
        if indices is None:
            slots = np.arange(size, dtype=np.int64)
        else:
            ids = as_index_array(indices, "indices")
            nid = self._storage.next_id
            bad = (ids < max(0, nid - self.capacity)) | (ids >= nid)
            if bad.any():
                raise ValueError(f"indices: {int(ids[bad][0])} is not a live id (live: "
                                 f"{max(0, nid - self.capacity)}..{nid - 1})")
            slots = ids % self.capacity
        if batch_size is not None:
            batch_size = check_batch_size(batch_size)
        return self.sampler.probabilities(slots, size, batch_size)

    # -- persistence -----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the complete state (data, trees, max priority, counter, RNG) to ``path`` atomically.

        The file is an uncompressed ``.npz`` archive, written to a temporary file in the same
        folder and renamed over ``path``, so a crash never leaves a half-written file at ``path``.
        """
        path = Path(path)
        size = len(self)
        sampler_meta, sampler_arrays = self.sampler.state_dict()
        spec = self._storage.spec
        meta = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "capacity": self.capacity,
            "next_id": self._storage.next_id,
            "spec": None if spec is None else {k: f.to_json() for k, f in spec.items()},
            "sampler": {"name": self.sampler.name, "config": self.sampler.config(), "state": sampler_meta},
        }
        arrays = {"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
        for name, arr in self._storage.data.items():
            arrays[f"data/{name}"] = arr[:size]
        for key, arr in sampler_arrays.items():
            arrays[f"sampler/{key}"] = arr
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> ReplayBuffer:
        """Rebuild a buffer saved by :meth:`save`; its next samples equal the original's.

        Raises:
            FileNotFoundError: no file at ``path``.
            ValueError: the file is truncated, corrupted, or not a perx buffer.
        """
        path = Path(path)
        try:
            with open(path, "rb") as f:
                raw = f.read()
            with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
                arrays = {key: npz[key] for key in npz.files}
            meta = json.loads(arrays.pop("meta").tobytes().decode())
        except FileNotFoundError:
            raise
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError, UnicodeDecodeError) as err:
            raise ValueError(f"path: cannot load a replay buffer from {str(path)!r}: the file is "
                             f"truncated or corrupted ({type(err).__name__}: {err})") from err
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"path: {str(path)!r} is not a saved perx.ReplayBuffer")
        if meta.get("version") != FORMAT_VERSION:
            raise ValueError(f"path: {str(path)!r} has format version {meta.get('version')!r}; "
                             f"this perx reads version {FORMAT_VERSION}")
        try:
            return cls._from_state(meta, arrays)
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ValueError(f"path: {str(path)!r} is corrupted: {type(err).__name__}: {err}") from err

    @classmethod
    def _from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> ReplayBuffer:
        sampler_cls = Sampler.registry[meta["sampler"]["name"]]
        sampler = sampler_cls(**meta["sampler"]["config"])
        spec = None if meta["spec"] is None else {k: FieldSpec.from_json(v) for k, v in meta["spec"].items()}
        buf = cls(meta["capacity"], sampler, spec=spec)
        next_id = int(meta["next_id"])
        size = min(next_id, buf.capacity)
        storage = buf._storage
        for name, arr in storage.data.items():
            saved = arrays[f"data/{name}"]
            if saved.shape != (size, *arr.shape[1:]) or saved.dtype != arr.dtype:
                raise ValueError(f"data/{name}: saved {saved.dtype}{saved.shape} does not match the spec")
            arr[:size] = saved
        storage.next_id = next_id
        prefix = "sampler/"
        sampler.load_state_dict(meta["sampler"]["state"],
                                {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
        return buf


def _check_beta(beta: object) -> float:
    if isinstance(beta, bool) or not isinstance(beta, (int, float, np.floating, np.integer)):
        raise TypeError(f"beta: expected a float in [0, 1], got {_short(beta)}")
    return check_real(beta, "beta", low=0.0, high=1.0)
