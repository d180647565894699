"""perx inside TorchRL: perx's samplers as a TorchRL replay-buffer ``Sampler``.

``PerxSampler`` plugs perx's uniform, proportional (PER), rank-based, LAP and greedy sampling into TorchRL's
own ``ReplayBuffer`` / ``TensorDictReplayBuffer`` with any 1-D storage (``LazyTensorStorage``,
``LazyMemmapStorage``, ``ListStorage``) and TorchRL's round-robin writers::

    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from perx.torchrl import PerxSampler

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100_000),
                                sampler=PerxSampler(100_000, "per", alpha=0.6, beta=0.4), batch_size=32)
    rb.extend(transitions)                  # new items get perx's maximal priority
    batch = rb.sample()                     # batch["index"], batch["priority_weight"] (IS weights)
    batch["td_error"] = td_error            # |delta| per row, from the learner
    rb.update_tensordict_priority(batch)    # TorchRL's own write-back

How it maps. The sampler keeps a private :class:`perx.ReplayBuffer` of the storage's capacity that holds no
observation data (one uint8 per slot) and mirrors the storage's writes: TorchRL calls ``add``/``extend``
with the written storage indices, which a round-robin writer hands out in the order perx writes its slots,
so storage index ``s`` is perx slot ``s`` and holds the newest perx insertion id ``i`` with
``i % max_capacity == s``. Sampling, IS weights, priority updates, the historical maximum priority of new
items and save/load all go through perx's public API. Only this module imports torch and torchrl.

Install with ``pip install "torch==2.13.0" -e ".[torchrl]"`` (torchrl 0.14.1; see docs/training_loops.md).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

import perx

__all__ = ["PerxSampler", "make_sampler"]

_FORMAT = "perx.torchrl/1"
_BUFFER_FILE = "perx_buffer.npz"
_FRESH_FILE = "perx_fresh.npy"
_META_FILE = "perx_sampler.json"
_SPEC = {"x": ((), np.uint8)}  # the mirror stores one byte per slot: perx needs a field, TorchRL holds the data
_EMPTY_STORAGE_ERROR = "Cannot sample from an empty storage."  # TorchRL's samplers' message
_REDUCTIONS = ("max", "min", "mean", "median", "sum")
_KINDS = ("uniform", "per", "proportional", "rank", "lap", "greedy")


def _short(values: np.ndarray, limit: int = 8) -> str:
    values = np.asarray(values).reshape(-1)
    text = ", ".join(str(v) for v in values[:limit].tolist())
    return f"[{text}{', ...' if values.size > limit else ''}]"


def make_sampler(kind: str, *, alpha: float | None = None, eps: float | None = None,
                 kappa: float | None = None) -> perx.Sampler:
    """A perx sampler by name: ``"uniform"``, ``"per"`` (= ``"proportional"``), ``"rank"``, ``"lap"``,
    ``"greedy"``. ``alpha``, ``eps`` and ``kappa`` left as None take perx's defaults (PER alpha 0.6, eps 1e-6;
    rank alpha 0.7; LAP alpha 0.4, kappa 1); passing one the kind does not use raises ``ValueError``."""
    if not isinstance(kind, str):
        raise TypeError(f"sampler: expected one of {_KINDS} or a perx sampler, got {type(kind).__name__} {kind!r}")
    name = kind.lower()
    uses = {"uniform": (), "per": ("alpha", "eps"), "proportional": ("alpha", "eps"), "rank": ("alpha",),
            "lap": ("alpha", "kappa"), "greedy": ()}
    if name not in uses:
        raise ValueError(f"sampler: expected one of {_KINDS} or a perx sampler, got {kind!r}")
    given = {"alpha": alpha, "eps": eps, "kappa": kappa}
    extra = [arg for arg, value in given.items() if value is not None and arg not in uses[name]]
    if extra:
        raise ValueError(f"{extra[0]}: sampler {kind!r} takes no {extra[0]} (it takes {uses[name] or 'none'}), got "
                         f"{extra[0]}={given[extra[0]]!r}")
    kwargs = {arg: value for arg, value in given.items() if value is not None}
    if name == "uniform":
        return perx.Uniform()
    if name in ("per", "proportional"):
        return perx.Proportional(**kwargs)
    if name == "rank":
        return perx.RankBased(**kwargs)
    if name == "lap":
        return perx.LAP(**kwargs)
    return perx.Greedy()


def _check_beta(value: Any) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"beta: expected a number in [0, 1], got {type(value).__name__} {value!r}")
    beta = float(value)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta: must be in [0, 1], got {value!r}")
    return beta


def _as_slots(index: Any, name: str = "index") -> np.ndarray:
    """Flat int64 storage indices from an int, a sequence, an array or a tensor."""
    if isinstance(index, tuple):
        raise ValueError(f"{name}: PerxSampler supports 1-D storages only (flat indices), got a tuple of "
                         f"{len(index)} index tensors")
    if isinstance(index, torch.Tensor):
        arr = index.detach().cpu().numpy()
    else:
        arr = np.asarray(index)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer storage indices, got dtype {arr.dtype}")
    if arr.ndim > 1:
        raise ValueError(f"{name}: PerxSampler supports 1-D storages only (flat indices), got shape "
                         f"{tuple(arr.shape)}")
    return arr.reshape(-1).astype(np.int64, copy=False)


def _rebuilder(sampler: perx.Sampler) -> functools.partial:
    """A picklable recipe for a new unbound sampler configured like ``sampler`` (an unbound ``perx.Greedy``
    cannot be copied or pickled, so the plain samplers are rebuilt from their configuration)."""
    if type(sampler) in (perx.Uniform, perx.Proportional, perx.RankBased, perx.Greedy):
        return functools.partial(type(sampler), **sampler.config())
    return functools.partial(copy.deepcopy, copy.deepcopy(sampler))


class PerxSampler(PrioritizedSampler):
    """A perx sampler as a TorchRL ``Sampler`` for storages of ``max_capacity`` items.

    Args:
        max_capacity: the storage's ``max_size`` (checked whenever the storage is seen).
        sampler: ``"uniform"``, ``"per"`` / ``"proportional"``, ``"rank"``, ``"lap"``, ``"greedy"``, or an unbound
            perx sampler instance (``perx.Proportional(alpha=0.5, max_priority="buffer")``, ``perx.Hybrid(...)``).
        alpha, eps, kappa: for a sampler given by name; None takes perx's default.
        beta: IS exponent in [0, 1] used by ``sample``; an attribute, so anneal it with ``sampler.beta = ...``
            or TorchRL's ``LinearScheduler(sampler, "beta", ...)``. Default 1 (full correction), as perx's.
        seed: seed of the perx sampler's generator, which draws every batch (TorchRL's ``generator=`` does not
            reach it); its state is saved by ``state_dict`` and ``dumps``.
        reduction: how ``TensorDictReplayBuffer`` reduces a multi-element priority entry of one item
            (TorchRL's ``reduction``).

    ``sample`` returns the storage indices and ``info = {"priority_weight": w, "perx_id": ids}``: the IS
    weights (float32; ``(N P(i))^-beta / max_j (N P(j))^-beta``, 1 for uniform, LAP and greedy) under the
    key TorchRL's ``PrioritizedSampler`` and losses use, and perx's insertion ids for stale-safe updates
    with :meth:`update_by_id`.

    Priorities are TD errors: ``update_priority(index, priority)`` passes ``priority`` to perx's
    ``update_priorities``, which takes |priority| and applies eps, LAP's floor kappa and alpha once.

    The class derives from TorchRL's ``PrioritizedSampler`` only so that TorchRL treats it as prioritized
    (``TensorDictReplayBuffer.update_tensordict_priority`` checks that type); none of that class's code
    runs, and it needs no compiled TorchRL extension.
    """

    def __init__(self, max_capacity: int, sampler: str | perx.Sampler = "per", *, alpha: float | None = None,
                 beta: float = 1.0, eps: float | None = None, kappa: float | None = None,
                 seed: int | None = None, reduction: str = "max") -> None:
        # PrioritizedSampler.__init__ is not called on purpose: it builds TorchRL's compiled segment trees.
        if isinstance(max_capacity, bool) or not isinstance(max_capacity, (int, np.integer)):
            raise TypeError(f"max_capacity: expected a positive int, got {type(max_capacity).__name__} "
                            f"{max_capacity!r}")
        if max_capacity <= 0:
            raise ValueError(f"max_capacity: must be > 0, got {max_capacity!r}")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction: expected one of {_REDUCTIONS}, got {reduction!r}")
        if isinstance(sampler, perx.Sampler):
            given = {"alpha": alpha, "eps": eps, "kappa": kappa}
            for arg, value in given.items():
                if value is not None:
                    raise ValueError(f"{arg}: give it to the perx sampler you pass, not to PerxSampler; got "
                                     f"{arg}={value!r} with sampler={sampler!r}")
        else:
            sampler = make_sampler(sampler, alpha=alpha, eps=eps, kappa=kappa)
        self._beta = _check_beta(beta)
        self._capacity = int(max_capacity)
        self.reduction = reduction
        self._rebuild = _rebuilder(sampler)  # makes a new unbound sampler like this one, for empty()
        self._buf = perx.ReplayBuffer(self._capacity, sampler, seed=seed, spec=_SPEC)
        #: fresh[s]: slot s holds an item written since its last priority update (it has the new-item priority)
        self._fresh = np.zeros(self._capacity, dtype=bool)
        self._zeros = np.zeros(self._capacity, dtype=np.uint8)

    # -- facts -------------------------------------------------------------------------------------------
    @property
    def max_size(self) -> int:
        return self._capacity

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def perx_sampler(self) -> perx.Sampler:
        """The perx sampler doing the work (read it; write priorities through this class)."""
        return self._buf.sampler

    @property
    def alpha(self) -> float | None:
        """The priority exponent of the perx sampler (None for uniform, greedy, hybrid); fixed."""
        value = getattr(self._buf.sampler, "alpha", None)
        return None if value is None else float(value)

    @alpha.setter
    def alpha(self, value: Any) -> None:
        raise ValueError(f"alpha: a perx sampler's alpha is fixed when it is built; build a new PerxSampler "
                         f"(got alpha={value!r})")

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: Any) -> None:
        self._beta = _check_beta(value)

    @property
    def default_priority(self) -> float:
        """The priority perx gives a new item: the maximal priority for proportional and LAP (raw, before
        alpha), 1 for uniform, +inf ("not yet replayed") for rank-based, greedy and hybrid. TorchRL passes it
        back through ``update_priority`` after ``TensorDictReplayBuffer.add``; for an item written since its
        last update that is a no-op, so it keeps exactly its new-item priority."""
        s = self._buf.sampler
        if isinstance(s, perx.Proportional):
            return float(s.max_priority)
        if isinstance(s, perx.Uniform):
            return 1.0
        return math.inf

    def __len__(self) -> int:
        return len(self._buf)

    def __repr__(self) -> str:
        return f"PerxSampler({self._buf.sampler!r}, max_capacity={self._capacity}, beta={self._beta})"

    def __getstate__(self) -> dict[str, Any]:
        # PrioritizedSampler refuses to be pickled for a spawned process; perx's state pickles fine.
        state = dict(self.__dict__)
        state["_rng"] = None
        return state

    # -- writes ------------------------------------------------------------------------------------------
    def _next_slots(self, n: int) -> np.ndarray:
        return (self._buf.next_index + np.arange(n, dtype=np.int64)) % self._capacity

    def _written(self, index: Any) -> None:
        slots = _as_slots(index)
        n = len(slots)
        if n == 0:
            return
        expected = self._next_slots(n)
        if not np.array_equal(slots, expected):
            raise ValueError(f"index: PerxSampler expected the next write at storage indices {_short(expected)} "
                             f"(a round-robin writer over a storage of max_size {self._capacity}), got "
                             f"{_short(slots)}; writers that write elsewhere (TensorDictMaxValueWriter, "
                             f"write_at, consuming samplers) or a storage written before the sampler was "
                             f"attached are not supported")
        zeros = self._zeros[:n] if n <= self._capacity else np.zeros(n, dtype=np.uint8)
        self._buf.extend(x=zeros)
        self._fresh[slots] = True

    def add(self, index: int | torch.Tensor) -> None:
        """TorchRL's notice that ``index`` was written: a new perx item at maximal priority."""
        self._written(index)

    def extend(self, index: torch.Tensor) -> None:
        """TorchRL's notice that ``index`` was written: new perx items at maximal priority."""
        self._written(index)

    def mark_update(self, index: int | torch.Tensor, *, storage: Any = None) -> None:
        """Give the items at ``index`` the new-item priority again (TorchRL's ``rb.mark_update``).

        TorchRL's writers call this for the slots they are about to hand to ``add``/``extend``: that notice
        is a no-op here, since the write itself gives the new items their priority. For other slots the
        proportional samplers (PER, LAP) set the maximal priority and uniform does nothing; rank-based,
        greedy and hybrid cannot put a replayed item back to "not yet replayed" and raise.
        """
        if storage is not None:
            self._check_storage(storage)
        slots = _as_slots(index)
        if len(slots) == 0 or np.array_equal(slots, self._next_slots(len(slots))):
            return
        ids = self._ids_of(slots)
        s = self._buf.sampler
        if isinstance(s, perx.Uniform):
            return
        if not isinstance(s, perx.Proportional):
            raise NotImplementedError(f"mark_update: {s.name} cannot give stored items the new-item priority "
                                      f"again; set one with update_priority(index, priority)")
        self._buf.set_priorities(ids, np.full(len(ids), s.max_priority))
        self._fresh[slots] = True

    # -- sampling ----------------------------------------------------------------------------------------
    def _check_storage(self, storage: Any) -> None:
        ndim = getattr(storage, "ndim", 1)
        if ndim != 1:
            raise ValueError(f"storage: PerxSampler supports 1-D storages only, got ndim={ndim}")
        size = getattr(storage, "max_size", None)
        if size is not None and int(size) != self._capacity:
            raise ValueError(f"storage: its max_size {size} differs from the sampler's max_capacity "
                             f"{self._capacity}")

    def sample(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draw ``batch_size`` storage indices; info holds ``priority_weight`` and ``perx_id``."""
        self._check_storage(storage)
        n = len(storage)
        if n == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        if n != len(self._buf):
            raise RuntimeError(f"storage: holds {n} items but PerxSampler saw {len(self._buf)} written through "
                               f"add/extend; attach it before writing, or restore it with load_state_dict/loads")
        batch = self._buf.sample(batch_size, beta=self._beta)
        ids = batch.indices
        index = torch.from_numpy(ids % self._capacity)
        info = {"priority_weight": torch.from_numpy(batch.weights.astype(np.float32)),
                "perx_id": torch.from_numpy(ids.copy())}
        return index, info

    def _ids_of(self, slots: np.ndarray) -> np.ndarray:
        """The perx ids now living in storage ``slots`` (which must hold data)."""
        size = len(self._buf)
        bad = (slots < 0) | (slots >= size)
        if bad.any():
            raise ValueError(f"index: {int(slots[bad][0])} is not a storage index holding data (the storage holds "
                             f"{size} items the sampler saw written: indices 0..{size - 1})")
        last = self._buf.next_index - 1
        return last - (last - slots) % self._capacity

    @staticmethod
    def _values(priority: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The priorities flat in their own dtype and as float64, broadcast to ``n`` values."""
        if isinstance(priority, torch.Tensor):
            p = priority.detach()
            if p.is_complex() or p.dtype == torch.bool:
                raise TypeError(f"priority: expected real numbers, got dtype {p.dtype}")
            if p.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
                p = p.float()
            arr = p.cpu().numpy()
        else:  # Python floats stay float64 (torch.as_tensor would round them to float32)
            arr = np.asarray(priority)
            if arr.dtype.kind not in "iuf":
                raise TypeError(f"priority: expected real numbers, got {type(priority).__name__} of dtype "
                                f"{arr.dtype}")
        if arr.size == 1:
            arr = np.broadcast_to(arr.reshape(1), (n,))
        elif arr.size == n:
            arr = arr.reshape(n)
        else:
            raise ValueError(f"priority: expected one value or one per index ({n}), got shape {tuple(arr.shape)}")
        return arr, arr.astype(np.float64)

    @staticmethod
    def _check_finite(values: np.ndarray, offsets: np.ndarray) -> None:
        bad = ~np.isfinite(values)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise ValueError(f"priority: must be finite, got {float(values[k])!r} at position {int(offsets[k])}")

    def update_priority(self, index: int | torch.Tensor, priority: float | torch.Tensor, *,
                        storage: Any = None) -> None:
        """Set the priorities of the items now at storage ``index`` from TD errors ``priority`` (any sign).

        Indices address storage slots, as in TorchRL: an update for a slot overwritten since it was sampled
        lands on the new item (use :meth:`update_by_id` with ``info["perx_id"]`` to skip such stale
        updates, perx's contract). Index -1 is skipped (TorchRL's ``MaxValueWriter`` convention). A call whose
        every value equals ``default_priority`` (what TorchRL's ``add`` sends) leaves the items written since
        their last update exactly at perx's new-item priority. Duplicates: the last wins.

        Raises:
            ValueError / TypeError: NaN or inf, wrong lengths, indices holding no data, non-integer indices;
                nothing is changed then.
        """
        if storage is not None:
            self._check_storage(storage)
        slots = _as_slots(index)
        n = len(slots)
        p, values = self._values(priority, n)
        offsets = np.arange(n)
        keep = slots != -1
        if not keep.all():
            slots, values, offsets, p = slots[keep], values[keep], offsets[keep], p[keep]
        if len(slots) == 0:
            return
        ids = self._ids_of(slots)
        fresh = self._fresh[slots]
        skip = fresh
        if fresh.any():
            # TorchRL's add (and its start-up for stored data) sends default_priority for every item, as a
            # float32 tensor: compared in the dtype it came in, and only when every value of the call is it
            default = self.default_priority
            kind = p.dtype if p.dtype.kind == "f" else np.float64
            if not (p == np.asarray(default, dtype=kind)).all():
                skip = np.zeros_like(fresh)
        if skip.any():
            apply = ~skip
            ids, slots, values, offsets = ids[apply], slots[apply], values[apply], offsets[apply]
        self._check_finite(values, offsets)
        self._buf.update_priorities(ids, values)
        self._fresh[slots] = False

    def update_by_id(self, perx_id: Any, priority: Any) -> int:
        """perx's stale-safe update: ``perx_id`` from ``info["perx_id"]`` (a ``TensorDictReplayBuffer`` puts it
        in the batch as ``"perx_id"``), ``priority`` the TD errors. Items overwritten since they were sampled
        are skipped. Returns how many were applied."""
        ids = _as_slots(perx_id, "perx_id")
        _, values = self._values(priority, len(ids))
        issued = self._buf.next_index
        bad = (ids < 0) | (ids >= issued)
        if bad.any():
            raise ValueError(f"perx_id: {int(ids[bad][0])} was never issued (ids so far: 0..{issued - 1})")
        self._check_finite(values, np.arange(len(ids)))
        applied = self._buf.update_priorities(ids, values)
        live = ids >= issued - self._capacity
        self._fresh[ids[live] % self._capacity] = False
        return applied

    def probabilities(self, index: Any = None, batch_size: int | None = None) -> torch.Tensor:
        """Exact per-draw probabilities P(i) (float64) of the items at storage ``index``, or of every stored
        item in storage order. ``batch_size`` for rank-based (segments) and greedy (top-k)."""
        if index is None:
            return torch.from_numpy(self._buf.probabilities(None, batch_size))
        return torch.from_numpy(self._buf.probabilities(self._ids_of(_as_slots(index)), batch_size))

    def priorities(self, index: Any) -> torch.Tensor:
        """Stored raw priorities (|delta| + eps, LAP's floor; before alpha) of the items at storage ``index``;
        +inf for items rank-based and greedy have not replayed yet (float64)."""
        return torch.from_numpy(self._buf.priorities(self._ids_of(_as_slots(index))))

    # -- state -------------------------------------------------------------------------------------------
    def _empty(self) -> None:
        seed = int(self._buf.sampler.rng.integers(2**63))  # the next stream continues the old one's
        self._buf = perx.ReplayBuffer(self._capacity, self._rebuild(), seed=seed, spec=_SPEC)
        self._fresh[:] = False

    def _adopt(self, buf: perx.ReplayBuffer, fresh: np.ndarray, beta: Any, where: str) -> None:
        """Replace the state after checking all of it (a refused state changes nothing)."""
        mine, theirs = self._buf.sampler, buf.sampler
        same = (buf.capacity == self._capacity and theirs.name == mine.name
                and json.dumps(theirs.config(), sort_keys=True) == json.dumps(mine.config(), sort_keys=True))
        if not same:
            raise ValueError(f"{where}: saved by a PerxSampler({theirs!r}, max_capacity={buf.capacity}), cannot "
                             f"load into PerxSampler({mine!r}, max_capacity={self._capacity})")
        fresh = np.asarray(fresh)
        if fresh.dtype.kind not in "iu" or fresh.ndim != 1 or ((fresh < 0) | (fresh >= len(buf))).any():
            raise ValueError(f"{where}: the list of fresh slots is damaged (dtype {fresh.dtype}, shape "
                             f"{fresh.shape}, {len(buf)} items stored)")
        beta = _check_beta(beta)
        mask = np.zeros(self._capacity, dtype=bool)
        mask[fresh] = True
        self._buf, self._fresh, self._beta = buf, mask, beta

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state as tensors and numbers (``torch.load(..., weights_only=True)`` reads it): perx's
        saved buffer (priorities, max priority, counter, generator) as bytes, the fresh slots and beta."""
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / _BUFFER_FILE
            self._buf.save(path)
            data = bytearray(path.read_bytes())
        return {"format": _FORMAT, "perx_buffer": torch.frombuffer(data, dtype=torch.uint8),
                "fresh": torch.from_numpy(np.flatnonzero(self._fresh).astype(np.int64)), "beta": self._beta}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; perx checks the saved buffer as untrusted input."""
        if not isinstance(state_dict, dict) or state_dict.get("format") != _FORMAT:
            raise ValueError(f"state_dict: not a PerxSampler state (expected format {_FORMAT!r})")
        blob = state_dict.get("perx_buffer")
        fresh = state_dict.get("fresh")
        if not isinstance(blob, torch.Tensor) or blob.dtype != torch.uint8 or blob.ndim != 1:
            raise ValueError("state_dict: 'perx_buffer' must be a 1-D uint8 tensor")
        if not isinstance(fresh, torch.Tensor):
            raise ValueError("state_dict: 'fresh' must be a tensor of storage indices")
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / _BUFFER_FILE
            path.write_bytes(blob.cpu().numpy().tobytes())
            try:
                buf = perx.ReplayBuffer.load(path)
            except ValueError as err:
                raise ValueError(f"state_dict: the saved perx buffer is damaged: {err}") from None
        self._adopt(buf, fresh.cpu().numpy(), state_dict.get("beta"), "state_dict")

    def dumps(self, path: str | Path) -> None:
        """Write the state into the folder ``path`` (TorchRL's ``rb.dumps`` gives ``<folder>/sampler``)."""
        path = Path(path).absolute()
        path.mkdir(parents=True, exist_ok=True)
        self._buf.save(path / _BUFFER_FILE)
        np.save(path / _FRESH_FILE, np.flatnonzero(self._fresh).astype(np.int64), allow_pickle=False)
        (path / _META_FILE).write_text(json.dumps({"format": _FORMAT, "beta": self._beta}))

    def loads(self, path: str | Path) -> None:
        """Restore what :meth:`dumps` wrote to ``path``."""
        path = Path(path).absolute()
        meta = json.loads((path / _META_FILE).read_text())
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            raise ValueError(f"path: {str(path)!r} holds no PerxSampler state (expected format {_FORMAT!r})")
        buf = perx.ReplayBuffer.load(path / _BUFFER_FILE)
        try:
            fresh = np.load(path / _FRESH_FILE, allow_pickle=False)
        except ValueError as err:
            raise ValueError(f"path: {str(path / _FRESH_FILE)!r} is damaged: {err}") from None
        self._adopt(buf, fresh, meta.get("beta"), f"path {str(path)!r}")
