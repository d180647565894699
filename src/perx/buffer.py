"""The replay buffer: a circular storage of named fields composed with a sampler.

Indices handed out (by ``add``, ``extend`` and ``sample``) are monotonic insertion ids, int64. An
update whose id has since been overwritten is skipped and not counted (stale), so priorities never
land on the wrong transition, with no extra argument (see :mod:`perx.storage`).

Invariant: every public method either succeeds or raises before changing anything.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import mmap
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Literal, cast

import numpy as np

from perx import _format, _mmap
from perx._mmap import MappedFolder
from perx._nested import _NOT_DICT, DictLayout, check_keys, dict_keys, flat_name, is_dict
from perx.episodes import RESERVED, DictEpisodeStore, Episodes, EpisodeStore
from perx.samplers.base import FLOAT64 as _FLOAT64
from perx.samplers.base import INT64 as _INT64
from perx.samplers.base import Sampler, check_sampler, make_generator, stored_priorities
from perx.samplers.uniform import Uniform
from perx.storage import FieldSpec, Storage, _parse_spec
from perx.validation import (
    _short,
    as_index_array,
    as_value_array,
    check_batch_size,
    check_bool,
    check_capacity,
    check_real,
)

# add's id array: np.empty plus one store, with no list to build and convert as np.array([i], np.int64) has
# (measured: docs/history/speed.md, change 24)
_empty = np.empty
_int64 = np.int64

class Batch(Mapping):
    """A sampled batch: ``batch["obs"]`` etc. ([B, *shape] arrays), plus metadata.

    A dict field (``obs={"observation": ..., "desired_goal": ...}``) comes back as a dict of [B, *shape] arrays,
    ``batch["obs"]["observation"]``; its stored name ``batch["obs.observation"]`` gives the same array.

    Attributes:
        indices: int64 [B] insertion ids, for ``update_priorities``.
        weights: float64 [B] importance-sampling weights (all 1 for uniform sampling).
        probabilities: float64 [B] exact P(i) of each returned transition under the current priorities.
        data: dict of field name -> array (a dict field: name -> dict of key -> array).
    """

    __slots__ = ("_fill", "data", "indices", "probabilities", "weights")

    def __init__(self, data: dict[str, np.ndarray], indices: np.ndarray, weights: np.ndarray,
                 probabilities: np.ndarray) -> None:
        self.data = data
        self.indices = indices
        self.weights = weights
        self.probabilities = probabilities
        #: for ``sample(out=...)``: the refill record of a batch drawn and copied in one compiled call, a list
        #: indexed by _RAW, _LAYOUT, _B, _ARRAYS, _DATA, _PAIRS (below); else None
        self._fill: list[Any] | None = None

    def __reduce__(self):
        # a copy or an unpickled batch holds copies of the arrays, not views of one allocation: not refillable
        return Batch, (self.data, self.indices, self.weights, self.probabilities)

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return self.data[key]
        except KeyError:
            found = _flat_lookup(self.data, key)
            if found is None:
                raise
            return found

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.indices)

    def __repr__(self) -> str:
        def describe(v):
            if isinstance(v, dict):
                return "{" + ", ".join(f"{k}: {describe(a)}" for k, a in v.items()) + "}"
            return f"{v.dtype}{list(v.shape)}"

        fields = ", ".join(f"{k}: {describe(v)}" for k, v in self.data.items())
        return f"Batch(size={len(self)}, {fields})"


#: Positions in ``Batch._fill``: the one allocation every array of a fused batch views (uint8); the row layout of
#: the storage that filled it; B; the batch's arrays as ``_RowLayout.pick`` gave them (ids, probabilities, weights,
#: fields); its data dict; data's (name, array) pairs, or None until the first refill. A list rather than an object
#: with named attributes: one is made at every fused sample, and a list display costs a fraction of a constructor.
_RAW, _LAYOUT, _B, _ARRAYS, _DATA, _PAIRS = range(6)


def _flat_lookup(data: dict, name: object) -> np.ndarray | None:
    """``data[field][key]`` for a stored name ``field.key`` of a dict field, else None."""
    if not isinstance(name, str):
        return None
    at = name.find(".")
    while at > 0:
        group = data.get(name[:at])
        if isinstance(group, dict) and name[at + 1:] in group:
            return group[name[at + 1:]]
        at = name.find(".", at + 1)
    return None


class ReplayBuffer:
    """Experience replay with any perx sampler (uniform, proportional PER, ...).

    Args:
        capacity: number of transitions kept; the oldest is overwritten first. Must be > 0.
        sampler: the replay strategy, e.g. ``perx.Proportional(alpha=0.6)``; default ``perx.Uniform()``.
            A sampler belongs to one buffer.
        seed: if given, reseeds the sampler's generator with ``np.random.default_rng(seed)``.
        spec: optional ``{name: (shape, dtype)}`` fixing the fields up front; otherwise the first
            ``add``/``extend`` fixes them. ``terminated`` and ``truncated`` are ordinary fields. A dict
            field (a Gymnasium ``Dict`` observation) is ``{name: {key: (shape, dtype), ...}}``, and is given
            to ``add``/``extend`` as a dict of arrays, one per key (see :mod:`perx._nested`).
        episodes: a :class:`perx.Episodes` to link steps into episodes: n-step returns, next
            observations and frame stacks stored once, several streams (vector envs). Steps then
            need the fields ``obs``, ``next_obs``, ``reward``, ``terminated`` and ``truncated``, and
            ``add``/``extend`` take ``stream=`` (which sub-environment each step comes from).
        lock: make every public method hold one reentrant lock (``buf.lock``), so threads can share
            the buffer (an actor extending while a learner samples and updates). Off by default, and
            then it costs nothing: a buffer without it must be used by one thread at a time, because
            the compiled kernels release the GIL. Hold ``buf.lock`` yourself to make several calls
            one atomic step.
        memmap: a folder (new, or empty) to keep the stored fields in files on disk instead of RAM, mapped
            into memory (``.npy`` files; with ``episodes`` that store observations once, their ring too), so
            the buffer may be larger than RAM. Sampler trees, priorities and episode links stay in RAM.
            :meth:`close` (or a normal interpreter exit) writes the rest of the state beside the files, and
            :meth:`open` reopens the folder exactly; a folder whose process was killed before closing it is
            refused (:mod:`perx._mmap` says why). Sampling and updates are unchanged; their cost depends on
            how much of the files the page cache holds (docs/design.md, "Buffers on disk").

    Example:
        >>> buf = ReplayBuffer(capacity=1000, sampler=perx.Proportional(alpha=0.6), seed=0)
        >>> idx = buf.add(obs=o, action=a, reward=r, next_obs=o2, terminated=False, truncated=False)
        >>> batch = buf.sample(32, beta=0.4)
        >>> buf.update_priorities(batch.indices, td_errors)
    """

    #: For an episodic buffer's dict observations, packed one unit per observation (``_packed``): their layout and
    #: the check of each key's values (shape, dtype, casts) before packing. None until ``_set_dicts`` packs them,
    #: and read only while ``_packed`` names fields. Typed as set, since the write path reads them without
    #: narrowing (no per-call checks).
    _layout: DictLayout
    _key_check: Storage

    def __init__(self, capacity: int, sampler: Sampler | None = None, *, seed: int | None = None,
                 spec: Mapping | None = None, episodes: Episodes | None = None, lock: bool = False,
                 memmap: str | os.PathLike | MappedFolder | None = None) -> None:
        capacity = check_capacity(capacity)
        sampler = Uniform() if sampler is None else check_sampler(sampler)
        check_bool(lock, "lock")
        if episodes is not None and not isinstance(episodes, Episodes):
            raise TypeError(f"episodes: expected perx.Episodes(...) or None, got {_short(episodes)}")
        if memmap is not None and episodes is not None and getattr(episodes, "compress", None):
            raise ValueError(f"memmap: a compressed observation ring (episodes compress={episodes.compress!r}) is kept "
                             f"in RAM; use one or the other, got memmap={_short(memmap)}")
        dicts: dict[str, tuple[str, ...]] = {}
        layout: DictLayout | None = None
        if spec is not None and isinstance(spec, Mapping) and any(isinstance(v, Mapping) for v in spec.values()):
            spec, dicts, layout = _split_spec(spec, episodes)
        obs_spec = None
        if spec is not None and episodes is not None and episodes.shared:
            # observations live in the episode store; the storage keeps the other fields
            spec = _parse_spec(spec)
            names = (episodes.obs, episodes.next_name)
            given = [n for n in names if n in spec]
            if len(given) == 1:
                raise ValueError(f"spec: give both {names} or neither (then the first add fixes them), got only "
                                 f"{given}")
            if given:
                if spec[names[0]] != spec[names[1]]:
                    raise ValueError(f"spec: {names[0]} and {names[1]} must have the same shape and dtype")
                obs_spec = {n: spec[n] for n in names}
                spec = {n: f for n, f in spec.items() if n not in names} or None
        if seed is not None:  # checked before the sampler is bound, so a refused seed leaves it reusable
            make_generator(seed)
        if sampler.capacity is not None:  # (as _bind checks, but before a memmap folder is created)
            raise ValueError(f"sampler: {sampler!r} is already bound to a buffer; create a new sampler")
        mapped = memmap if isinstance(memmap, MappedFolder) or memmap is None else MappedFolder(memmap, reopen=False)
        try:
            storage = Storage(capacity, spec, mapped=mapped)
            store = None
            if episodes is not None:
                store = EpisodeStore(capacity, episodes) if layout is None else \
                    DictEpisodeStore(capacity, episodes, layout)
                store.mapped = mapped
                if storage.spec is not None:
                    store.check_spec(storage.spec)
                if obs_spec is not None:
                    store.allocate(obs_spec[episodes.obs].shape, obs_spec[episodes.obs].dtype)
            sampler._bind(capacity)
        except BaseException:
            if mapped is not None and not mapped.reopen:
                mapped.discard()  # a refused buffer leaves no folder behind
            raise
        if seed is not None:
            sampler.reseed(seed)
        self._storage = storage
        self.sampler = sampler
        #: The episode configuration (:class:`perx.Episodes`), or None for independent transitions.
        self.episodes = episodes
        self._episodes = store
        # validates and converts observations (shape, dtype, casts) before they reach the episode store
        self._obs_check = Storage(1, obs_spec) if episodes is not None and episodes.shared else None
        # Dict fields (perx._nested): name -> keys; the stored name of each key of a dict field kept as fields of
        # its own -> (name, key); and for an episodic buffer's dict observations, packed one unit per observation:
        # their names, their layout and the check of each key's values (shape, dtype, casts) before packing.
        self._dicts: dict[str, tuple[str, ...]] = {}
        self._stored_names: dict[str, tuple[tuple[str, str], ...]] = {}  # name -> ((key, stored name), ...)
        self._owner: dict[str, tuple[str, str]] = {}
        self._packed: tuple[str, ...] = ()
        self._layout = None  # type: ignore[assignment]  # (see the class's declaration)
        self._key_check = None  # type: ignore[assignment]
        if dicts:
            self._set_dicts(dicts, layout)
        #: True until every field's layout is fixed (the first add, or spec=): dict fields may still appear.
        self._open = self._layout_open()
        #: The buffer's ``threading.RLock`` with ``lock=True``, else None.
        self.lock = threading.RLock() if lock else None
        #: The folder of a memmap buffer's files (``memmap=``), or None.
        self._mapped = mapped
        self._closed = False
        self._install()
        if mapped is not None and not mapped.reopen:  # (ReplayBuffer.open registers it once it is loaded)
            _mmap.register(self)

    def _layout_open(self) -> bool:
        return self._storage.spec is None or (self._obs_check is not None and self._obs_check.spec is None)

    def _install(self) -> None:
        """Set the instance attributes that shadow methods. Buffers with dict fields (or whose fields are not fixed
        yet) write through ``_write_nested``, and buffers with dict fields sample through ``_sample_nested`` and
        ``_get_nested``; with ``lock=True`` every public method holds the lock. A buffer with neither has no such
        attribute, so its methods cost nothing more."""
        attrs = vars(self)
        for name in (*_NESTED, *_LOCKED):
            attrs.pop(name, None)
        if attrs.get("_closed"):
            for name in (*_NESTED, *_LOCKED):
                setattr(self, name, functools.partial(_refuse_closed, name, self.memmap))
            return
        # (methods shadowed deliberately: mypy refuses assigning to a method)
        if self._open or self._dicts:
            self._write = self._write_nested  # type: ignore[method-assign]
        if self._dicts:  # (add and extend: their fast paths would take a dict field's stored names as given)
            self.add = self._add_nested  # type: ignore[method-assign]
            self.extend = self._extend_nested  # type: ignore[method-assign]
            self.sample = self._sample_nested  # type: ignore[method-assign]
            self.get = self._get_nested  # type: ignore[method-assign]
        if self.lock is not None:
            for name in _LOCKED:
                setattr(self, name, _locked(getattr(self, name), self.lock))

    def __copy__(self) -> ReplayBuffer:
        """``copy.copy(buf)`` is an independent copy, as ``copy.deepcopy``: a shallow copy would share the
        rows, trees and generator with the original but not its lock, so two threads could write one buffer
        under two locks. (A memmap buffer cannot be copied: its rows are files; ``save()`` writes a copy.)"""

        with self.lock if self.lock is not None else contextlib.nullcontext():  # (not torn by another thread)
            return copy.deepcopy(self)

    def __getstate__(self) -> dict:
        # a lock (and the locked methods around it) cannot be pickled: a copy or an unpickled buffer gets a
        # new lock of its own. Hold ``buf.lock`` while pickling if other threads may write meanwhile. The methods
        # shadowed by instance attributes are installed again.
        state = dict(self.__dict__)
        for name in (*_NESTED, *_LOCKED):
            state.pop(name, None)
        if state.get("lock") is not None:
            state["lock"] = True
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if state.get("lock") is True:
            self.lock = threading.RLock()
        for name, default in (("_dicts", {}), ("_stored_names", {}), ("_owner", {}), ("_packed", ()), ("_layout", None),
                              ("_key_check", None)):
            self.__dict__.setdefault(name, default)  # pickled by an earlier perx
        self.__dict__.setdefault("_open", self._layout_open())
        self._install()

    # -- dict fields -----------------------------------------------------------------------------
    def _set_dicts(self, dicts: Mapping[str, tuple[str, ...] | dict], layout: DictLayout | None) -> None:
        """Take these dict fields (name -> keys); ``layout`` packs an episodic buffer's dict observations (then the
        episode store becomes a :class:`DictEpisodeStore`: only while nothing is stored). Attributes are replaced,
        never changed in place, so that a refused first add can put the old ones back."""
        cfg = self.episodes
        packed = tuple(n for n in (cfg.obs, cfg.next_name) if n in dicts) if cfg is not None else ()
        self._dicts = {**self._dicts, **{n: tuple(keys) for n, keys in dicts.items()}}
        self._stored_names = {n: tuple((k, flat_name(n, k)) for k in keys) for n, keys in self._dicts.items()}
        owner = dict(self._owner)
        for name, keys in dicts.items():
            if name not in packed:
                owner.update((flat_name(name, k), (name, k)) for k in keys)
        self._owner = owner
        self._storage.owners = owner
        if packed:  # (an episodic buffer, and the layout that packs its observations)
            cfg, layout = cast(Episodes, cfg), cast(DictLayout, layout)
            self._packed = packed
            self._layout = layout
            self._key_check = Storage(1, {flat_name(n, k): f for n in packed for k, f in layout.keys.items()})
            self._key_check.owners = {flat_name(n, k): (n, k) for n in packed for k in layout.keys}
            if not isinstance(self._episodes, DictEpisodeStore):
                store = DictEpisodeStore(self.capacity, cfg, layout)
                # a memmap buffer's observation ring lives in its folder, as the plain store's would have
                store.mapped = self._episodes.mapped if self._episodes is not None else None
                self._episodes = store

    def _nested_state(self) -> tuple:
        return (self._dicts, self._stored_names, self._owner, self._packed, self._layout, self._key_check,
                self._episodes)

    def _restore_nested(self, saved: tuple) -> None:
        (self._dicts, self._stored_names, self._owner, self._packed, self._layout, self._key_check,
         self._episodes) = saved
        self._storage.owners = self._owner

    def _learn_dicts(self, fields: dict, batched: bool) -> None:
        """While the layout is open (the first add): take the dict fields that ``fields`` brings, or raise."""
        cfg = self.episodes
        open_names = None  # None: every field is open
        if self._storage.spec is not None:  # only a shared observation is still open
            open_names = (cfg.obs, cfg.next_name) if cfg is not None else ()
        new = {}
        for name, value in fields.items():
            if is_dict(value) and name not in self._dicts and (open_names is None or name in open_names):
                new[name] = dict_keys(name, value)
        if not new:
            return
        layout = None
        if cfg is not None:
            for name in new:
                if name in RESERVED or name in ("reward", "terminated", "truncated"):
                    raise TypeError(f"{name}: an episodic buffer needs {name!r} as a plain field, got a dict")
            names = [n for n in (cfg.obs, cfg.next_name) if n in fields]
            packed = [n for n in names if n in new]
            if packed:
                plain = [n for n in names if n not in new]
                if plain:
                    raise TypeError(f"{plain[0]}: {packed[0]} is a dict, so {plain[0]} must be one with the same keys, "
                                    f"got {_short(fields[plain[0]])}")
                src = packed[0]
                for name in packed[1:]:
                    check_keys(name, fields[name], new[src])
                unit = Storage(1)._infer_spec({flat_name(src, k): fields[src][k] for k in new[src]}, batched)
                layout = DictLayout(src, {k: unit[flat_name(src, k)] for k in new[src]}, cfg.frame_stack)
        self._set_dicts(new, layout)
        if layout is not None:  # (_set_dicts made the check of the keys)
            self._key_check.inferred = True

    def _flatten(self, fields: dict, batched: bool) -> dict:
        """``fields`` with every dict field as fields of its own (``field.key``), and an episodic buffer's dict
        observations checked key by key and packed. Raises (naming the field and the key) for a dict where a plain
        field is, a plain value where a dict field is, missing or unexpected keys, and (through the checks of the
        storage) a key's shape or dtype that does not fit."""
        names, owner, packed = self._stored_names, self._owner, self._packed
        flat = {}
        keyed: dict[str, Any] | None = None
        for name, value in fields.items():
            pairs = names.get(name)
            kind = type(value)
            if pairs is None:
                if kind is dict or (kind not in _NOT_DICT and is_dict(value)):
                    raise TypeError(f"{name}: got a dict (keys {_short(list(value))}) but {name} is not a dict field "
                                    f"of this buffer; give it as an array")
                if name in owner or (packed and "." in name and self._packed_key(name)):
                    field, key = cast(tuple[str, str], owner.get(name) or self._packed_key(name))
                    raise ValueError(f"{name}: is key {key!r} of the dict field {field}; give {field}={{...}} with all "
                                     f"its keys")
                flat[name] = value
                continue
            if kind is not dict and not is_dict(value):
                raise TypeError(f"{name}: is a dict field with the keys {[k for k, _ in pairs]}; give a dict of "
                                f"arrays, got {_short(value)}")
            if name in packed:
                keyed = {} if keyed is None else keyed
                target = keyed
                flat[name] = None  # packed below, in this place
            else:
                target = flat
            try:
                for key, stored in pairs:
                    item = value[key]
                    kind = type(item)
                    if kind is dict or (kind not in _NOT_DICT and is_dict(item)):
                        raise KeyError(key)  # a nested dict: check_keys says so
                    if target is flat and stored in fields:
                        raise ValueError(f"{stored}: given twice, as a field and as key {key!r} of the dict field "
                                         f"{name}")
                    target[stored] = item
            except KeyError:
                pass
            else:
                if len(value) == len(pairs):
                    continue
            check_keys(name, value, self._dicts[name])  # raises, naming the keys
            raise AssertionError("unreachable")
        if packed:
            missing = [n for n in packed if n not in fields]
            if missing:
                raise ValueError(f"fields: missing {missing}, dicts with the keys {list(self._layout.keys)}")
            # (keyed is set: every packed name is among the fields)
            arrays, rows, _ = self._key_check.prepare(keyed, batched=batched)  # type: ignore[arg-type]
            layout = self._layout
            lead = ((rows,) if batched else ()) + ((layout.frames,) if layout.frames else ())
            for name in packed:
                flat[name] = layout.pack({k: arrays[stored] for k, stored in names[name]}, lead)
        return flat

    def _packed_key(self, name: str) -> tuple[str, str] | None:
        for field in self._packed:
            if name.startswith(field + ".") and name[len(field) + 1:] in self._layout.keys:
                return field, name[len(field) + 1:]
        return None

    def _write_nested(self, fields: dict, stream: Any, *, batched: bool) -> np.ndarray:
        """``_write`` of a buffer with dict fields, or whose fields are not fixed yet (installed by ``_install``)."""
        if not self._open:
            return self._write_flat(self._flatten(fields, batched), stream, batched)
        saved = self._nested_state()
        try:
            self._learn_dicts(fields, batched)
            ids = self._write_flat(self._flatten(fields, batched), stream, batched)
        except BaseException:
            self._restore_nested(saved)
            raise
        if self._layout_open():  # an empty extend fixes nothing, dict fields included
            self._restore_nested(saved)
            return ids
        self._open = False
        self._install()
        return ids

    def _write_flat(self, fields: dict, stream: Any, batched: bool) -> np.ndarray:
        if stream is None and self._episodes is None:  # add's and extend's fast paths
            storage = self._storage
            if batched:
                start = storage.write_batch(fields)
                if start is not None:
                    ids = np.arange(start, storage.next_id, dtype=_int64)
                    self.sampler.on_add_range(start % storage.capacity, ids)
                    return ids
            else:
                i = storage.write_one(fields)
                if i is not None:
                    self.sampler.on_add_one(i % storage.capacity, i)
                    return np.array([i], _int64)
        return ReplayBuffer._write(self, fields, stream, batched=batched)

    def _nest(self, data: dict) -> dict:
        """A batch's fields with the keys of each dict field kept as fields of their own gathered into a dict
        (the episode store already gave dict observations as dicts)."""
        owner = self._owner
        if not owner:
            return data
        out = {}
        for name, value in data.items():
            where = owner.get(name)
            if where is None:
                out[name] = value
            else:
                group = out.get(where[0])
                if group is None:
                    group = out[where[0]] = {}
                group[where[1]] = value
        return out

    def _add_nested(self, *, stream: Any = None, **transition: Any) -> np.ndarray:
        return self._write_nested(transition, stream, batched=False)

    def _extend_nested(self, *, stream: Any = None, **transitions: Any) -> np.ndarray:
        return self._write_nested(transitions, stream, batched=True)

    def _sample_nested(self, batch_size: int, beta: float = 1.0, *, replace: bool = True, out: Batch | None = None
                       ) -> Batch:
        batch = ReplayBuffer.sample(self, batch_size, beta, replace=replace, out=out)
        batch.data = self._nest(batch.data)
        return batch

    def _get_nested(self, indices) -> Batch:
        batch = ReplayBuffer.get(self, indices)
        batch.data = self._nest(batch.data)
        return batch

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
    def spec(self) -> dict[str, FieldSpec | dict[str, FieldSpec]] | None:
        """The fields' shapes and dtypes (None before the first add without ``spec=``); a dict field maps to a
        dict of key -> FieldSpec."""
        if self._obs_check is None or self._obs_check.spec is None:
            flat = self._storage.spec
        else:
            flat = {**(self._storage.spec or {}), **self._obs_check.spec}
        if flat is None or not self._dicts:
            return flat  # type: ignore[return-value]  # (plain fields only: dict is invariant)
        out: dict[str, FieldSpec | dict[str, FieldSpec]] = {}
        for name, f in flat.items():
            where = self._owner.get(name)
            if where is not None:
                cast(dict, out.setdefault(where[0], {}))[where[1]] = f  # (a dict field's entry)
            elif name in self._packed:
                out[name] = dict(self._layout.keys)
            else:
                out[name] = f
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the field arrays, the sampler's arrays and (episodic buffers) the episode store."""
        extra = self._episodes.nbytes if self._episodes is not None else 0
        return self._storage.nbytes + self.sampler.nbytes + extra

    def __repr__(self) -> str:
        return f"ReplayBuffer(capacity={self.capacity}, size={len(self)}, sampler={self.sampler!r})"

    # -- writing ---------------------------------------------------------------------------------
    def add(self, *, stream: Any = None, **transition: Any) -> np.ndarray:
        """Store one transition at maximal priority. O(fields + log N).

        ``stream``: for a buffer with :class:`perx.Episodes`, which stream (sub-environment) the step
        comes from; else not allowed.

        Returns:
            int64 [1]: its id, usable with ``update_priorities`` and ``set_priorities``.

        Raises:
            ValueError / TypeError: missing or extra fields, wrong shapes, unsafe dtypes, values that do
                not fit; for episodic buffers also a bad stream id or a step that does not continue its
                stream's episode. Nothing is stored then.
        """
        if stream is None and self._episodes is None:
            i = self._storage.write_one(transition)
            if i is not None:  # the common case: values that need no conversion check
                self.sampler.on_add_one(i % self._storage.capacity, i)
                ids = _empty(1, _int64)
                ids[0] = i
                return ids
        return self._write(transition, stream, batched=False)

    def extend(self, *, stream: Any = None, **transitions: Any) -> np.ndarray:
        """Store a batch of transitions (axis 0 = batch) at maximal priority, without a Python loop.

        ``stream``: for a buffer with :class:`perx.Episodes`, an int [n] (or one int) saying which
        stream each row comes from; rows of one stream are in time order.

        Returns:
            int64 [n]: their ids in order. If n > capacity only the last ``capacity`` are kept and the
            earlier ids are stale at once.

        Raises:
            ValueError / TypeError: as ``add``, or fields with different batch lengths; nothing is
                stored then.
        """
        if stream is None and self._episodes is None:
            storage = self._storage
            start = storage.write_batch(transitions)
            if start is not None:  # the common case: arrays that need no conversion, no wrap round the ring
                ids = np.arange(start, storage.next_id, dtype=_int64)
                self.sampler.on_add_range(start % storage.capacity, ids)
                return ids
        return self._write(transitions, stream, batched=True)

    def _write(self, fields: dict, stream: Any, *, batched: bool) -> np.ndarray:
        store = self._episodes
        storage = self._storage
        if store is None:
            if stream is not None:
                raise ValueError("stream: only buffers with episodes=perx.Episodes(...) take stream ids")
            arrays, rows, new_spec = storage.prepare(fields, batched=batched)
            if rows == 0:
                return np.empty(0, np.int64)
            ids, slots = storage.write(arrays, rows, new_spec, batched=batched)
            self.sampler.on_add(slots, ids[rows - len(slots):])
            return ids
        return self._write_episodes(store, fields, stream, batched)

    def _write_episodes(self, store: EpisodeStore, fields: dict, stream: Any, batched: bool) -> np.ndarray:
        cfg, storage = store.cfg, self._storage
        obs = nxt = None
        obs_new = None
        if cfg.shared:
            names = (cfg.obs, cfg.next_name)
            missing = [n for n in names if n not in fields]
            if missing:
                raise ValueError(f"fields: an episodic buffer needs {missing}")
            obs_fields = {n: fields[n] for n in names}
            fields = {n: v for n, v in fields.items() if n not in names}
            checker: Storage = self._obs_check  # type: ignore[assignment]  # set in shared mode
            if checker.spec is None:
                # the first add fixes one layout for both, from obs; next_obs is then cast and checked against it
                unit = checker._infer_spec({cfg.obs: obs_fields[cfg.obs]}, batched)[cfg.obs]
                store.check_obs(unit.shape, unit.dtype)
                obs_new = {cfg.obs: unit, cfg.next_name: unit}
                checker = Storage(1, obs_new)
            obs_arrays, obs_rows, _ = checker.prepare(obs_fields, batched=batched)
            obs, nxt = (obs_arrays[n] if batched else obs_arrays[n][None] for n in names)
        arrays, rows, new_spec = storage.prepare(fields, batched=batched)
        if new_spec is not None:  # a fixed layout was checked when it was fixed (first add, spec=, load)
            store.check_spec(new_spec)
        if cfg.shared and obs_rows != rows:
            raise ValueError(f"{cfg.obs}: has {obs_rows} rows but the other fields have {rows}")
        if rows == 0:
            return np.empty(0, np.int64)
        term = arrays["terminated"] if batched else arrays["terminated"][None]
        trunc = arrays["truncated"] if batched else arrays["truncated"][None]
        next_id = storage.next_id
        stored_next = None
        if not cfg.shared and cfg.check:
            obs, nxt = arrays[cfg.obs], arrays[cfg.next_name]
            if not batched:
                obs, nxt = obs[None], nxt[None]
            stored_next = storage.data.get(cfg.next_name)
        plan = store.prepare(obs, nxt, term, trunc, stream, rows, next_id, stored_next)
        # Everything is validated. Allocate what this first add fixes (all or nothing), then write: from
        # here on nothing can fail.
        if new_spec is not None or obs_new is not None:
            try:
                if new_spec is not None:
                    storage._allocate(new_spec)
                if obs_new is not None:
                    store.allocate(obs_new[cfg.obs].shape, obs_new[cfg.obs].dtype)
            except MemoryError:
                if new_spec is not None:  # all or nothing: give the storage's new arrays back too
                    storage.spec, storage.data, storage._castable = None, {}, {}
                raise
            if new_spec is not None:
                storage.inferred = True
            if obs_new is not None:
                obs_check = cast(Storage, self._obs_check)  # (shared mode)
                obs_check._allocate(obs_new)
                obs_check.inferred = True
        ids, slots = storage.write(arrays, rows, None, batched=batched)
        store.write(plan, ids, slots, next_id)
        self.sampler.on_add(slots, ids[rows - len(slots):])
        return ids

    def end_episodes(self, streams: Any = None) -> int:
        """End the episodes still open in ``streams`` (default: all) at their newest stored steps.

        For a buffer with :class:`perx.Episodes` whose environment was reset in the middle of an
        episode: those steps are marked truncated (so n-step windows stop there and bootstrap from their
        next observation), and the streams' next steps start new episodes. ``perx.gym.VectorRecorder``
        calls it on every reset. Returns how many stored steps were marked.
        """
        store = self._episodes
        if store is None:
            raise ValueError("end_episodes: only buffers with episodes=perx.Episodes(...) have episodes")
        cfg = store.cfg
        if streams is None:
            e = np.arange(cfg.streams)
        else:
            e = np.atleast_1d(as_index_array(streams, "streams"))
            if len(e) and (e.min() < 0 or e.max() >= cfg.streams):
                raise ValueError(f"streams: ids must lie in [0, {cfg.streams}), got {_short(streams)}")
        if self._storage.spec is None:
            return 0
        return store.end_episodes(e, self._storage.data, self._storage.next_id)

    # -- sampling --------------------------------------------------------------------------------
    def sample(self, batch_size: int, beta: float = 1.0, *, replace: bool = True, out: Batch | None = None
               ) -> Batch:
        """Draw a batch with replacement, with IS weights for exponent ``beta``.

        Args:
            batch_size: B > 0.
            beta: IS exponent in [0, 1] (000 Sec. 3.4); default 1, full correction. Anneal it with
                ``perx.LinearSchedule``. Ignored by samplers without IS weights.
            replace: ``False`` for B distinct transitions (B <= the number stored); offered by
                ``perx.Uniform`` (a uniform subset) and ``perx.Greedy`` (always distinct); the
                prioritized samplers refuse it, as their weights need per-draw probabilities.
            out: a :class:`Batch` returned by an earlier ``sample`` of this buffer with the same
                ``batch_size``, to fill again in place and return: its arrays are overwritten (so keep no
                reference to the old values, nor CPU tensors made from them without a copy, as
                ``perx.torch.as_tensors`` makes them), which saves allocating the batch and its views at
                every call (most felt at small B: benchmarks/bench_buffer.py times both). Attributes or fields
                rebound since are reset to the refilled arrays.
                Only for batches drawn and copied in one compiled call: ``perx.Uniform``,
                ``perx.Proportional`` (and LAP), ``perx.RankBased`` (heap mode) and ``perx.Greedy`` with
                replacement, without episodes, rows <= 512 bytes.

        Returns:
            a :class:`Batch`. Cost: O(B log N) plus the copy of B rows of every field. With
            :class:`perx.Episodes` it also holds ``"return"``, ``"discount"`` and ``"steps"`` of each
            n-step window, ``"next_obs"`` to bootstrap from, ``"terminated"``/``"truncated"`` for how the
            window ended, and rebuilt observations (see :mod:`perx.episodes`).

        Sampling is with replacement: a batch may hold a transition more than once, and B may exceed
        the number stored (each draw follows P(i); IS weights correct for it). ``perx.Greedy`` is the
        exception: it returns B distinct transitions.

        Raises:
            ValueError: empty buffer, batch_size <= 0, beta outside [0, 1], an ``out`` this call cannot
                refill (nothing is overwritten then).
        """
        if out is not None:
            return self._refill(out, batch_size, beta, replace)
        if type(batch_size) is not int or batch_size <= 0:
            batch_size = check_batch_size(batch_size)
        if type(beta) is not float or not 0.0 <= beta <= 1.0:
            beta = _check_beta(beta)
        storage = self._storage
        size = min(storage.next_id, storage.capacity)
        if size == 0:
            raise ValueError("sample: the buffer is empty; add transitions before sampling")
        store = self._episodes
        sampler = self.sampler
        if replace is True:
            # One compiled call draws and copies the rows where the sampler and the layout allow it.
            # (Storage.batch_bytes and fields inlined, and the cache of layout.record read first: those
            # method calls were a large share of a sample at B = 1; measured: docs/history/speed.md, change 22)
            layout = storage._layout
            rec: tuple[int, np.dtype] | Literal[False] | None = layout.records.get(batch_size, False)
            if rec is False:
                rec = layout.record(batch_size)
            if rec is not None and sampler.fuses_gather:
                raw = np.empty(rec[0], np.uint8)
                sampler.sample_gather(batch_size, beta, size, storage.next_id, storage._rows64, layout.plan, raw)
                arrays = layout.pick(np.ndarray((), rec[1], raw))
                data = layout.as_dict(arrays)
                batch = Batch(data, arrays[0], arrays[2], arrays[1])
                if store is None:
                    batch._fill = [raw, layout, batch_size, arrays, data, None]
                else:  # the rows came with the draw; the windows replace the fields they derive (no refill)
                    store.gather(arrays[0], None, data, storage.data)
                return batch
            slots, ids, probs, weights = sampler.sample(batch_size, beta, size, storage.next_id)
        else:
            check_bool(replace, "replace")
            if batch_size > size:
                raise ValueError(f"batch_size: {batch_size} distinct transitions requested (replace=False) but "
                                 f"only {size} are stored")
            slots, ids, probs, weights = sampler.sample_distinct(batch_size, beta, size, storage.next_id)
        mapped = self._mapped
        if mapped is not None and mapped.prefetch:
            mapped.prefetch_rows(slots)
        if store is None:
            data = storage.gather(slots)
        else:
            data = {name: arr[slots] for name, arr in storage.data.items() if name not in store.derived}
            store.gather(ids, slots, data, storage.data)
        return Batch(data, ids, weights, probs)

    def _refill(self, out: Batch, batch_size: int, beta: float, replace: object) -> Batch:
        storage = self._storage
        fill = out._fill if type(out) is Batch else None
        # The common call passes every check in one condition, cheaper than testing them one at a time
        # (docs/history/speed.md, change 32)
        if not (fill is not None and replace is True and type(batch_size) is int and batch_size == fill[_B]
                and type(beta) is float and 0.0 <= beta <= 1.0 and fill[_PAIRS] is not None
                and fill[_LAYOUT] is getattr(storage, "_layout", None) and self.sampler.fuses_gather):
            fill, batch_size, beta = self._refill_args(out, batch_size, beta, replace)
        raw, layout, _, arrays, data, pairs = fill
        next_id = storage.next_id
        cap = storage.capacity
        self.sampler.sample_gather(batch_size, beta, next_id if next_id < cap else cap, next_id, storage._rows64,
                                   layout.plan, raw)
        # the refilled arrays, whatever the batch's attributes or fields were rebound to since
        out.indices, out.probabilities, out.weights = arrays[0], arrays[1], arrays[2]
        out.data = data
        data.update(pairs)
        return out

    def _refill_args(self, out: object, batch_size: object, beta: object, replace: object
                     ) -> tuple[list, int, float]:
        """``sample(out=)``'s checks one at a time, each raising with the argument it refuses: (the batch's
        refill record, with its (name, array) pairs made at the first refill; batch_size; beta)."""
        storage = self._storage
        fill = out._fill if isinstance(out, Batch) else None
        if fill is None or fill[_LAYOUT] is not getattr(storage, "_layout", None) or not self.sampler.fuses_gather:
            raise ValueError(f"out: expected a Batch that sample() of this buffer returned from one compiled call "
                             f"(perx.Uniform, perx.Proportional, perx.RankBased in heap mode or perx.Greedy, no "
                             f"episodes, rows <= 512 bytes, no prefetch), got {_short(out)}")
        if replace is not True:
            raise ValueError("out: only sampling with replacement refills a batch; pass replace=True")
        if type(batch_size) is not int:
            batch_size = check_batch_size(batch_size)
        if batch_size != fill[_B]:  # B is the batch's own record, not len(out): the kernel writes B rows into raw
            raise ValueError(f"out: holds {fill[_B]} transitions but batch_size is {batch_size}")
        if type(beta) is not float or not 0.0 <= beta <= 1.0:
            beta = _check_beta(beta)
        if fill[_PAIRS] is None:  # made at the first refill, not at every sample
            fill[_PAIRS] = tuple(storage.fields(fill[_ARRAYS]).items())
        return fill, batch_size, beta

    def get(self, indices) -> Batch:
        """The batch of the given live ids (no sampling): their fields (and episode fields), the ids,
        their current probabilities P(i) and weights of 1.

        Raises:
            ValueError: an id that is not live (never issued, or overwritten).
        """
        ids = self._live(as_index_array(indices, "indices"))
        storage = self._storage
        slots = ids % self.capacity
        store = self._episodes
        data = {name: arr[slots] for name, arr in storage.data.items() if store is None or name not in store.derived}
        if store is not None:
            store.gather(ids, slots, data, storage.data)
        probs = self.sampler.probabilities(slots, len(self)) if len(ids) else np.empty(0)
        return Batch(data, ids, np.ones(len(ids)), probs)

    def _live(self, ids: np.ndarray) -> np.ndarray:
        nid = self._storage.next_id
        bad = (ids < max(0, nid - self.capacity)) | (ids >= nid)
        if bad.any():
            raise ValueError(f"indices: {int(ids[bad][0])} is not a live id (live: "
                             f"{max(0, nid - self.capacity)}..{nid - 1})")
        return ids

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
        # the common case checked inline (a call to _update_args would be about a quarter of an update at B = 1;
        # docs/history/speed.md, change 22)
        if not (type(indices) is np.ndarray and type(td_errors) is np.ndarray and indices.dtype is _INT64
                and td_errors.dtype is _FLOAT64 and indices.ndim == 1 and td_errors.shape == indices.shape):
            indices, td_errors = self._update_args(indices, td_errors, "td_errors")
        return self.sampler.update(indices, td_errors, self._storage.next_id, raw=False)

    def set_priorities(self, indices, priorities) -> int:
        """Set raw priorities p_i directly (finite, >= 0; no eps, no abs); alpha still applies.

        Same contract as :meth:`update_priorities`; negative priorities are refused.
        """
        ids, values = self._update_args(indices, priorities, "priorities")
        return self.sampler.update(ids, values, self._storage.next_id, raw=True)

    @staticmethod
    def _update_args(indices, values, name):
        if not (type(indices) is np.ndarray and indices.dtype is _INT64 and indices.ndim == 1):
            indices = as_index_array(indices, "indices")
        n = indices.shape[0]
        if not (type(values) is np.ndarray and values.dtype is _FLOAT64 and values.ndim == 1
                and values.shape[0] == n):
            values = as_value_array(values, name, length=n)
        return indices, values

    def priorities(self, indices) -> np.ndarray:
        """Stored raw priorities p_i (float64 [B]) of live ``indices``: after eps and the floor, before
        alpha. New transitions hold the maximal priority; ``perx.RankBased`` and ``perx.Greedy`` report
        +inf for a transition not yet replayed (they keep it above every replayed one).

        Raises:
            ValueError: an id that is not live, or a sampler that keeps no priorities (``perx.Uniform``).
        """
        slots = self._live(as_index_array(indices, "indices")) % self.capacity
        return stored_priorities(self.sampler, slots)

    def predecessors(self, indices) -> np.ndarray:
        """The id of the step before each of ``indices`` in the same episode, or -1 (int64 [B]).

        -1 when the step starts an episode, or its predecessor has been overwritten. With
        :class:`perx.Episodes` the links are the recorded ones (any number of streams). Without, the
        buffer is read as one stream in order: the predecessor of id i is i - 1 unless that step ended
        its episode (its ``terminated`` or ``truncated`` field is true); both fields must exist.
        Used by the predecessor boost of 000 App. A (:class:`perx.priorities.PredecessorBoost`).
        """
        ids = self._live(as_index_array(indices, "indices"))
        oldest = max(0, self._storage.next_id - self.capacity)
        if self._episodes is not None:
            pred = self._episodes.pred[ids % self.capacity].copy()
        else:
            data = self._storage.data
            missing = [n for n in ("terminated", "truncated") if n not in data]
            if missing:
                raise ValueError(f"predecessors: a buffer without perx.Episodes needs the fields 'terminated' "
                                 f"and 'truncated' to tell where episodes end; missing {missing}")
            pred = ids - 1
            inside = pred >= oldest
            prev = pred[inside] % self.capacity
            ended = data["terminated"][prev].astype(bool) | data["truncated"][prev].astype(bool)
            pred[np.flatnonzero(inside)[ended]] = -1
        pred[pred < oldest] = -1
        return pred

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
            slots = self._live(as_index_array(indices, "indices")) % self.capacity
        if batch_size is not None:
            batch_size = check_batch_size(batch_size)
        return self.sampler.probabilities(slots, size, batch_size)

    def mass_totals(self) -> tuple[float, float]:
        """(sum, minimum) of the sampling masses p_i^alpha of the stored transitions, O(1).

        For the samplers whose P(i) = mass_i / sum (000 eq. 1): ``perx.Uniform`` (every mass 1),
        ``perx.Proportional`` and ``perx.LAP``. Several buffers combine into one distribution with them:
        the union's P(i) = mass_i / (sum of the sums) and its largest IS weight belongs to the smallest
        minimum (:class:`perx.distributed.ShardedReplay`). (0.0, inf) for an empty buffer.

        Raises:
            ValueError: a sampler whose probabilities are not mass / sum (rank-based, greedy, hybrid).
        """
        size = len(self)
        total, smallest = self.sampler.mass_totals(size)
        return (0.0, float("inf")) if size == 0 else (total, smallest)

    # -- persistence -----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the complete state (data, priorities, max priority, counter, RNG) to ``path`` atomically.

        The file is an uncompressed ``.npz`` archive, written to a temporary file in the same folder
        (``.<name>.perx-<host>-<pid>-<random>.tmp``), fsynced and renamed over ``path``, so a crash
        never leaves a half-written file at ``path``. Temporary files that earlier saves of the same
        ``path`` left behind when their process was killed are removed first (only those: files of
        saves still running, of other paths, or from other hosts are left alone).
        """
        _format.save(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike, *, lock: bool = False) -> ReplayBuffer:
        """Rebuild a buffer saved by :meth:`save`; its next samples equal the original's.

        The file is treated as untrusted: nothing is unpickled (object arrays are refused), only
        uncompressed members with valid checksums are read, every value is checked (sizes, dtypes,
        ranges, the heap order, consistency of priorities with the stored transitions), derived
        structures (sum and min trees, sorted orders, segment boundaries) are rebuilt rather than
        read, and no global state is touched (the random generator is rebuilt from an allowed bit
        generator). Field data is read straight into the buffer's arrays, so loading needs little
        more memory than the buffer itself.

        Raises:
            FileNotFoundError / PermissionError / IsADirectoryError: ``path`` cannot be opened.
            ValueError (naming ``path``): anything wrong with the file: truncated, corrupted, crafted,
                not a perx buffer, or a capacity that cannot be allocated here.
        """
        return _format.load(cls, path, lock)

    @property
    def prefetch(self) -> bool:
        """For a memmap buffer larger than the page cache: when True, ``sample`` asks the kernel to start
        reading every sampled row's pages (madvise MADV_WILLNEED) before it copies them, so the reads of rows
        not in the cache run in parallel instead of one page fault at a time. The batches are the same;
        sampling then draws and copies in two steps (no ``sample(out=)``). Measured on a buffer 1.25x RAM:
        results/memmap_beyond_ram.md. Off by default (a buffer in the cache pays a system call per row for
        nothing). Not saved with the buffer: set it after ``open``. An episodic buffer's observation ring is
        not prefetched.

        Raises (setting it):
            ValueError: not a bool, True for a buffer in RAM, or a platform without MADV_WILLNEED.
        """
        return self._mapped is not None and self._mapped.prefetch

    @prefetch.setter
    def prefetch(self, on: bool) -> None:
        check_bool(on, "prefetch")
        if on and self._mapped is None:
            raise ValueError("prefetch: only a memmap buffer (memmap=folder) reads its rows from files; got True for "
                             "a buffer in RAM")
        if on and not hasattr(mmap, "MADV_WILLNEED"):
            raise ValueError("prefetch: this platform has no madvise(MADV_WILLNEED); got True")
        if self._closed:
            raise ValueError(f"prefetch: the buffer is closed; reopen it with ReplayBuffer.open({self.memmap!r})")
        if self._mapped is None or self._mapped.prefetch == on:
            return
        with self.lock if self.lock is not None else contextlib.nullcontext():
            self._mapped.prefetch = on
            storage = self._storage
            layout = getattr(storage, "_layout", None)
            if layout is not None:
                # a new layout object with no batch records: a batch drawn before cannot be refilled by the
                # fused call (sample(out=) checks the layout's identity), and no cached record outlives the switch
                layout = copy.copy(layout)
                layout.records = {}
                layout.unfused = on
                storage._layout = layout

    @property
    def memmap(self) -> str | None:
        """The folder holding a memmap buffer's files, or None for a buffer in RAM."""
        return None if self._mapped is None else str(self._mapped.path)

    def close(self) -> None:
        """Finish with the buffer; afterwards every method raises ``ValueError``. A memmap buffer writes its
        files' dirty pages, then the state kept in RAM (sampler, episode links, counter; the format of
        :meth:`save` without the mapped arrays) to ``<folder>/state.npz``, then marks the folder closed, so
        :meth:`open` reopens it exactly. A buffer in RAM is only marked closed. Closing twice does nothing.
        ``with ReplayBuffer(...) as buf:`` closes on leaving the block."""
        with self.lock if self.lock is not None else contextlib.nullcontext():
            if self._closed:
                return
            if self._mapped is not None:
                _mmap.close(self, self._mapped)
            self._closed = True
            self._install()

    @classmethod
    def open(cls, path: str | os.PathLike, *, lock: bool = False, warm: bool = False) -> ReplayBuffer:
        """Reopen a memmap buffer that was closed (``ReplayBuffer(..., memmap=path)`` then :meth:`close`); its
        next samples equal those the closed buffer would have drawn. The state file is checked as :meth:`load`
        checks a file, and the mapped files against it (shape, dtype); the field data is not read. With
        ``warm``, the files are read once, sequentially, before it returns, so their pages are in the page
        cache: worth it when the buffer fits in RAM, since otherwise each sampled row not yet in the cache
        costs a random read of its page (results/memmap.md measures both).

        Raises:
            FileNotFoundError: no memmap buffer at ``path``.
            ValueError (naming ``path``): the buffer was not closed (its process was killed or crashed, or is
                still using it), or its state or files are damaged.
        """
        check_bool(warm, "warm")  # (before the folder is marked open)
        check_bool(lock, "lock")
        buf = _format.open_mapped(cls, path, lock)
        if warm:
            cast(MappedFolder, buf._mapped).warm()
        return buf

    def __del__(self) -> None:
        # a memmap buffer dropped without close() is closed here, so its folder reopens (not in a forked child,
        # whose copy must not close its parent's folder)
        folder = self.__dict__.get("_mapped")
        if (folder is not None and not self.__dict__.get("_closed", True) and folder.pid == os.getpid()
                and not folder.reopen and not folder.closed):  # (reopen: an open() still loading it, or refused)
            try:
                self.close()
            except Exception:  # (at garbage collection: nothing to raise to; the folder then reads as not closed)
                pass

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_LOCKED = ("add", "extend", "sample", "get", "update_priorities", "set_priorities", "probabilities",
           "priorities", "predecessors", "save", "end_episodes", "mass_totals")
#: Methods that buffers with dict fields shadow with instance attributes (``ReplayBuffer._install``).
_NESTED = ("_write", "add", "extend", "sample", "get")


def _refuse_closed(method: str, folder: str | None, *args: Any, **kwargs: Any) -> Any:
    where = f" (its files: {folder!r}; ReplayBuffer.open reopens it)" if folder is not None else ""
    raise ValueError(f"{method}: the buffer is closed{where}")


def _locked(method, lock):
    @functools.wraps(method)
    def call(*args, **kwargs):
        with lock:
            return method(*args, **kwargs)

    return call


def _split_spec(spec: Mapping, episodes: Episodes | None) -> tuple[dict, dict[str, tuple[str, ...]], DictLayout | None]:
    """A ``spec=`` with dict fields, as (the spec of what is stored, in order: each key of a dict field as a field
    ``name.key``, an episodic buffer's dict observations as their packed unit; the dict fields, name -> keys; the
    layout of the packed observations, or None)."""
    dicts = {}
    for name, item in spec.items():
        if isinstance(item, Mapping):
            keys = dict_keys(name, item)
            parsed = _parse_spec({flat_name(name, k): item[k] for k in keys})
            dicts[name] = {k: parsed[flat_name(name, k)] for k in keys}
    obs_names = (episodes.obs, episodes.next_name) if episodes is not None else ()
    layout = None
    if episodes is not None:
        for name in dicts:
            if name in RESERVED or name in ("reward", "terminated", "truncated"):
                raise TypeError(f"spec: an episodic buffer needs {name!r} as a plain field, got a dict")
        packed = [n for n in obs_names if n in dicts]
        if packed:
            plain = [n for n in obs_names if n in spec and n not in dicts]
            if plain:
                raise TypeError(f"spec: {packed[0]} is a dict, so {plain[0]} must be one with the same keys")
            if len(packed) == 2 and dicts[packed[0]] != dicts[packed[1]]:
                raise ValueError(f"spec: {packed[1]} must have the keys, shapes and dtypes of {packed[0]}")
            layout = DictLayout(packed[0], dicts[packed[0]], episodes.frame_stack)
    flat, taken = {}, set()
    for name, group in dicts.items():  # every key's stored name is free, packed or not (batch["obs.a"] finds it)
        for k in group:
            stored = flat_name(name, k)
            if stored in spec or stored in taken:
                raise ValueError(f"spec: {stored!r} names both a field and key {k!r} of the dict field {name!r}")
            taken.add(stored)
    for name, item in spec.items():
        if name not in dicts:
            flat[name] = item
        elif layout is not None and name in obs_names:
            flat[name] = layout.spec
        else:
            flat.update((flat_name(name, k), f) for k, f in dicts[name].items())
    return flat, {n: tuple(keys) for n, keys in dicts.items()}, layout


def _check_beta(beta: object) -> float:
    if isinstance(beta, bool) or not isinstance(beta, (int, float, np.floating, np.integer)):
        raise TypeError(f"beta: expected a float in [0, 1], got {_short(beta)}")
    return check_real(beta, "beta", low=0.0, high=1.0)
