"""The sampler contract shared by every replay strategy, and id helpers for the numba kernels.

A sampler decides *which* stored transitions a batch holds and with what probability; the buffer owns
the data. Indices crossing this boundary are insertion ids (see :mod:`perx.storage`): id ``i`` lives
in slot ``i % capacity`` and is stale once ``i < next_id - capacity``.

Every sampler:
  * owns one ``np.random.Generator`` and saves its state with the rest of its state;
  * validates a whole update before touching anything, so a refused update changes nothing;
  * skips (and does not count) updates whose ids are stale;
  * returns, for each sampled transition, its exact probability P(i) under the current priorities
    and its importance-sampling weight.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar, cast

import numpy as np
from numba import njit

from perx._jit import Entry, boolean, float64, int64, loose
from perx.validation import _short

#: Random numbers a sampler draws ahead at a time (:meth:`Sampler._numbers`; 16 KB). In a block they cost
#: little each, where a call of ``rng.random(n)`` or ``rng.integers(0, size, n)`` per batch pays the Generator
#: call's own overhead, most of a draw's cost at B = 1 (the integers were half of Uniform's sample+update
#: there; measured: docs/history/speed.md, change 27).
POOL = 2048

#: Kernel return codes (>= 0 means "applied this many").
BAD_VALUE = -1
BAD_ID = -2


@njit(cache=True, nogil=True)
def ids_of_slots(slots, next_id, capacity):
    """Insertion ids of the transitions now stored in ``slots`` (int64 [B])."""
    head = next_id % capacity
    base = next_id - head
    out = np.empty(slots.shape[0], np.int64)
    for b in range(slots.shape[0]):
        s = slots[b]
        out[b] = base + s if s < head else base - capacity + s
    return out


@njit(cache=True, nogil=True)
def check_update(ids, values, next_id, capacity, raw):
    """BAD_VALUE / BAD_ID for the first problem in an update, else the number of live ids. Reads only."""
    for b in range(ids.shape[0]):
        v = values[b]
        if not np.isfinite(v) or (raw and v < 0.0):
            return BAD_VALUE
    live = 0
    for b in range(ids.shape[0]):
        if ids[b] < 0 or ids[b] >= next_id:
            return BAD_ID
        if ids[b] >= next_id - capacity:
            live += 1
    return live


#: numpy's own int64 and float64 dtypes: an array that has them passes an identity test (``dtype is INT64``),
#: cheaper than ``dtype == np.int64``, which goes through numpy's dtype comparison; an equal dtype that is
#: another object takes the general checks
INT64 = np.dtype(np.int64)
FLOAT64 = np.dtype(np.float64)
#: :func:`check_update` without type dispatch (perx._jit), for updates of ids int64 [B], values float64 [B]
_CHECK_UPDATE = Entry(check_update, (loose(int64, 1), loose(float64, 1), int64, int64, boolean))


def update_fits(ids: np.ndarray, values: np.ndarray) -> bool:
    """Whether an update's entry point (perx._jit) may read ``ids`` and ``values`` without looking: int64 [B]
    and float64 [B], any strides. Anything else goes to the kernel's dispatcher."""
    return ids.dtype is INT64 and values.dtype is FLOAT64 and ids.ndim == 1 == values.ndim


def add_fits(slots: np.ndarray, ids: np.ndarray) -> bool:
    """Whether an add's entry point may read ``slots`` and ``ids`` without looking: contiguous int64 [n]."""
    return (slots.dtype is INT64 is ids.dtype and slots.ndim == 1 == ids.ndim and slots.flags.c_contiguous
            and ids.flags.c_contiguous)


def raise_bad_update(code: int, ids: np.ndarray, values: np.ndarray, next_id: int, raw: bool) -> None:
    """Turn a kernel's error code into a ValueError that names the argument and the value."""
    if code == BAD_VALUE:
        name = "priorities" if raw else "td_errors"
        bad = ~np.isfinite(values) | ((values < 0) if raw else False)
        pos = int(np.flatnonzero(bad)[0])
        rule = "finite and >= 0" if raw else "finite (NaN and inf are refused)"
        raise ValueError(f"{name}: must be {rule}; got {values[pos]!r} at position {pos}")
    if code == BAD_ID:
        bad = (ids < 0) | (ids >= next_id)
        pos = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"indices: {int(ids[pos])} (position {pos}) was never issued by this buffer; "
            f"issued ids are 0..{next_id - 1}"
        )
    raise AssertionError(f"unknown kernel code {code}")


class Sampler:
    """Base class of the replay strategies (``perx.Uniform``, ``perx.Proportional``, ...).

    A sampler is bound to exactly one buffer, which calls ``_bind(capacity)`` once.
    """

    name: ClassVar[str] = "Sampler"
    #: Registry used by ``ReplayBuffer.load`` to rebuild a sampler from its saved name.
    registry: ClassVar[dict[str, type[Sampler]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A class whose sample() comes from further down its MRO than its sample_gather() (a subclass or a mixin
        # redefining how it samples) must not be bypassed by the inherited fused path.
        mro = cls.__mro__
        owner = {name: next(i for i, c in enumerate(mro) if name in c.__dict__)
                 for name in ("sample", "sample_gather", "on_add", "on_add_one", "on_add_range")}
        if owner["sample"] < owner["sample_gather"]:
            cls.fuses_gather = False
        # (the generic methods put back on the class deliberately: mypy refuses assigning to a method)
        if owner["on_add"] < owner["on_add_one"]:  # likewise, single adds must reach a redefined on_add
            cls.on_add_one = Sampler.on_add_one  # type: ignore[method-assign]
        if owner["on_add"] < owner["on_add_range"]:  # and so must extends
            cls.on_add_range = Sampler.on_add_range  # type: ignore[method-assign]
        if "name" in cls.__dict__:  # concrete samplers name themselves; shared bases do not
            Sampler.registry[cls.name] = cls

    def __init__(self, *, seed: int | None = None) -> None:
        self._seed_generator(seed)
        self.capacity: int | None = None

    def _seed_generator(self, seed: Any) -> None:
        self._rng = make_generator(seed)
        if isinstance(seed, (np.random.Generator, np.random.BitGenerator)):
            # the caller's own generator (default_rng returns it, or wraps its bit generator): the caller may
            # draw from it too, so the sampler draws directly and both stay one sequence
            object.__setattr__(self, "_pooling", False)

    # -- configuration -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Constructor keyword arguments that rebuild an equivalent (unbound) sampler."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"

    def reseed(self, seed: int | None) -> None:
        """Replace the generator by ``np.random.default_rng(seed)``."""
        self._seed_generator(seed)

    @property
    def rng(self) -> np.random.Generator:
        """The sampler's generator, where the draws so far leave it. Once it is handed out the sampler
        draws from it directly (no block drawn ahead), so the caller's own draws on it and the sampler's
        stay one sequence."""
        self._sync()
        object.__setattr__(self, "_pooling", False)
        return self._gen

    @property
    def _rng(self) -> np.random.Generator:
        """The generator for a draw made now: brought level with the numbers handed out first
        (:meth:`_sync`), so a method of a subclass that draws from it directly gets the numbers that come
        next. The block resumes at the next :meth:`_numbers`."""
        self._sync()
        return self._gen

    @_rng.setter
    def _rng(self, value: np.random.Generator) -> None:
        # a new generator (reseed, load, a test's own): nothing of it is drawn ahead yet
        object.__setattr__(self, "_gen", value)
        object.__setattr__(self, "_pool", None)
        object.__setattr__(self, "_cursor", [0])
        # numpy's default bit generator; any other (a loaded Philox or MT19937 state) is drawn from directly
        object.__setattr__(self, "_pooling", type(getattr(value, "bit_generator", None)) is np.random.PCG64)

    def __setstate__(self, state: dict) -> None:
        # a sampler pickled before the blocks of random numbers holds its generator as "_rng", and no block
        gen = state.pop("_rng", None)
        self.__dict__.update(state)
        if gen is not None:
            self._rng = gen
        if "on_add" in state:
            # an on_add set on the instance: the generic single add and extend that call it were pickled as bound
            # methods, which unpickle as the class's own (pickle looks them up by name): bind them again
            self.__dict__["on_add_one"] = Sampler.on_add_one.__get__(self)
            self.__dict__["on_add_range"] = Sampler.on_add_range.__get__(self)

    def _bind(self, capacity: int) -> None:
        if self.capacity is not None:
            raise ValueError(f"sampler: {self!r} is already bound to a buffer; create a new sampler")
        try:
            self._allocate(capacity)
        except (MemoryError, ValueError) as err:
            raise MemoryError(f"capacity: cannot allocate {type(self).__name__}'s arrays for capacity={capacity} "
                              f"({type(err).__name__}: {err}); choose a smaller capacity") from None
        self.capacity = capacity

    def _allocate(self, capacity: int) -> None:
        pass

    # -- the hot path --------------------------------------------------------------------------
    def on_add(self, slots: np.ndarray, ids: np.ndarray) -> None:
        """New transitions with insertion ``ids`` were written to ``slots`` (int64 [n], distinct)."""

    def on_add_one(self, slot: int, id: int) -> None:
        """As :meth:`on_add` for one transition (``ReplayBuffer.add``); override where a scalar call is cheaper
        than two one-element arrays. A class or instance that redefines ``on_add`` gets this generic one back,
        so its ``on_add`` sees every add."""
        self.on_add(np.array([slot], np.int64), np.array([id], np.int64))

    def on_add_range(self, first: int, ids: np.ndarray) -> None:
        """As :meth:`on_add` for ``len(ids)`` transitions written to the consecutive slots ``first, first + 1,
        ...`` (``ReplayBuffer.extend`` without a wrap round the ring; ``ids`` int64 [n], C-contiguous, as the
        buffer makes them); override where the slots need not be made. A class or instance that redefines
        ``on_add`` gets this generic one back, as with :meth:`on_add_one`."""
        self.on_add(np.arange(first, first + ids.shape[0], dtype=np.int64), ids)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "on_add":  # an on_add set on the instance (a wrapper, a mock) must see single adds and extends
            object.__setattr__(self, "on_add_one", Sampler.on_add_one.__get__(self))
            object.__setattr__(self, "on_add_range", Sampler.on_add_range.__get__(self))
        elif name == "sample":  # likewise, a sample set on the instance must not be bypassed by the fused path
            object.__setattr__(self, "fuses_gather", False)
        object.__setattr__(self, name, value)

    # -- random numbers --------------------------------------------------------------------------
    #: The block drawn ahead, or None: float64 uniforms (``_pool_kind`` 0) or int64 integers in [0, size)
    #: (``_pool_kind`` = size). ``_cursor`` = [how many of it were handed out]; ``_pool_state`` is the
    #: generator's state from before the block was drawn.
    _pool: np.ndarray | None = None
    _pool_kind: int = 0
    _pooling: bool = False
    #: Set per instance by the ``_rng`` setter and :meth:`_refill` (declared here for the type check, not set).
    _gen: np.random.Generator
    _cursor: list[int]
    _pool_state: Mapping[str, Any]

    def _numbers(self, n: int, kind: int) -> np.ndarray:
        """n random numbers, as the sampler's generator would give them drawn directly, in the same order:
        ``kind`` 0, float64 uniforms on [0, 1) (``random(n)``); ``kind`` = size, int64 integers in [0, size)
        (``integers(0, size, n)``).

        They come from a block of ``POOL`` drawn ahead: a slice of it per call instead of a Generator call (see
        ``POOL``). Calls of numpy's ``integers`` with one range concatenate (k draws then m draw what one
        call of k + m draws, and leave the same state: numpy keeps the spare half of a 64-bit draw in the bit
        generator's state), so a block of either kind splits into calls exactly. The generator is then ahead
        of the numbers handed out; :meth:`_sync` puts it back where direct draws would have left it (the state
        from before the block, then the numbers handed out drawn again) whenever it is needed:
        ``state_dict``, the ``rng`` property, a draw of another kind. So every sample and every saved state is
        bit for bit what drawing directly gives. A method that draws anything else from ``self._gen``
        directly calls :meth:`_sync` first (``self._rng`` does). The result may be a view into the block: use
        it before the next draw, and do not write to it."""
        pool = self._pool
        if pool is not None and self._pool_kind == kind:
            cur = self._cursor
            p = cur[0]
            q = p + n
            if p < q <= pool.shape[0]:
                cur[0] = q
                return pool[p:q]
        return self._refill(n, kind)

    def _draw_direct(self, n: int, kind: int) -> np.ndarray:
        return self._gen.random(n) if kind == 0 else self._gen.integers(0, kind, n)

    def _refill(self, n: int, kind: int) -> np.ndarray:
        """The slow path of :meth:`_numbers`: what is left of the block, then a new block."""
        if not self._pooling or n <= 0:  # (n <= 0: nothing to draw, or numpy's own error, as directly)
            return self._draw_direct(n, kind)
        pool = self._pool
        head = None
        if pool is not None:
            if self._pool_kind == kind:  # drawn already and not handed out yet: these come first
                head = pool[self._cursor[0]:]
            else:
                self._sync()
        m = n if head is None else n - head.shape[0]
        state = self._gen.bit_generator.state
        block = self._draw_direct(max(POOL, m), kind)
        self._pool, self._pool_kind, self._pool_state, self._cursor = block, kind, state, [m]
        return block[:m] if head is None else np.concatenate((head, block[:m]))

    def _sync(self) -> None:
        """Put the generator where drawing directly would have left it, and drop the block."""
        if self._pool is None:
            return
        self._replay(self._pool_state, self._cursor[0], self._pool_kind)

    def _replay(self, state: Mapping[str, Any], used: int, kind: int) -> None:
        # the generator set to ``state`` (from before a block), then the ``used`` numbers handed out of it
        # drawn again; the block dropped
        object.__setattr__(self, "_pool", None)
        self._gen.bit_generator.state = state
        if used:
            self._draw_direct(used, kind)

    def _mark(self) -> tuple:
        """Where the generator stands, for :meth:`_rewind`: read without moving it and without dropping the
        block drawn ahead (:meth:`_sync` would drop it, and the next call would draw a new one). Dearer
        without a block: the generator's state is then copied."""
        if self._pool is not None:
            return self._gen, self._pool_kind, self._pool_state, self._cursor[0]
        return self._gen, 0, self._gen.bit_generator.state, 0

    def _rewind(self, mark: tuple) -> None:
        """Put the generator back where :meth:`_mark` found it (where drawing directly would have left it,
        as :meth:`_sync` does); the next draw starts a new block from there. For a call refused after it drew."""
        gen, kind, state, used = mark
        object.__setattr__(self, "_gen", gen)
        object.__setattr__(self, "_cursor", [0])
        self._replay(state, used, kind)

    def sample(self, batch_size: int, beta: float, size: int, next_id: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Draw ``batch_size`` transitions from the ``size`` stored ones.

        Returns:
            (slots int64 [B], ids int64 [B], probabilities float64 [B], weights float64 [B]).
        """
        raise NotImplementedError

    #: True when :meth:`sample_gather` copies the sampled rows in the same compiled call as the draw. False
    #: for a class whose ``sample`` is redefined below its ``sample_gather`` (``__init_subclass__``) and for an
    #: instance given a ``sample`` of its own (a wrapper, a mock: ``__setattr__``), which the fused path
    #: would bypass. A class attribute that an instance may shadow (those, and ``RankBased`` in exact mode).
    fuses_gather: bool = False

    def sample_gather(self, batch_size: int, beta: float, size: int, next_id: int, rows64: np.ndarray,
                      plan: np.ndarray, out: np.ndarray) -> None:
        """As :meth:`sample`, but in one kernel call write the ids, probabilities and weights and copy the
        drawn rows into ``out`` (``Storage.batch_bytes``: int64 ids [B], float64 probabilities [B] and
        weights [B], then the fields as ``_RowLayout.batch_dtype`` places them), for samplers with
        ``fuses_gather``. One call instead of two, and no arrays handed back from compiled code (boxing each
        costs more than the work at small B; measured: docs/history/speed.md, change 6). ``rows64`` and
        ``plan`` are the storage's rows (uint64 [capacity, row_bytes / 8]) and ``_RowLayout.plan``."""
        raise NotImplementedError

    def sample_distinct(self, batch_size: int, beta: float, size: int, next_id: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`sample`, but ``batch_size <= size`` distinct transitions (``sample(replace=False)``).

        Only samplers whose draws without replacement keep exact probabilities and weights offer it.
        """
        raise ValueError(
            f"replace: {type(self).__name__} samples with replacement only: its IS weights need each draw's "
            f"probability, and weighted sampling without replacement has no closed form for it; use "
            f"perx.Uniform or perx.Greedy for distinct transitions"
        )

    def update(self, ids: np.ndarray, values: np.ndarray, next_id: int, *, raw: bool) -> int:
        """Apply new TD errors (``raw=False``) or priorities (``raw=True``); return how many applied.

        ``ids`` int64 [B] and ``values`` float64 [B] have equal lengths (the buffer checked that).
        Stale ids are skipped; bad values or never-issued ids raise ValueError with nothing changed.
        """
        check = _CHECK_UPDATE.fn if update_fits(ids, values) else check_update
        code = check(ids, values, next_id, self.capacity, raw)
        if code < 0:
            raise_bad_update(code, ids, values, next_id, raw)
        return code

    def probabilities(self, slots: np.ndarray, size: int, batch_size: int | None = None) -> np.ndarray:
        """Exact per-draw probability P(i) of the transitions in ``slots`` (float64 [B]).

        ``batch_size`` matters only to samplers whose distribution depends on it (rank-based
        segments, greedy top-k); the others ignore it.
        """
        raise NotImplementedError

    def mass_totals(self, size: int) -> tuple[float, float]:
        """(sum, minimum) of the sampling masses of the ``size`` stored transitions, for samplers whose
        P(i) is mass_i / sum (000 eq. 1). Several buffers' totals combine into the P(i) and IS weights
        of their union (:mod:`perx.distributed`). Samplers whose P(i) depends on more than a
        per-transition mass (ranks, mixtures, top-k) raise ValueError.
        """
        raise ValueError(f"sampler: {type(self).__name__}'s probabilities are not proportional to a per-transition "
                         f"mass, so buffers using it cannot be combined by mass totals; use perx.Uniform, "
                         f"perx.Proportional or perx.LAP")

    @property
    def nbytes(self) -> int:
        """Bytes of the sampler's numpy arrays (Python-level structures, if any, are not counted)."""
        return sum(arr.nbytes for arr in self.state_dict()[1].values())

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(JSON-able metadata, arrays) that restore this sampler exactly, RNG included.

        Only primary state is saved; what can be derived (trees from priorities, sorted orders) is
        rebuilt by :meth:`load_state_dict`, so a file cannot smuggle in inconsistent structures.
        The arrays are the sampler's own, not copies (``save`` writes them at once): copy them to keep a
        snapshot in memory, or later calls will change it.
        """
        return {"rng": _jsonable(self._rng.bit_generator.state)}, {}  # (self._rng: brought level first)

    def load_state_dict(self, meta: dict[str, Any], arrays: dict[str, np.ndarray], *, size: int,
                        next_id: int) -> None:
        """Restore a bound sampler from :meth:`state_dict`'s output, for a buffer holding ``size``
        transitions with ``next_id`` ever added. Untrusted input: every value is checked (types,
        shapes, ranges, invariants, consistency with ``size`` and ``next_id``); ValueError names what is
        wrong, and a refused state leaves the sampler exactly as it was, generator included.

        The state is loaded into a copy (:meth:`_load_state`), which replaces this sampler's state only
        once everything passed: a transient second copy of the sampler's arrays. ``ReplayBuffer.load``
        builds a fresh sampler and loads into it directly."""
        twin = copy.deepcopy(self)
        twin._load_state(meta, arrays, size=size, next_id=next_id)
        self.__dict__.update(twin.__dict__)

    def _load_unguarded(self, meta: dict[str, Any], arrays: dict[str, np.ndarray], *, size: int,
                        next_id: int) -> None:
        """:meth:`load_state_dict` for a sampler that is thrown away if the state is refused (a new one, or a
        copy): without its copy, unless the class loads its own way."""
        load = self._load_state if type(self).load_state_dict is Sampler.load_state_dict else self.load_state_dict
        load(meta, arrays, size=size, next_id=next_id)

    def _load_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray], *, size: int,
                    next_id: int) -> None:
        """:meth:`load_state_dict`'s checks and writes, in place: a ValueError may leave the sampler
        partly changed. Subclasses check and load their own state, and call this."""
        expected_meta, expected_arrays = self.state_dict()
        check_keys(meta, expected_meta, "sampler state")
        check_keys(arrays, expected_arrays, "sampler arrays")
        for name, arr in expected_arrays.items():
            check_array(arrays[name], name, arr.shape, arr.dtype)
        self._rng = restore_rng(meta["rng"])


def stored_priorities(sampler: Sampler, slots: np.ndarray) -> np.ndarray:
    """Raw stored priorities of ``slots`` (int64 [k]) as float64 [k], for any sampler that keeps them: its
    ``priorities(slots)``, or the heap samplers' ``keys(slots)`` (+inf: not yet replayed, kept above every
    replayed one). ValueError for a sampler with neither (``perx.Uniform``). O(k)."""
    if hasattr(sampler, "priorities"):
        return np.asarray(sampler.priorities(slots), dtype=np.float64)
    if hasattr(sampler, "keys"):
        return np.asarray(sampler.keys(slots), dtype=np.float64)
    raise ValueError(f"priorities: {type(sampler).__name__} keeps no priorities")


#: Bit generators a saved state may name; anything else is refused (``getattr(np.random, name)``
#: would reach functions such as ``np.random.seed`` and change global state).
BIT_GENERATORS = {cls.__name__: cls for cls in (np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937,
                                                  np.random.Philox, np.random.SFC64)}


def make_generator(seed: object) -> np.random.Generator:
    """``np.random.default_rng(seed)``; a seed numpy refuses raises ValueError naming ``seed``."""
    try:
        return np.random.default_rng(seed)  # type: ignore[arg-type]  # any object: numpy's refusal is caught
    except (TypeError, ValueError) as err:
        raise ValueError(f"seed: expected None, an int >= 0, a sequence of them, or a numpy SeedSequence, "
                         f"BitGenerator or Generator; got {_short(seed)} ({err})") from None


def restore_rng(state: object) -> np.random.Generator:
    """A new Generator from a saved ``bit_generator.state`` dict; ValueError for anything else."""
    name = state.get("bit_generator") if isinstance(state, dict) else None
    cls = BIT_GENERATORS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"rng: bit_generator must be one of {sorted(BIT_GENERATORS)}, got {_short(name)}")
    bit_generator = cls()
    try:
        inner = cast(dict, state).get("state")  # (a dict: its bit_generator was found above)
        if name == "MT19937" and not (isinstance(inner, dict) and type(inner.get("pos")) is int
                                      and 0 <= inner["pos"] <= 624):
            # numpy takes any position into its 624-word key, and the next draw reads out of bounds
            raise ValueError(f"state.pos: an int in [0, 624], got {_short(inner)}")
        bit_generator.state = _from_jsonable(state)
    except (TypeError, ValueError, KeyError, OverflowError) as err:
        raise ValueError(f"rng: not a valid {name} state ({type(err).__name__}: {err})") from None
    return np.random.Generator(bit_generator)


def _jsonable(obj: Any) -> Any:
    """Bit generator states hold numpy arrays (Philox, MT19937): stored as tagged lists in JSON."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return {"ndarray": obj.tolist(), "dtype": obj.dtype.str}
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _from_jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        if obj.keys() == {"ndarray", "dtype"}:
            dtype = np.dtype(obj["dtype"])
            if dtype.kind not in "iu":
                raise ValueError(f"a bit generator state holds integers, not {dtype}")
            return np.array(obj["ndarray"], dtype=dtype)
        return {k: _from_jsonable(v) for k, v in obj.items()}
    return obj


def check_keys(found: object, expected: dict, what: str) -> None:
    """``found`` must be a dict with exactly the keys of ``expected``."""
    if not isinstance(found, dict):
        raise ValueError(f"{what}: expected a dict, got {_short(found)}")
    if found.keys() != expected.keys():
        missing = sorted(expected.keys() - found.keys())
        extra = sorted(found.keys() - expected.keys())
        raise ValueError(f"{what}: missing {missing}, unexpected {extra}")


def check_array(arr: object, name: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
    if not isinstance(arr, np.ndarray) or arr.shape != shape or arr.dtype != dtype:
        found = f"{arr.dtype}{arr.shape}" if isinstance(arr, np.ndarray) else _short(arr)
        raise ValueError(f"{name}: expected {np.dtype(dtype)}{shape}, got {found}")
    return arr


def check_int(value: object, name: str, low: int, high: int) -> int:
    """An int (not a bool) in [low, high]; ValueError otherwise (for untrusted saved state)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not low <= value <= high:
        raise ValueError(f"{name}: expected an int in [{low}, {high}], got {_short(value)}")
    return int(value)


def check_sampler(sampler: object) -> Sampler:
    if not isinstance(sampler, Sampler):
        raise TypeError(f"sampler: expected a perx sampler such as perx.Proportional(), "
                        f"got {_short(sampler)}")
    return sampler
