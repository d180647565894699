"""Episodes: n-step returns, next observations stored once, and frame stacks stored once.

A buffer configured with :class:`Episodes` is fed steps of one or more *streams* (the sub-environments of
a vector env; each keeps its own episode stream) and links each step to its neighbours in the same
episode:

* ``succ``: the id of the next step of the episode; ``ENDED`` (-1) if the episode ended with this step
  (terminated or truncated); ``PENDING`` (-2) while it is its stream's newest step and the episode goes on.
* ``pred`` (frame stacks only): the id of the previous step, or -1 at the episode's first step.

Everything derived at sample time, from single steps stored once:

* **n-step returns** (Sutton & Barto's n-step target; the multi-step variant of 000 Appendix A):
  ``G = sum_{t<k} gamma^t r_t`` over the k <= n steps of the window, and the discount to apply to the
  bootstrap value, ``gamma^k``, or 0 if the episode terminated inside the window. A window ends early at
  a termination (no bootstrap), at a truncation (bootstrap from the last real next observation), or at the
  stream's newest step while its episode goes on (a window cut by the write head: bootstrap from that
  step's next observation); ``batch["steps"]`` says how many steps it holds. Priorities stay per
  transition (the window's first step).
* **next observations** (``next_obs="shared"``): the next observation of a step is the observation of
  its successor; only an episode's final observation, and each stream's newest next observation, are kept
  on their own (in a store that grows with the number of episode ends held).
* **frame stacks** (``frame_stack=k``): observations are stacks of k frames, newest last (Gymnasium's
  ``FrameStackObservation``); each step stores its newest frame once, and stacks are rebuilt by walking
  ``pred``; frames before an episode's first step are padding, the first frame (``"first"``, Gymnasium's
  ``padding_type="reset"``) or zeros (``"zero"``). Frames live in a ring of ``capacity + frame_margin``
  entries so that the oldest stored steps still find their stacks' older frames.

Observations are checked on the way in (``check=True``): a continuing step's observation must equal the
previous step's next observation, and a stack must be the previous stack shifted by one frame, so a step
that does not belong where it is written (a wrong stream id) is refused with a ValueError before anything
is stored. The bogus reset step of Gymnasium's next-step autoreset (final observation -> reset
observation, after an episode's end), added by hand, is refused only with stacks of two frames or more
(the reset stack is not the final stack shifted by one frame, unless the pair could itself start an
episode: a final stack equal to the reset stack, or all zeros with ``"zero"`` padding). Without stacks it
is stored as the first step of a new episode: it looks exactly like one (an episode may start where the
last one ended, e.g. continued after ``end_episodes``), and only the recorder knows the autoreset mode:
``perx.gym.VectorRecorder`` drops these steps.
"""

from __future__ import annotations

import numbers
from typing import Any, cast

import numpy as np
from numba import njit

# The window kernels below compile unpack_row into themselves, and numba's cache (cache=True) is keyed on this
# file alone: a change to perx/_lz4.py's decoder must come with a change here, or a checkout updated in place
# keeps the old decoder in its cached kernels (last: decompress_into's length bytes read inline).
from perx._lz4 import PackedUnits, unpack_row
from perx._mmap import MappedCreateError, MappedFileError, MappedFolder, zeros
from perx._nested import DictLayout, same_rows
from perx._prefetch import AHEAD, prefetch
from perx.validation import _short, check_bool, check_choice, check_positive_int, check_real, to_numpy

ENDED = -1
PENDING = -2
#: Batch keys an episodic buffer computes; no stored field may have these names.
RESERVED = ("return", "discount", "steps")
#: Observation dtypes the compiled gather copies (numba has no float16 or long double arrays).
OBS_DTYPES = frozenset(np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                             np.uint32, np.uint64, np.float32, np.float64, np.complex64,
                                             np.complex128))
REWARD_DTYPES = frozenset(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                                np.uint32, np.uint64, np.float32, np.float64))


class Episodes:
    """How a buffer links steps into episodes (pass as ``ReplayBuffer(..., episodes=perx.Episodes(...))``).

    Args:
        n_step: n of the n-step return; 1 gives the one-step target. The batch then carries
            ``"return"`` (float64 [B]), ``"discount"`` (gamma^k, or 0 after a termination; float64 [B]),
            ``"steps"`` (k, int64 [B]), ``"next_obs"`` (the observation to bootstrap from) and
            ``"terminated"`` / ``"truncated"`` (how the window ended). The target is
            ``return + discount * V(next_obs)``.
        gamma: discount factor in [0, 1].
        streams: number of parallel streams (sub-environments); each step says which one it comes from
            with ``stream=`` in ``add`` / ``extend``.
        next_obs: ``"stored"`` keeps ``next_obs`` as an ordinary field; ``"shared"`` reads it from the next
            step of the same stream (default when frames are stacked, else ``"stored"``).
        frame_stack: k if observations are stacks of k frames (axis 0 of ``obs``) to be stored one frame
            per step; implies ``next_obs="shared"``. A dict observation (Gymnasium ``Dict`` space) stacks every
            key alike: each key is [k, *that key's frame shape].
        frame_padding: what stands before an episode's first frame in a stack: ``"first"`` (that frame
            repeated; Gymnasium's ``padding_type="reset"``) or ``"zero"``.
        frame_margin: extra frames kept beyond the capacity so that the oldest stored steps can still
            rebuild their stacks; default ``(frame_stack - 1) * streams``, enough when every stream adds
            a step per round (vector envs). A continuing step further than ``frame_margin // (k - 1)``
            ids from its predecessor is refused.
        obs: name of the observation field (its next observation is ``"next_" + obs``). Both may be dict fields
            with the same keys (one array per key; see :mod:`perx._nested`): stored once per key, compared key by
            key, returned as dicts.
        check: verify that each continuing step's observation is its predecessor's next observation.
        compress: ``"lz4"`` keeps each observation unit of the ring (an observation, or one frame with stacks)
            LZ4-compressed, decoded inside the compiled gather; needs ``next_obs="shared"``. It pays for images
            (Atari frames: 4-26x less memory) at a price in sample time, and not for small vectors (an LZ4 block
            of 32 bytes is not smaller); results/compression.md has both. ``None`` (default): uncompressed.
    """

    def __init__(self, n_step: int = 1, gamma: float = 0.99, *, streams: int = 1, next_obs: str | None = None,
                 frame_stack: int | None = None, frame_padding: str = "first", frame_margin: int | None = None,
                 obs: str = "obs", check: bool = True, compress: str | None = None) -> None:
        self.n_step = check_positive_int(n_step, "n_step")
        self.gamma = check_real(gamma, "gamma", low=0.0, high=1.0)
        self.streams = check_positive_int(streams, "streams")
        self.frame_stack = None if frame_stack is None else check_positive_int(frame_stack, "frame_stack")
        if next_obs is None:
            next_obs = "shared" if self.frame_stack else "stored"
        self.next_obs = check_choice(next_obs, "next_obs", ("stored", "shared"))
        if self.frame_stack and self.next_obs != "shared":
            raise ValueError("next_obs: frame stacks are stored one frame per step, so next_obs must be 'shared', "
                             f"got {next_obs!r}")
        self.frame_padding = check_choice(frame_padding, "frame_padding", ("first", "zero"))
        default_margin = ((self.frame_stack or 1) - 1) * self.streams
        if frame_margin is None:
            self.frame_margin = default_margin
        elif isinstance(frame_margin, bool) or not isinstance(frame_margin, numbers.Integral) \
                or frame_margin < default_margin:
            raise ValueError(f"frame_margin: must be an int >= (frame_stack - 1) * streams = {default_margin}, "
                             f"got {frame_margin!r}")
        else:
            self.frame_margin = int(frame_margin)
        if not isinstance(obs, str) or not obs:
            raise TypeError(f"obs: expected a field name, got {_short(obs)}")
        self.obs = obs
        self.next_name = "next_" + obs
        self.check = check_bool(check, "check")
        if compress is not None:
            check_choice(compress, "compress", ("lz4",))
            if self.next_obs != "shared":
                raise ValueError(f"compress: only observations stored once (next_obs='shared', or frame_stack=k) are "
                                 f"compressed; got compress={compress!r} with next_obs={self.next_obs!r}")
        self.compress = compress

    @property
    def shared(self) -> bool:
        return self.next_obs == "shared"

    def config(self) -> dict[str, Any]:
        return {"n_step": self.n_step, "gamma": self.gamma, "streams": self.streams, "next_obs": self.next_obs,
                "frame_stack": self.frame_stack, "frame_padding": self.frame_padding,
                "frame_margin": self.frame_margin, "obs": self.obs, "check": self.check, "compress": self.compress}

    def __repr__(self) -> str:
        return "Episodes(" + ", ".join(f"{k}={v!r}" for k, v in self.config().items()) + ")"


# -- kernels -------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, inline="always")
def _copy_row(dst, d, src, r):
    for t in range(dst.shape[1]):
        dst[d, t] = src[r, t]


@njit(cache=True, nogil=True)
def _copy_unit(dst, d, units, arena, offs, lens, r):
    """Row ``r`` of the observation ring into row ``d`` of ``dst``: copied from ``units``, or decoded when the ring
    is compressed (``arena`` not None; then ``dst`` is a byte view)."""
    if arena is None:  # (pruned when compiling: an uncompressed ring passes None, and never reaches the decoder)
        _copy_row(dst, d, units, r)
    else:
        unpack_row(dst, d, arena, offs[r], lens[r])


@njit(cache=True, nogil=True)
def _walk(dst, base, top, c, units, arena, offs, lens, rpred, ring, zero_padding, seen, record, src, src_base,
          slots):
    """Copy the frames of the stack ending at id ``c`` into rows base, base+1, ..., base+top (oldest first),
    found by walking back through the episode from ``c``; before its first frame: padding.

    The walk back only reads ``rpred`` and notes each row's ring slot in ``slots`` (int64, >= top + 1 entries;
    -1: zero padding); the frames are copied after it, oldest first. A stack's frames lie at ascending addresses
    of the ring, and copying them in that order lets the hardware prefetcher stream them: copying newest first
    made n = 3 stacks of Atari frames (4 x 84 x 84 bytes) 1.20-1.25x slower to sample (issue 40 item 4;
    docs/speed.md, "Episodic sampling").

    With a compressed ring, ``seen`` (int64 [k]) holds the ring slot of each row ``src_base + q`` of ``src``
    already decoded for this sample (-1: none), and a frame found there is copied from that row instead of
    decoded again (a stack and its next stack share k - 1 frames, and "first" padding repeats a frame);
    ``record`` writes this walk's slots into ``seen``. An empty ``seen`` turns this off."""
    for t in range(top, -1, -1):
        slots[t] = c % ring if c >= 0 else -1
        p = rpred[c % ring] if c >= 0 else -1
        if p >= 0:
            c = p
        elif zero_padding:
            c = -1
        # "first" padding: c stays at the episode's first frame
    for t in range(top + 1):
        r = slots[t]
        if r >= 0:
            hit = -1
            for q in range(seen.shape[0]):
                if seen[q] == r:
                    hit = q
                    break
            if hit >= 0:
                _copy_row(dst, base + t, src, src_base + hit)
            else:
                _copy_unit(dst, base + t, units, arena, offs, lens, r)
        else:
            for col in range(dst.shape[1]):
                dst[base + t, col] = 0
        if record:
            seen[t] = r


@njit(cache=True, nogil=True)
def _next_stacks(heads, streams, rpred, ring, units, arena, offs, lens, head_units, k, zero_padding, out):
    """The full next observation (a stack) of each stream's newest step: its stack shifted by one
    frame, then the stream's pending newest frame."""
    none = np.empty(0, np.int64)
    slots = np.empty(k, np.int64)
    for b in range(heads.shape[0]):
        _walk(out, b * k, k - 2, heads[b], units, arena, offs, lens, rpred, ring, zero_padding, none, False, out, 0,
              slots)
        _copy_row(out, b * k + k - 1, head_units, streams[b])


@njit(cache=True, nogil=True)
def _prefetch_window(j, n, capacity, succ, reward, rs, units, umod, us, end, links, rows):
    """Start loading what the n-step window from id ``j`` reads, as if its steps were ids j, j+1, ..., j+n-1 (so
    they are with one stream; with more, the guess only misses): each step's link (if ``links``) and reward, and
    ``rows`` (n or n + 1) rows of ``units`` from id j on (ids % ``umod``: the stored next observations of the
    window's steps, or the ring's observations, one more for the window's next observation), their elements 0
    and ``end``. ``rs`` / ``us``: the row strides of ``reward`` and ``units`` in elements (they may be strided
    views into the storage's records: an element's flat offset from the data pointer is its row times that
    stride). A hint: values never change."""
    for t in range(n):
        s = (j + t) % capacity
        if links:  # (not when the window does not read them: see _window)
            prefetch(succ, s)
        prefetch(reward, s * rs)
        r = ((j + t) % umod) * us
        prefetch(units, r)
        prefetch(units, r + end)
    if rows > n:
        r = ((j + n) % umod) * us
        prefetch(units, r)
        prefetch(units, r + end)


@njit(cache=True, nogil=True, inline="always")
def _window(j, succ, reward, terminated, truncated, capacity, n, gamma, head):
    """The n-step window from id ``j``: (return, discount to the bootstrap value, steps, its last id, ended by a
    termination, ended by a truncation). Sutton & Barto's n-step return, cut at an episode's end or at its
    stream's newest step.

    ``head``: empty, or with one stream the stream's newest id (int64 [1]): a step that does not end its episode
    is then followed by the next id, or is the newest (pending), so its link is not read (one cache miss fewer
    per window: ``succ`` is an array of its own)."""
    single = head.shape[0] == 1
    g = 0.0
    d = 1.0
    m = 0
    ended_term = False
    ended_trunc = False
    while True:
        s = j % capacity
        g += d * reward[s]
        d *= gamma
        m += 1
        if terminated[s] or truncated[s]:
            ended_term = terminated[s]
            ended_trunc = truncated[s]  # both can be true: then no bootstrap (terminated wins)
            if ended_term:
                d = 0.0
            break
        if single:
            after = j + 1 if j < head[0] else PENDING
        else:
            after = succ[s]
        if m == n or after < 0:  # window full, or the stream's newest step (PENDING)
            break
        j = after
    return g, d, m, j, ended_term, ended_trunc


@njit(cache=True, nogil=True, inline="always")
def _put_window(b, j, succ, reward, terminated, truncated, capacity, n, gamma, head, ret, disc, steps, term, trunc):
    """:func:`_window` from id ``j``, written into entry b of the batch's outputs; returns its last id."""
    g, d, m, last, ended_term, ended_trunc = _window(j, succ, reward, terminated, truncated, capacity, n, gamma, head)
    ret[b] = g
    disc[b] = d
    steps[b] = m
    term[b] = ended_term
    trunc[b] = ended_trunc
    return last


@njit(cache=True, nogil=True)
def _windows_stored(ids, succ, reward, terminated, truncated, capacity, n, gamma, head, ret, disc, steps, term,
                    trunc, units, nxt):
    """The n-step windows of ``ids`` of a buffer that stores next observations (``next_obs="stored"``): return,
    discount, steps and how each window ended, and the stored next observation of its last step (``units``: the
    field's rows) into ``nxt``; ``head``: see :func:`_window`. (Its own kernel, not a mode of :func:`_gather`:
    numba's dispatch costs per argument, and is most of the fixed cost of a sample at small B.)"""
    count = ids.shape[0]
    ahead = AHEAD if n > 1 else 0  # (see _gather)
    rs = reward.strides[0] // reward.itemsize
    us = units.strides[0] // units.itemsize
    end = units.shape[1] - 1
    for b in range(min(ahead, count)):
        _prefetch_window(ids[b], n, capacity, succ, reward, rs, units, capacity, us, end, head.shape[0] == 0, n)
    for b in range(count):
        if ahead and b + ahead < count:
            _prefetch_window(ids[b + ahead], n, capacity, succ, reward, rs, units, capacity, us, end,
                             head.shape[0] == 0, n)
        j = _put_window(b, ids[b], succ, reward, terminated, truncated, capacity, n, gamma, head, ret, disc, steps,
                        term, trunc)
        _copy_row(nxt, b, units, j % capacity)


@njit(cache=True, nogil=True)
def _gather(ids, succ, reward, terminated, truncated, capacity, n, gamma, head, ret, disc, steps, term, trunc, units,
            arena, offs, lens, rpred, ring, final_units, final, head_units, stream, k, zero_padding, obs, nxt):
    """The n-step windows of ``ids`` (return, discount, steps, how each ended) of a buffer that stores
    observations once (``next_obs="shared"``), with the observations of ``ids`` and the next observations of the
    windows' last steps, copied row by row into ``obs`` / ``nxt`` (2-D views: one row per unit; k rows per sample
    with frames; byte views when the ring is compressed: ``arena`` not None); ``head``: see :func:`_window`."""
    seen = np.empty(k if k > 0 and arena is not None else 0, np.int64)  # (see _walk)
    slots = np.empty(k, np.int64)
    single = head.shape[0] == 1
    count = ids.shape[0]
    # Without frames a window's few rows are cache misses, each waited for in turn (a step's link gives the
    # next); asking for the rows of the window AHEAD samples on keeps many in flight: at N = 1e6 and B = 256 it
    # took sample+update with n = 3 windows of vectors from 92 to 61 us (issue 40 item 4; docs/speed.md). Frames
    # are long rows, which the hardware prefetcher streams (see _walk); a compressed ring's blocks are decoded.
    ahead = AHEAD if k == 0 and arena is None else 0
    rs = reward.strides[0] // reward.itemsize
    us = units.strides[0] // units.itemsize
    end = units.shape[1] - 1
    for b in range(min(ahead, count)):
        _prefetch_window(ids[b], n, capacity, succ, reward, rs, units, ring, us, end, not single, n + 1)
    for b in range(count):
        if ahead and b + ahead < count:
            _prefetch_window(ids[b + ahead], n, capacity, succ, reward, rs, units, ring, us, end, not single, n + 1)
        j = _put_window(b, ids[b], succ, reward, terminated, truncated, capacity, n, gamma, head, ret, disc, steps,
                        term, trunc)
        # where the window's next observation (or its newest frame) is
        s = j % capacity
        if not single:
            after = succ[s]
        elif term[b] or trunc[b]:
            after = ENDED
        else:
            after = j + 1 if j < head[0] else PENDING
        if k == 0:
            _copy_unit(obs, b, units, arena, offs, lens, ids[b] % ring)
            if after >= 0:
                _copy_unit(nxt, b, units, arena, offs, lens, after % ring)
            elif after == ENDED:
                _copy_row(nxt, b, final_units, final[s])
            else:
                _copy_row(nxt, b, head_units, stream[s])
            continue
        # frames: the stack of ids[b], then that of j shifted by one frame and the next newest frame
        if seen.shape[0]:
            seen[:] = -1
        _walk(obs, b * k, k - 1, ids[b], units, arena, offs, lens, rpred, ring, zero_padding, seen, True, obs, b * k,
              slots)
        _walk(nxt, b * k, k - 2, j, units, arena, offs, lens, rpred, ring, zero_padding, seen, False, obs, b * k,
              slots)
        if after >= 0:
            _copy_unit(nxt, b * k + k - 1, units, arena, offs, lens, after % ring)
        elif after == ENDED:
            _copy_row(nxt, b * k + k - 1, final_units, final[s])
        else:
            _copy_row(nxt, b * k + k - 1, head_units, stream[s])


def _rows(arr: np.ndarray, count: int | None = None) -> np.ndarray:
    """A 2-D view of ``arr``: one row per unit (observation or frame), never a copy (each unit's elements are
    contiguous, also in a stored field's view into the storage's rows); raises rather than copy."""
    view = arr.view()
    view.shape = (len(arr) if count is None else count, -1 if arr.size else 0)
    return view


#: ``arena, offs, lens`` of an uncompressed ring: the kernels copy rows of ``units``
_NO_PACK = (None, None, None)
#: a compressed ring's ``units`` argument (never read)
_NO_ROWS = np.zeros((1, 1), np.uint8)


# -- the store -----------------------------------------------------------------------------------------

class EpisodeStore:
    """Links, observation ring, final and head observations of an episodic buffer (internal)."""

    #: Plan single steps without frame stacks in scalars (:meth:`_prepare_one`); tests switch it off to
    #: compare with the batched path.
    one_step_path = True
    #: Row-wise equality of observations (NaN equal to NaN): by value; :class:`DictEpisodeStore` compares each key.
    _same_rows = staticmethod(same_rows)
    #: The observation stores of shared mode (``next_obs="shared"``): the ring of units (observations, or frames
    #: with stacks), each stream's pending next unit, and the final units of ended episodes. None until
    #: :meth:`allocate` fixes the observation layout (``obs_spec``); read only in shared mode after it, or
    #: after an ``is not None`` check. Typed as set, since the write, gather and load paths read them without
    #: narrowing (hot paths: no per-call checks).
    units: np.ndarray
    head_units: np.ndarray
    final_units: np.ndarray
    #: The compressed observation ring (``Episodes(compress="lz4")``), or None. With it, ``units`` is an empty
    #: array that only carries the unit's shape and dtype; head and final units stay uncompressed (one per stream
    #: and per episode end held: small next to the ring). (A class default: stores pickled before it have none.)
    packed: PackedUnits | None = None

    def __init__(self, capacity: int, cfg: Episodes) -> None:
        self.cfg = cfg
        self.capacity = capacity
        self.ring = capacity + cfg.frame_margin if cfg.shared else capacity
        streams = cfg.streams
        self.succ = np.full(capacity, ENDED, np.int64)
        self.stream = np.zeros(capacity, np.int64)
        self.pred = np.full(capacity, -1, np.int64)  # previous step of the episode (derived from succ on load)
        self.head = np.full(streams, -1, np.int64)  # newest id of each stream, -1 before its first step
        self.head_open = np.zeros(streams, np.bool_)  # does that step's episode go on?
        self.final = np.full(capacity, -1, np.int64) if cfg.shared else np.empty(0, np.int64)
        self.rpred = np.full(self.ring, -1, np.int64) if cfg.frame_stack else np.empty(0, np.int64)
        #: Stored fields a batch does not copy at the sampled rows: gather() computes them for the window.
        self.derived = frozenset(("terminated", "truncated") + (() if cfg.shared else (cfg.next_name,)))
        self.obs_spec: tuple[tuple[int, ...], np.dtype] | None = None
        self.units = self.final_units = self.head_units = None  # type: ignore[assignment]  # until allocate()
        self.final_free = np.empty(0, np.int64)
        #: (the stored next-observation field, then the arguments of the window kernel that do not change, then the
        #: field's name): what the gather of stored mode reads (:meth:`_gather_stored`), made once per storage
        #: (views into it: dropped from pickles and copies, remade on first use)
        self._stored_args: tuple | None = None
        #: the same for shared mode (:meth:`_gather_shared`)
        self._shared_args: tuple | None = None
        #: The folder whose file holds the observation ring (``ReplayBuffer(memmap=...)``), or None: in RAM.
        #: Only the ring is mapped: it is capacity-sized; the links, head and final observations stay in RAM.
        self.mapped: MappedFolder | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_stored_args"] = state["_shared_args"] = None
        state.pop("_next_rows", None)  # (the cache of an earlier perx, from a store unpickled from it)
        return state

    # layouts -------------------------------------------------------------------------------------
    def check_spec(self, spec: dict) -> None:
        """Raise unless the stored fields (``{name: FieldSpec}``; observations excluded in shared mode) are
        what an episodic buffer needs: a real scalar ``reward``, bool scalars ``terminated`` and
        ``truncated``, ``next_obs`` (stored mode), and no field named like a computed batch key."""
        cfg = self.cfg
        clash = sorted(set(spec) & set(RESERVED))
        if clash:
            raise ValueError(f"fields: {clash} name values an episodic batch computes; rename them")
        needed = ["reward", "terminated", "truncated"]
        if not cfg.shared:
            needed += [cfg.obs, cfg.next_name] if cfg.check else [cfg.next_name]
        missing = [n for n in needed if n not in spec]
        if missing:
            raise ValueError(f"fields: an episodic buffer needs {missing}")
        reward = spec["reward"]
        if reward.shape != () or reward.dtype not in REWARD_DTYPES:
            raise TypeError(f"reward: an episodic buffer needs a scalar int or float32/float64 reward, got "
                            f"{reward.dtype}{list(reward.shape)}")
        for name in ("terminated", "truncated"):
            if spec[name].shape != () or spec[name].dtype != np.bool_:
                raise TypeError(f"{name}: an episodic buffer stores it as a bool scalar, got "
                                f"{spec[name].dtype}{list(spec[name].shape)}")
        if not cfg.shared and cfg.obs in spec and spec[cfg.obs] != spec[cfg.next_name]:
            raise ValueError(f"{cfg.next_name}: must have the shape and dtype of {cfg.obs}")

    def check_obs(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        cfg = self.cfg
        if cfg.frame_stack and (len(shape) == 0 or shape[0] != cfg.frame_stack):
            raise ValueError(f"{cfg.obs}: frame_stack={cfg.frame_stack} needs observations of shape "
                             f"({cfg.frame_stack}, ...), got {shape}")
        if np.dtype(dtype) not in OBS_DTYPES:
            raise TypeError(f"{cfg.obs}: observations of dtype {dtype} cannot be stored once (the compiled "
                            f"gather supports bool, integers, float32/64 and complex64/128)")

    def allocate(self, obs_shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Fix the observation shape (the stack's shape with frames) and allocate the stores."""
        cfg = self.cfg
        self.check_obs(obs_shape, dtype)
        unit = obs_shape[1:] if cfg.frame_stack else obs_shape
        packed = None
        try:
            if getattr(cfg, "compress", None):  # (an Episodes unpickled from an earlier perx has no compress)
                if self.mapped is not None:
                    raise ValueError("compress: a compressed observation ring is kept in RAM; it cannot be combined "
                                     "with memmap=")
                packed = PackedUnits(self.ring, unit, np.dtype(dtype))
                units = np.zeros((0, *unit), dtype)
            else:
                units = zeros(self.mapped, "units", (self.ring, *unit), dtype)
            head_units = np.zeros((cfg.streams, *unit), dtype)
            final_units = np.zeros((max(16, cfg.streams), *unit), dtype)
        except (MappedFileError, MappedCreateError):
            raise
        except (MemoryError, ValueError) as err:
            raise MemoryError(f"capacity: cannot allocate {self.ring} observations of shape {unit} {dtype} "
                              f"({type(err).__name__})") from None
        self.obs_spec = (tuple(obs_shape), np.dtype(dtype))
        self.units, self.head_units, self.final_units = units, head_units, final_units
        self.packed = packed
        self.final_free = np.arange(len(final_units) - 1, -1, -1, dtype=np.int64)  # a stack: pop from the end

    @property
    def nbytes(self) -> int:
        arrays = [self.succ, self.stream, self.pred, self.head, self.head_open, self.final, self.rpred,
                  self.final_free]
        arrays += [a for a in (self.units, self.final_units, self.head_units) if a is not None]
        return sum(a.nbytes for a in arrays) + (self.packed.nbytes if self.packed is not None else 0)

    def _unit_rows(self, arr: np.ndarray, count: int | None = None) -> np.ndarray:
        """The kernels' 2-D view of observation units (:func:`_rows`): bytes when the ring is compressed."""
        rows = _rows(arr, count)
        return rows if self.packed is None else rows.view(np.uint8)

    def _ring(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """The kernels' (units, arena, offs, lens) arguments: the ring's rows, or the compressed ring."""
        packed = self.packed
        return (_rows(self.units), *_NO_PACK) if packed is None else (_NO_ROWS, *packed.packed)

    def _put_units(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Write the ring units of the consecutive ``ids`` (the newest written)."""
        if self.packed is None:
            self.units[ids % self.ring] = values
        else:
            self.packed.put(ids, values)

    # writing -------------------------------------------------------------------------------------
    def prepare(self, obs: np.ndarray | None, next_obs: np.ndarray | None, terminated: np.ndarray,
                truncated: np.ndarray, stream: object, rows: int, next_id: int,
                stored_next: np.ndarray | None = None) -> dict:
        """Validate one batch of steps (``rows`` of them, ids ``next_id ...``) and work out their links.
        Changes nothing; returns the plan that :meth:`write` applies. ``obs``/``next_obs`` are the batch's
        (batched arrays); ``stored_next`` is the storage's next-observation field when it is stored there
        (``next_obs="stored"``), for checking that a step continues the one written before it."""
        cfg = self.cfg
        if rows == 1 and not cfg.frame_stack and self.one_step_path:
            return self._prepare_one(obs, next_obs, terminated, truncated, stream, next_id, stored_next)
        e = _stream_array(stream, rows, cfg.streams)
        ended = np.asarray(terminated, np.bool_) | np.asarray(truncated, np.bool_)
        ids = np.arange(next_id, next_id + rows, dtype=np.int64)
        # the previous step of the same stream inside this batch, if any
        prev_in = np.full(rows, -1, np.int64)
        next_in = np.full(rows, -1, np.int64)
        if rows > 1:
            order = np.argsort(e, kind="stable")
            same = e[order[1:]] == e[order[:-1]]
            prev_in[order[1:][same]] = order[:-1][same]
            next_in[order[:-1][same]] = order[1:][same]
        inside = prev_in >= 0
        continuing = np.where(inside, ~ended[np.maximum(prev_in, 0)], self.head_open[e])
        pred = np.where(continuing, np.where(inside, ids[np.maximum(prev_in, 0)], self.head[e]), -1)
        plan: dict[str, Any] = {"e": e, "ended": ended, "pred": pred, "prev_in": prev_in, "next_in": next_in,
                                "continuing": continuing}
        if cfg.shared:
            k = cfg.frame_stack
            if k and k > 1:
                self._check_gaps(ids, pred, continuing, inside)
            # shared mode: the buffer always passes the observations
            plan["cur"], plan["nxt"] = (obs[:, -1], next_obs[:, -1]) if k else (obs, next_obs)  # type: ignore[index]
        if cfg.check:
            self._check_continuity(obs, next_obs, plan, stored_next, next_id)
        return plan

    def _prepare_one(self, obs, next_obs, terminated, truncated, stream, next_id, stored_next) -> dict:
        """:meth:`prepare` for one step without frame stacks, in scalars (one environment per add, the
        common case): the same checks and the same links, ~2.3x cheaper than the batched path."""
        cfg = self.cfg
        e = 0 if stream is None and cfg.streams == 1 else int(_stream_array(stream, 1, cfg.streams)[0])
        ended = bool(terminated[0]) or bool(truncated[0])
        continuing = bool(self.head_open[e])
        pred = int(self.head[e]) if continuing else -1
        if cfg.check and continuing:
            expected = None
            if cfg.shared:
                if self.units is not None:
                    expected = self.head_units[e]
            elif stored_next is not None and pred >= next_id - self.capacity:  # still stored
                expected = stored_next[pred % self.capacity]
            if expected is not None and not self._same_rows(obs, expected[None])[0]:
                raise self._not_continuing(0, e, self._which_key(obs[0], expected))
        plan = {"one": (e, ended, pred, continuing)}
        if cfg.shared:
            plan["cur"], plan["nxt"] = obs, next_obs
        return plan

    def _not_continuing(self, row: int, stream: int, where: str = "") -> ValueError:
        cfg = self.cfg
        return ValueError(
            f"{cfg.obs}: row {row} (stream {stream}) continues an episode but its observation{where} is not the "
            f"previous step's {cfg.next_name}. Every step of an episode must follow the one before in "
            f"its stream, and a new episode starts only after a terminated or truncated step (end an "
            f"abandoned one with buffer.end_episodes). With Gymnasium's next-step autoreset the step "
            f"that only resets a sub-environment is not a transition: perx.gym.VectorRecorder drops it"
        )

    def _which_key(self, a: np.ndarray, b: np.ndarray) -> str:
        """For an error message: which part of two unequal observations differs ("" here: they are one array)."""
        return ""

    def _check_gaps(self, ids, pred, continuing, inside):
        gap = self.cfg.frame_margin // (self.cfg.frame_stack - 1)
        far = continuing & (ids - pred > gap)
        if far.any():
            b = int(np.flatnonzero(far)[0])
            raise ValueError(
                f"stream: step {int(ids[b])} continues step {int(pred[b])} of its stream, {int(ids[b] - pred[b])} "
                f"ids back; stacks of {self.cfg.frame_stack} frames keep only steps up to frame_margin // "
                f"(frame_stack - 1) = {gap} ids apart. Let every stream add one step per round, or raise "
                f"frame_margin in perx.Episodes"
            )

    def _check_continuity(self, obs, next_obs, plan, stored_next, next_id):
        """A continuing step's observation must be its predecessor's next observation; with stacks, each
        step's next stack must also be its stack shifted by one frame, and an episode's first stack must
        be padded as configured. NaN equals NaN here."""
        cfg = self.cfg
        cont, prev_in, e = plan["continuing"], plan["prev_in"], plan["e"]
        inside = prev_in >= 0
        k = cfg.frame_stack
        if k and k > 1:
            shifted = self._same_rows(next_obs[:, :-1], obs[:, 1:])
            if not shifted.all():
                b = int(np.flatnonzero(~shifted)[0])
                raise ValueError(f"{cfg.next_name}: row {b} is not its {cfg.obs} shifted by one frame "
                                 f"({cfg.next_name}[:-1] must equal {cfg.obs}[1:])"
                                 f"{self._which_key(next_obs[b, :-1], obs[b, 1:])}")
        # predecessors inside the batch; stored ones are written in below, so the array takes a dtype that holds
        # both exactly (a next_obs in a narrower dtype than the store's must not round what it is compared with)
        stored = self.units if cfg.shared and self.units is not None else stored_next
        common = next_obs.dtype if stored is None else np.result_type(next_obs.dtype, stored.dtype)
        expected = next_obs[np.maximum(prev_in, 0)].astype(common, copy=False)
        known = cont & inside
        from_head = cont & ~inside
        if from_head.any():
            rows_h = np.flatnonzero(from_head)
            heads = self.head[e[rows_h]]
            if cfg.shared and self.units is not None:
                if k:
                    stacks = np.empty((len(rows_h), *obs.shape[1:]), self.units.dtype)
                    _next_stacks(heads, e[rows_h], self.rpred, self.ring, *self._ring(),
                                 self._unit_rows(self.head_units), k, cfg.frame_padding == "zero",
                                 self._unit_rows(stacks, len(rows_h) * k))
                    expected[rows_h] = stacks
                else:
                    expected[rows_h] = self.head_units[e[rows_h]]
                known = cont
            elif stored_next is not None:  # the predecessor's stored next_obs, while it is still stored
                live = heads >= next_id - self.capacity
                expected[rows_h[live]] = stored_next[heads[live] % self.capacity]
                known = known.copy()
                known[rows_h[live]] = True
        bad = known & ~self._same_rows(obs, expected)
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            raise self._not_continuing(b, int(e[b]), self._which_key(obs[b], expected[b]))
        if k and k > 1:
            starts = ~cont
            pad = obs[:, :-1]
            want = np.zeros_like(pad) if cfg.frame_padding == "zero" else np.repeat(obs[:, -1:], k - 1, axis=1)
            bad = starts & ~self._same_rows(pad, want)
            if bad.any():
                b = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"{cfg.obs}: row {b} starts an episode but its stack{self._which_key(pad[b], want[b])} is not "
                    f"padded with {'zeros' if cfg.frame_padding == 'zero' else 'its first frame'} "
                    f"(frame_padding={cfg.frame_padding!r}); set frame_padding to match the environment")

    def end_episodes(self, streams: np.ndarray, storage: dict[str, np.ndarray], next_id: int) -> int:
        """End the open episodes of ``streams`` at their newest stored steps, as truncations (they
        bootstrap from their next observations). Returns how many were still stored and got marked."""
        marked = 0
        for e in np.unique(streams).tolist():
            if not self.head_open[e]:
                continue
            head = int(self.head[e])
            self.head_open[e] = False
            if head < next_id - self.capacity:
                continue  # already overwritten: nothing stored to mark
            s = head % self.capacity
            storage["truncated"][s] = True
            self.succ[s] = ENDED
            if self.cfg.shared:
                where = self._take_final(1)
                self.final_units[where] = self.head_units[e]
                self.final[s] = where[0]
            marked += 1
        return marked

    def write(self, plan: dict, ids: np.ndarray, slots: np.ndarray, next_id_before: int) -> None:
        """Apply a plan after the storage wrote rows ``ids`` (the kept ones at ``slots``)."""
        cfg = self.cfg
        rows = len(ids)
        if rows == 1 and len(slots) == 1:
            self._write_one(plan, int(ids[0]), int(slots[0]), next_id_before)
            return
        e, ended, pred, next_in = plan["e"], plan["ended"], plan["pred"], plan["next_in"]
        kept = len(slots)
        first_kept = rows - kept
        cap, ring = self.capacity, self.ring
        # predecessors written earlier now have a successor (if still stored and not overwritten now)
        from_head = plan["continuing"] & (plan["prev_in"] < 0)
        oldest_after = next_id_before + rows - cap
        linked = pred[from_head]
        alive = linked >= oldest_after
        self.succ[linked[alive] % cap] = ids[from_head][alive]
        if cfg.shared:
            # evicted rows give back their final observations
            old = self.final[slots]
            freed = old[old >= 0]
            if len(freed):
                self.final_free = np.concatenate((self.final_free, freed))
            self.final[slots] = -1
        succ = np.where(ended, ENDED, np.where(next_in >= 0, ids[np.maximum(next_in, 0)], PENDING))
        self.succ[slots] = succ[first_kept:]
        self.stream[slots] = e[first_kept:]
        self.pred[slots] = pred[first_kept:]
        if cfg.shared:
            in_ring = slice(max(0, rows - ring), rows)
            self._put_units(ids[in_ring], plan["cur"][in_ring])
            if cfg.frame_stack:
                self.rpred[ids[in_ring] % ring] = pred[in_ring]
            finals = np.flatnonzero(ended[first_kept:]) + first_kept
            if len(finals):
                where = self._take_final(len(finals))
                self.final_units[where] = plan["nxt"][finals]
                self.final[ids[finals] % cap] = where
        # each stream's newest step
        last = np.full(cfg.streams, -1, np.int64)
        last[e] = np.arange(rows)  # the last assignment wins: the stream's last row in this batch
        touched = last >= 0
        rows_last = last[touched]
        self.head[touched] = ids[rows_last]
        self.head_open[touched] = ~ended[rows_last]
        if cfg.shared:
            self.head_units[touched] = plan["nxt"][rows_last]

    def _write_one(self, plan: dict, i: int, s: int, next_id_before: int) -> None:
        """:meth:`write` for a single step (the common case of one environment per buffer), in scalars."""
        cfg, cap = self.cfg, self.capacity
        if "one" in plan:
            e, ended, pred, continuing = plan["one"]
        else:
            e, ended, pred = int(plan["e"][0]), bool(plan["ended"][0]), int(plan["pred"][0])
            continuing = bool(plan["continuing"][0])
        if continuing and pred >= next_id_before + 1 - cap:
            self.succ[pred % cap] = i
        if cfg.shared:
            old = self.final[s]
            if old >= 0:
                self.final_free = np.append(self.final_free, old)
            self.final[s] = -1
        self.succ[s] = ENDED if ended else PENDING
        self.stream[s] = e
        self.pred[s] = pred
        if cfg.shared:
            if self.packed is None:
                self.units[i % self.ring] = plan["cur"][0]
            else:
                self.packed.put(np.array([i], np.int64), plan["cur"][:1])
            if cfg.frame_stack:
                self.rpred[i % self.ring] = pred
            if ended:
                where = self._take_final(1)
                self.final_units[where[0]] = plan["nxt"][0]
                self.final[s] = where[0]
            self.head_units[e] = plan["nxt"][0]  # as write() does (read only while the episode is open)
        self.head[e] = i
        self.head_open[e] = not ended

    def _take_final(self, count: int) -> np.ndarray:
        if len(self.final_free) < count:
            old = self.final_units
            grown = max(2 * len(old), len(old) + count)
            units = np.zeros((grown, *old.shape[1:]), old.dtype)
            units[: len(old)] = old
            self.final_units = units
            self.final_free = np.concatenate((np.arange(grown - 1, len(old) - 1, -1, dtype=np.int64),
                                              self.final_free))
        where = self.final_free[-count:][::-1].copy()
        self.final_free = self.final_free[:-count]
        return where

    # sampling ------------------------------------------------------------------------------------
    def _gather_stored(self, ids: np.ndarray, data: dict[str, np.ndarray], storage: dict[str, np.ndarray]) -> None:
        """:meth:`gather` of stored mode: the windows, and the stored next observations of their last steps, in
        one compiled call. Written for the fixed cost of a sample at small B (about 2 us of Python around the
        kernel at B = 32; results/episodic_parts.md): the arguments that do not change are made once per storage,
        and a batch drawn and copied in one call (``ReplayBuffer.sample``), which already holds the sampled rows'
        own next observations and end flags (fresh arrays of that batch), has them overwritten in place with the
        windows'; other callers leave them out (``derived``), and they are allocated here."""
        cfg = self.cfg
        source = storage[cfg.next_name]
        # (a store unpickled from an earlier perx has none; it may carry that perx's _next_rows, never read)
        cached = self.__dict__.get("_stored_args")
        if cached is None or cached[0] is not source:
            cached = self._stored_args = (source, self.succ, storage["reward"], storage["terminated"],
                                        storage["truncated"], self.capacity, cfg.n_step, cfg.gamma,
                                        self.head if cfg.streams == 1 else np.empty(0, np.int64), _rows(source),
                                        cfg.next_name)
        _, succ, reward, terminated, truncated, cap, n, gamma, head, rows, name = cached
        count = len(ids)
        nxt, term, trunc = data.get(name), data.get("terminated"), data.get("truncated")
        if nxt is None or term is None or trunc is None:
            nxt = np.empty((count, *source.shape[1:]), source.dtype)
            term, trunc = np.empty(count, np.bool_), np.empty(count, np.bool_)
        ret, disc, steps = np.empty(count), np.empty(count), np.empty(count, np.int64)
        _windows_stored(ids, succ, reward, terminated, truncated, cap, n, gamma, head, ret, disc, steps, term, trunc,
                        rows, nxt if nxt.ndim == 2 else _rows(nxt, count))
        data[name] = nxt
        data["return"] = ret
        data["discount"] = disc
        data["steps"] = steps
        data["terminated"] = term
        data["truncated"] = trunc

    def _gather_shared(self, ids: np.ndarray, data: dict[str, np.ndarray], storage: dict[str, np.ndarray]) -> None:
        """:meth:`gather` of shared mode: the windows, and the observations and next observations rebuilt from the
        ring, in one compiled call; the kernel's arguments that do not change are made once (as in
        :meth:`_gather_stored`), again whenever an observation store is replaced (allocated, or the final
        observations' store grown)."""
        cfg = self.cfg
        units, final_units, head_units, reward = self.units, self.final_units, self.head_units, storage["reward"]
        cached: Any = self.__dict__.get("_shared_args")
        if cached is None or cached[0] is not units or cached[1] is not final_units or cached[2] is not head_units \
                or cached[3] is not reward:
            rows = _rows if self.packed is None else self._unit_rows
            links = self.head if cfg.streams == 1 else np.empty(0, np.int64)
            cached = self._shared_args = (
                units, final_units, head_units, reward,
                (self.succ, reward, storage["terminated"], storage["truncated"], self.capacity, cfg.n_step, cfg.gamma,
                 links),
                None if self.packed is not None else self._ring(),
                (self.rpred, self.ring, rows(final_units), self.final, rows(head_units), self.stream,
                 cfg.frame_stack or 0, cfg.frame_padding == "zero"),
                (cfg.frame_stack,) if cfg.frame_stack else (), units.shape[1:], units.dtype, rows)
        _, _, _, _, front, ring, back, stack, unit, dtype, rows = cached
        count = len(ids)
        obs = np.empty((count, *stack, *unit), dtype)
        nxt = np.empty((count, *stack, *unit), dtype)
        ret, disc, steps = np.empty(count), np.empty(count), np.empty(count, np.int64)
        term, trunc = np.empty(count, np.bool_), np.empty(count, np.bool_)
        if ring is None:  # a compressed ring: its arena is replaced as it grows or shrinks
            ring = self._ring()
        if not stack and obs.ndim == 2 and self.packed is None:  # already one row per unit
            obs_rows, nxt_rows = obs, nxt
        else:
            units_per = count * (stack[0] if stack else 1)
            obs_rows, nxt_rows = rows(obs, units_per), rows(nxt, units_per)
        args = (ids, *front, ret, disc, steps, term, trunc, *ring, *back, obs_rows, nxt_rows)
        _gather(*args)
        data[cfg.obs] = obs
        data[cfg.next_name] = nxt
        data["return"] = ret
        data["discount"] = disc
        data["steps"] = steps
        data["terminated"] = term
        data["truncated"] = trunc

    def gather(self, ids: np.ndarray, slots: np.ndarray | None, data: dict[str, np.ndarray],
               storage: dict[str, np.ndarray]) -> None:
        """Add the episode fields of a batch to ``data`` (the rows of the stored fields at ``slots``):
        one compiled pass computes the windows and copies the observations."""
        cfg = self.cfg
        if cfg.next_obs == "stored":
            self._gather_stored(ids, data, storage)
            return
        self._gather_shared(ids, data, storage)

    # state ---------------------------------------------------------------------------------------
    def _ring_ids(self, next_id: int) -> np.ndarray:
        """Ids whose observation units are still in the ring, oldest first."""
        return np.arange(max(0, next_id - self.ring), next_id, dtype=np.int64)

    def state_dict(self, size: int, next_id: int, *, with_units: bool = True) -> tuple[dict, dict[str, np.ndarray]]:
        """(metadata, arrays) of the episode state; without ``with_units`` (a memmap buffer's state file) the
        observation ring is left out: it is the buffer's file."""
        meta = {"config": self.cfg.config(),
                "obs_spec": None if self.obs_spec is None else [list(self.obs_spec[0]), self.obs_spec[1].str]}
        arrays = {"succ": self.succ[:size], "stream": self.stream[:size], "head": self.head,
                  "head_open": self.head_open}
        if self.cfg.shared and self.obs_spec is not None:
            used = self.final[:size]
            has = used >= 0
            # final observations compacted in slot order: entry t belongs to the t-th slot that has one
            arrays["final_units"] = self.final_units[used[has]]
            arrays["final_slots"] = np.flatnonzero(has).astype(np.int64)
            ring_ids = self._ring_ids(next_id) % self.ring
            if with_units and self.packed is not None:  # the compressed blocks, checked on load
                arrays["units_lz4"], arrays["units_lz4_lengths"] = self.packed.blocks(ring_ids)
            elif with_units:
                arrays["units"] = self.units[ring_ids]  # in id order, only what was written
            arrays["head_units"] = self.head_units
            if self.cfg.frame_stack:
                arrays["rpred"] = self.rpred[ring_ids]
        return meta, arrays

    def load_state_dict(self, meta: dict, arrays: dict[str, np.ndarray], size: int, next_id: int,
                        storage: dict[str, np.ndarray], *, with_units: bool = True) -> None:
        """Restore from :meth:`state_dict`, checking every value (the file is untrusted). Without ``with_units``
        the observation ring is already in place (a reopened memmap buffer's file)."""
        from perx.samplers.base import check_array, check_keys

        cfg = self.cfg
        cap = self.capacity
        spec = meta.get("obs_spec")
        if cfg.shared and spec is not None:
            try:
                shape, dtype = tuple(int(d) for d in spec[0]), np.dtype(spec[1])
            except (TypeError, ValueError, IndexError) as err:
                raise ValueError(f"episodes obs_spec: {_short(spec)} ({err})") from None
            if dtype.kind not in "biufc" or any(d < 0 for d in shape):
                raise ValueError(f"episodes obs_spec: {_short(spec)} is not a numeric array layout")
            self.allocate(shape, dtype)
        elif cfg.shared and next_id:
            raise ValueError("episodes: observations are missing for the stored steps")
        expected = self.state_dict(size, next_id, with_units=with_units)[1]
        check_keys(arrays, expected, "episode arrays")
        for name, arr in expected.items():
            if name not in ("final_units", "final_slots", "units_lz4"):  # (blocks: checked by restore())
                check_array(arrays[name], name, arr.shape, arr.dtype)
        succ, stream = arrays["succ"], arrays["stream"]
        head, head_open = arrays["head"], arrays["head_open"]
        if size and (stream.min() < 0 or stream.max() >= cfg.streams):
            raise ValueError(f"stream: values must lie in [0, {cfg.streams})")
        ids = _live_ids(size, next_id, cap)  # the id in each slot
        if not ((succ == ENDED) | (succ == PENDING) | ((succ > ids) & (succ < next_id))).all():
            raise ValueError("succ: a step's successor must be a later stored id, -1 (ended) or -2 (pending)")
        linked = succ >= 0
        if linked.any() and (stream[succ[linked] % cap] != stream[linked]).any():
            raise ValueError("succ: a step's successor belongs to another stream")
        if size:
            ended = storage["terminated"][:size] | storage["truncated"][:size]
        else:  # saved before its first add: without spec= the storage has no fields yet
            ended = np.zeros(0, np.bool_)
        if not np.array_equal(succ == ENDED, ended):
            raise ValueError("succ: -1 (ended) must mark exactly the terminated or truncated steps")
        # a stream's steps are written in id order, and a step that does not end its episode is continued by
        # its stream's next step: so succ follows from the streams and the ends, and no link may skip a step of
        # its stream or share its successor with another step
        order = np.lexsort((ids, stream))  # slots by stream, then by id
        same = stream[order[1:]] == stream[order[:-1]]
        after = np.full(size, PENDING, np.int64)
        after[order[:-1][same]] = ids[order[1:][same]]
        bad = np.flatnonzero(succ != np.where(ended, ENDED, after))
        if len(bad):
            b = int(bad[0])
            raise ValueError(f"succ: a step that does not end its episode must link to the next stored step of its "
                             f"stream, or be pending (-2) if it is the stream's newest; step {int(ids[b])} links to "
                             f"{int(succ[b])}, not {int(after[b])}")
        if ((head < -1) | (head >= next_id)).any():
            raise ValueError("head: stream heads must be ids already issued, or -1")
        newest = np.full(cfg.streams, -1, np.int64)
        np.maximum.at(newest, stream, ids)
        has = newest >= 0
        gone = head[~has]
        if not np.array_equal(head[has], newest[has]) or ((gone >= 0) & (gone >= next_id - cap)).any() \
                or len(np.unique(head[head >= 0])) != np.count_nonzero(head >= 0):
            raise ValueError(f"head: a stream's head must be its newest stored step, else an overwritten id (one "
                             f"per stream) or -1 before its first step; got {_short(head.tolist())} with newest "
                             f"stored steps {_short(newest.tolist())} (-1: none)")
        # with succ checked above, this also makes -2 (pending) mark exactly the open heads still stored
        wrong = head_open & (head < 0)
        wrong[has] |= head_open[has] == ended[newest[has] % cap]
        if wrong.any():
            raise ValueError(f"head_open: a stream's episode goes on only after a step that did not end it; stream "
                             f"{int(np.flatnonzero(wrong)[0])} has {bool(head_open[np.flatnonzero(wrong)[0]])}")
        self.succ[:size], self.stream[:size] = succ, stream
        self.pred[:] = -1
        self.pred[succ[linked] % cap] = ids[linked]
        self.head[:], self.head_open[:] = head, head_open
        if not cfg.shared or spec is None:
            return
        final_slots, final_units = arrays["final_slots"], arrays["final_units"]
        if not isinstance(final_slots, np.ndarray) or not np.array_equal(final_slots, np.flatnonzero(succ == ENDED)):
            raise ValueError("final_slots: must list exactly the slots of the steps that ended an episode")
        check_array(final_units, "final_units", (len(final_slots), *self.units.shape[1:]), self.units.dtype)
        ring_ids = self._ring_ids(next_id)
        if cfg.frame_stack:
            p = arrays["rpred"]
            if ((p != -1) & ((p < 0) | (p >= ring_ids))).any():
                raise ValueError("rpred: a frame's predecessor must be an earlier id, or -1")
            self._check_frame_links(p, ring_ids, ids, stream, next_id)
            self.rpred[ring_ids % self.ring] = p
        if with_units and self.packed is not None:
            self.packed.restore(ring_ids, arrays["units_lz4"], arrays["units_lz4_lengths"], "units_lz4")
        elif with_units:
            self.units[ring_ids % self.ring] = arrays["units"]
        self.head_units[:] = arrays["head_units"]
        self.final[:] = -1
        where = self._take_final(len(final_slots)) if len(final_slots) else np.empty(0, np.int64)
        self.final_units[where] = final_units
        self.final[final_slots] = where

    def _check_frame_links(self, rpred: np.ndarray, ring_ids: np.ndarray, ids: np.ndarray, stream: np.ndarray,
                           next_id: int) -> None:
        """Raise unless ``rpred`` (the frame predecessor of each id in ``ring_ids``, as loaded) is what adding
        the steps wrote, as far as the rest of the state tells: stacks are walked through it, so a crafted link
        would build them from frames of another stream or episode. Needs ``self.pred`` and ``self.head``
        restored (from checked values)."""
        cfg, cap = self.cfg, self.capacity
        k = cast(int, cfg.frame_stack)  # called only with frame stacks
        linked = rpred >= 0
        far = linked & (ring_ids - rpred > cfg.frame_margin // max(k - 1, 1))
        if k > 1 and far.any():
            b = int(np.flatnonzero(far)[0])
            raise ValueError(f"rpred: a frame's predecessor must lie at most frame_margin // (frame_stack - 1) = "
                             f"{cfg.frame_margin // (k - 1)} ids back (adding refuses a step further from it); id "
                             f"{int(ring_ids[b])} follows {int(rpred[b])}")
        # each step has at most one successor, and a stream's newest step none yet
        followed = rpred[linked]
        values, counts = np.unique(followed, return_counts=True)
        twice = np.concatenate((values[counts > 1], followed[np.isin(followed, self.head)]))
        if len(twice):
            raise ValueError(f"rpred: a frame is followed by at most one frame, and a stream's newest step by none; "
                             f"id {int(twice[0])} is followed by ids {_short(ring_ids[rpred == twice[0]].tolist())}")
        # a stored step follows the step succ links to it; without one it starts an episode (-1), unless it is
        # its stream's oldest stored step: its predecessor may have been overwritten (with stacks of k >= 2
        # frames its frame is then still in the ring)
        oldest = np.full(cfg.streams, next_id, np.int64)
        np.minimum.at(oldest, stream, ids)
        stored = ring_ids >= next_id - cap
        slots = ring_ids[stored] % cap
        got, want = rpred[stored], self.pred[slots]
        overwritten = (want == -1) & (ids[slots] == oldest[stream[slots]]) & (got < next_id - cap)
        bad = np.flatnonzero((got != want) & ~overwritten)
        if len(bad):
            b = int(bad[0])
            raise ValueError(f"rpred: a stored step's frame must follow the step its stream's succ links to it, or "
                             f"none (-1) if no stored step does; id {int(ring_ids[stored][b])} follows {int(got[b])}, "
                             f"not {int(want[b])}")


class DictEpisodeStore(EpisodeStore):
    """The episode store of a buffer whose observations are dicts (Gymnasium ``Dict`` spaces, internal).

    The buffer packs each observation's keys into one unit of words (:class:`perx._nested.DictLayout`; one unit
    per frame with stacks), so links, shared next observations, final and head observations and frame stacks
    work on those units exactly as on a plain observation. What differs: observations are compared key by key
    and by value (NaN equal to NaN), errors name the key, and a batch's observations are unpacked into dicts.
    """

    def __init__(self, capacity: int, cfg: Episodes, layout: DictLayout) -> None:
        if cfg.compress:
            raise ValueError(f"compress: dict observations are not compressed; got compress={cfg.compress!r} with "
                             f"the dict observation {cfg.obs!r}")
        super().__init__(capacity, cfg)
        self.layout = layout
        self._same_rows = layout.same_rows

    def check_obs(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        want = self.layout.spec
        if tuple(shape) != want.shape or np.dtype(dtype) != want.dtype:
            raise ValueError(f"{self.cfg.obs}: dict observations are held packed as {want.dtype}{list(want.shape)}, "
                             f"got {np.dtype(dtype)}{list(shape)}")

    def _which_key(self, a: np.ndarray, b: np.ndarray) -> str:
        return self.layout.which_key(a, b)

    def gather(self, ids: np.ndarray, slots: np.ndarray | None, data: dict, storage: dict[str, np.ndarray]) -> None:
        super().gather(ids, slots, data, storage)
        unpack = self.layout.unpack
        for name in (self.cfg.obs, self.cfg.next_name):
            if name in data:
                data[name] = unpack(data[name])


def _live_ids(size: int, next_id: int, capacity: int) -> np.ndarray:
    """Ids of slots 0..size-1."""
    from perx.samplers.base import ids_of_slots

    return ids_of_slots(np.arange(size, dtype=np.int64), next_id, capacity) if size else np.empty(0, np.int64)


def _expand(mask: np.ndarray, like: np.ndarray) -> np.ndarray:
    return mask.reshape(mask.shape + (1,) * (like.ndim - 1))


def _stream_array(stream: object, rows: int, streams: int) -> np.ndarray:
    if stream is None:
        if streams != 1:
            raise ValueError(f"stream: this buffer has {streams} streams; say which one each step comes from "
                             f"with stream=")
        return np.zeros(rows, np.int64)
    arr = to_numpy(stream)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"stream: expected integers, got {_short(stream)}")
    if arr.ndim == 0:
        arr = np.full(rows, int(arr), np.int64)
    if arr.shape != (rows,):
        raise ValueError(f"stream: expected {rows} stream ids, got shape {arr.shape}")
    if rows and (arr.min() < 0 or arr.max() >= streams):
        raise ValueError(f"stream: ids must lie in [0, {streams}), got {_short(stream)}")
    return arr.astype(np.int64)
