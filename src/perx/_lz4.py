"""LZ4 block compression of observation units, compiled (``perx.Episodes(compress="lz4")``; internal).

Why LZ4, and why compiled here: a stacked-frame sample decodes k frames per observation and per next
observation (B = 32, k = 4: 256 frames), so decoding speed decides what compression costs, and a call into a
Python codec per frame would cost more than the decoding itself. These kernels run inside the compiled gather
(:mod:`perx.episodes`), with no Python call per frame. LZ4's block format decodes with a simple loop (literal
runs and back-references), so a compiled decoder is short; it is the format of the ``lz4`` package
(``lz4.block`` without a size header), and the tests check both directions against that package. The choice
against zlib and zstd is measured in results/compression.md (benchmarks/bench_compress.py).

Format (the LZ4 block format specification): a sequence of (token, literal length bytes, literals, 2-byte
little-endian offset, match length bytes); the token's high nibble is the literal count, its low nibble the
match length minus 4, 15 meaning "more bytes follow" (each 255 adds 255, the first smaller one ends it). The
last sequence has literals only; the last 5 bytes are literals and the last match starts at least 12 bytes
before the end.

The decoder checks every bound (numba does not): a damaged or crafted block makes it return -1, never write
outside its output row or read outside its input. Units are held in an *arena*: one byte array used as a ring
in id order (:class:`PackedUnits`), each unit's offset and length kept per ring slot.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from perx.validation import _short

_HASH_LOG = 12
_MIN_MATCH = 4
_LAST_LITERALS = 5  # the block format's end rules (see the module docstring)
_MF_LIMIT = 12
_MAX_OFFSET = 65535
#: The arena's first size in bytes (at most the ring's worst case); it grows by half when full.
INITIAL = 1 << 20
#: an arena over this many times its live bytes is compacted to 1.5x them (PackedUnits._maybe_shrink); it must
#: exceed 1.5 and the growth factor, or a shrink would not shrink and a steady state would copy every ring
SHRINK_AT = 3.0
#: ``lens`` value of a ring slot that holds no unit (never written): it reads as zeros, as an unwritten slot
#: of the uncompressed ring does.
EMPTY = -1


@intrinsic
def _move(typingctx, dst, dst_at, src, src_at, count):
    """``dst[dst_at:dst_at+count] = src[src_at:src_at+count]`` as one memmove (1-D uint8 C arrays; the caller
    checks the bounds): numba's slice assignment costs more than the copy for the short runs LZ4 is made of,
    and a byte loop is several cycles per byte."""
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        d, d_at, s, s_at, n = args
        d_arr = context.make_array(signature.args[0])(context, builder, d)
        s_arr = context.make_array(signature.args[2])(context, builder, s)
        cgutils.raw_memmove(builder, builder.gep(d_arr.data, [d_at]), builder.gep(s_arr.data, [s_at]), n, 1)
        return context.get_dummy_value()

    return sig, codegen


def bound(n: int) -> int:
    """The most bytes :func:`compress_into` writes for ``n`` input bytes (LZ4's worst case: incompressible)."""
    return n + n // 255 + 16


@njit(cache=True, nogil=True, inline="always")
def _read32(src, i):
    return (np.int64(src[i]) | (np.int64(src[i + 1]) << 8) | (np.int64(src[i + 2]) << 16)
            | (np.int64(src[i + 3]) << 24))


@njit(cache=True, nogil=True, inline="always")
def _hash(v):
    return ((v * 2654435761) & 0xFFFFFFFF) >> (32 - _HASH_LOG)  # Knuth's multiplicative hash, top 12 bits


@njit(cache=True, nogil=True, inline="always")
def _put_length(dst, op, r):
    """The extra length bytes of a count whose nibble says 15: r = count - 15."""
    while r >= 255:
        dst[op] = 255
        op += 1
        r -= 255
    dst[op] = r
    return op + 1


@njit(cache=True, nogil=True)
def compress_into(src, dst, d0, table, stamp):
    """Compress the bytes ``src`` (uint8 [n]) into ``dst[d0:]`` (room for ``bound(n)`` bytes); return the
    number of bytes written. ``table`` (int64 [4096]) maps a hash of 4 bytes to ``stamp`` + their position;
    entries below ``stamp`` are from earlier calls and ignored (any entry is only a candidate: its bytes are
    compared before a match is used), so the caller advances ``stamp`` by n + 1 per call instead of clearing
    the table. Greedy single-probe matching (LZ4's fast mode), with the skip
    growing after 64 misses in a row so that incompressible input costs little. O(n)."""
    n = src.shape[0]
    op = d0
    anchor = 0
    if n > _MF_LIMIT:
        ip = 0
        limit = n - _MF_LIMIT  # a match starts at least 12 bytes before the end
        end_limit = n - _LAST_LITERALS  # and ends at least 5 bytes before it
        misses = 0
        while ip <= limit:
            v = _read32(src, ip)
            h = _hash(v)
            cand = table[h] - stamp
            table[h] = stamp + ip
            if 0 <= cand < ip and ip - cand <= _MAX_OFFSET and _read32(src, cand) == v:
                ml = _MIN_MATCH
                while ip + ml < end_limit and src[ip + ml] == src[cand + ml]:
                    ml += 1
                while ip > anchor and cand > 0 and src[ip - 1] == src[cand - 1]:
                    ip -= 1
                    cand -= 1
                    ml += 1
                lit = ip - anchor
                token = op
                op += 1
                tok = 0
                if lit >= 15:
                    tok = 15 << 4
                    op = _put_length(dst, op, lit - 15)
                else:
                    tok = lit << 4
                _move(dst, op, src, anchor, lit)
                op += lit
                off = ip - cand
                dst[op] = off & 255
                dst[op + 1] = off >> 8
                op += 2
                m = ml - _MIN_MATCH
                if m >= 15:
                    tok |= 15
                    op = _put_length(dst, op, m - 15)
                else:
                    tok |= m
                dst[token] = tok
                ip += ml
                anchor = ip
                misses = 0
                if ip - 2 <= limit:  # index a position inside the match too: runs continue from it
                    table[_hash(_read32(src, ip - 2))] = stamp + ip - 2
            else:
                misses += 1
                ip += 1 + (misses >> 6)
    lit = n - anchor  # the last literals
    if lit >= 15:
        dst[op] = 15 << 4
        op = _put_length(dst, op + 1, lit - 15)
    else:
        dst[op] = lit << 4
        op += 1
    _move(dst, op, src, anchor, lit)
    return op + lit - d0


@njit(cache=True, nogil=True)
def decompress_into(src, s0, s1, dst):
    """Decode the block ``src[s0:s1]`` into ``dst`` (uint8 [n]); return the bytes written, or -1 if the block
    is malformed or would write more than n bytes. The caller compares the count with n (a short block is
    damaged too). Every read and write is bounds-checked here. O(n + block).

    The length bytes are read in loops written out here rather than in a helper returning (count, position):
    with the helper, the compiled loop ran 1.9-2.8x slower per Atari frame (results/compression.md, docs/design.md)."""
    ip = s0
    op = 0
    end = dst.shape[0]
    while ip < s1:
        token = np.int64(src[ip])
        ip += 1
        lit = token >> 4
        if lit == 15:  # more length bytes follow: each adds, 255 means another one
            while True:
                if ip >= s1:
                    return -1
                b = np.int64(src[ip])
                ip += 1
                lit += b
                if b != 255:
                    break
        if lit > s1 - ip or lit > end - op:
            return -1
        _move(dst, op, src, ip, lit)
        ip += lit
        op += lit
        if ip == s1:  # the last sequence: literals only
            return op
        if s1 - ip < 2:
            return -1
        off = np.int64(src[ip]) | (np.int64(src[ip + 1]) << 8)
        ip += 2
        if off == 0 or off > op:
            return -1
        ml = token & 15
        if ml == 15:
            while True:
                if ip >= s1:
                    return -1
                b = np.int64(src[ip])
                ip += 1
                ml += b
                if b != 255:
                    break
        ml += _MIN_MATCH
        if ml > end - op:
            return -1
        m = op - off
        # an overlapping match (off < ml) repeats its first off bytes, as the format defines: copy in
        # non-overlapping pieces, each as long as what is already written from m (so the piece doubles)
        left = ml
        while left > 0:
            piece = min(op - m, left)
            _move(dst, op, dst, m, piece)
            op += piece
            left -= piece
    return -1


@njit(cache=True, nogil=True)  # (compiled into perx.episodes' cached kernels: see the note there)
def unpack_row(dst, d, arena, off, length):
    """Decode one unit (``arena[off:off+length]``) into row ``d`` of ``dst`` (uint8 [rows, unit bytes]); a
    slot never written (``length == EMPTY``) reads as zeros. Raises on a block that does not decode to
    exactly one unit (stored blocks are checked when written or loaded, so this means corruption in RAM)."""
    row = dst[d]
    if length < 0:
        for t in range(row.shape[0]):
            row[t] = 0
        return
    # the block must lie inside this arena: offsets read while another thread grew and compacted the arena
    # (a buffer shared without lock=True) would otherwise send the decoder's reads past its end
    if off < 0 or length > arena.shape[0] - off or \
            decompress_into(arena, off, off + length, row) != row.shape[0]:
        raise ValueError("compressed observation unit does not decode to one unit")


@njit(cache=True, nogil=True)
def check_blocks(packed, lengths, unit):
    """Index of the first of the concatenated blocks ``packed`` (lengths ``lengths``, EMPTY allowed) that does not
    decode to exactly ``unit`` bytes, or -1 if all do (loading an untrusted file)."""
    scratch = np.empty(unit, np.uint8)
    off = 0
    for b in range(lengths.shape[0]):
        length = lengths[b]
        if length == EMPTY:
            continue
        if length < 1 or length > packed.shape[0] - off:
            return b
        if decompress_into(packed, off, off + length, scratch) != unit:
            return b
        off += length
    return -1


@njit(cache=True, nogil=True)
def _put(arena, offs, lens, state, table, scratch, units, ids, ring):
    """Compress rows of ``units`` (uint8 [m, unit bytes]) as the units of ``ids`` (consecutive, after every id
    written before) into the arena ring. Returns how many rows were stored: fewer than m when the arena is
    full (the caller grows it and calls again with the rest). ``state``: [head, stamp, last id written].

    The arena holds the live units in id order from the oldest one's offset (tail) to ``head``, wrapping
    round; a unit is written whole at head, or at 0 when it does not fit before the arena's end; head never
    catches up with tail (strict comparisons), so head == tail only when nothing is live."""
    unit = units.shape[1]
    for r in range(ids.shape[0]):
        i = ids[r]
        length = compress_into(units[r], scratch, 0, table, state[1])
        state[1] += unit + 1
        oldest = max(i - ring + 1, 0)  # the unit of id i - ring (this slot's) is freed by this write
        head = state[0]
        size = arena.shape[0]
        if oldest > state[2]:  # nothing else live
            pos = 0 if length <= size else -1
        else:
            tail = offs[oldest % ring]
            if tail < head:
                pos = head if length <= size - head else (0 if length < tail else -1)
            elif tail > head:
                pos = head if length < tail - head else -1
            else:
                pos = -1
        if pos < 0:
            return r
        arena[pos : pos + length] = scratch[:length]
        offs[i % ring] = pos
        lens[i % ring] = length
        state[0] = pos + length
        state[2] = i
    return ids.shape[0]


@njit(cache=True, nogil=True)
def _compact(arena, offs, lens, ring, first, last, out):
    """Copy the units of ids first..last, in id order, to the start of ``out`` and point their offsets there;
    return the bytes used (the new head)."""
    pos = 0
    for i in range(first, last + 1):
        s = i % ring
        length = lens[s]
        if length > 0:
            src = offs[s]
            out[pos : pos + length] = arena[src : src + length]
        offs[s] = pos
        pos += max(length, 0)
    return pos


@njit(cache=True, nogil=True)
def _blocks(arena, offs, lens, ring, ids, out):
    """The units of ``ids`` concatenated into ``out`` (sized by the caller: the sum of their lengths)."""
    pos = 0
    for b in range(ids.shape[0]):
        s = ids[b] % ring
        length = lens[s]
        if length > 0:
            out[pos : pos + length] = arena[offs[s] : offs[s] + length]
            pos += length
    return pos


class PackedUnits:
    """The observation ring of an episodic buffer, each unit LZ4-compressed (internal; see the module docstring).

    Args:
        ring: slots (one per id modulo ring, as the uncompressed ring).
        shape, dtype: one unit (an observation, or one frame with stacks).

    ``packed`` is the (arena, offsets, lengths) triple the compiled gather decodes from. The arena starts at
    ``INITIAL`` bytes and grows by half when a unit does not fit, compacting the live units; so it settles at
    1-1.5x the live units' compressed bytes (plus at most one unit's worst case where a unit wraps). It also
    shrinks: once per ``ring`` ids written, an arena larger than ``INITIAL`` and than ``SHRINK_AT`` times the
    live units' bytes is compacted to 1.5x them (frames that compress better later in a run, say), so right
    after each measurement it holds at most 3x what is live (or ``INITIAL``), at an O(ring) measurement per
    ring's worth of writes.
    """

    def __init__(self, ring: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.ring = ring
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.unit = int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize
        self.offs = np.zeros(ring, np.int64)
        self.lens = np.full(ring, EMPTY, np.int32)
        self.arena = np.empty(min(INITIAL, ring * bound(self.unit)) + 2 * bound(self.unit), np.uint8)
        #: [head, hash stamp, last id written]
        self.state = np.array([0, 1, -1], np.int64)
        self.table = np.zeros(1 << _HASH_LOG, np.int64)
        self.scratch = np.empty(bound(self.unit), np.uint8)
        #: the last id written when the live bytes were last measured (:meth:`_maybe_shrink`)
        self.measured = -1

    @property
    def packed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.arena, self.offs, self.lens

    @property
    def nbytes(self) -> int:
        """Bytes held: the arena (its slack included), offsets, lengths and the codec's scratch."""
        return sum(a.nbytes for a in (self.arena, self.offs, self.lens, self.state, self.table, self.scratch))

    def live_bytes(self, next_id: int) -> int:
        """Compressed bytes of the units still in the ring."""
        ids = np.arange(max(0, next_id - self.ring), next_id, dtype=np.int64) % self.ring
        return int(np.maximum(self.lens[ids], 0).sum())

    def put(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Store ``values`` ([m, *shape], cast to the ring's dtype) as the units of the consecutive ``ids``,
        which follow every id written before (ids skipped over by a batch larger than the ring are marked
        empty, so the arena's order stays the ids' order)."""
        m = len(ids)
        if not m:
            return
        rows = np.ascontiguousarray(values, dtype=self.dtype).reshape(m, -1).view(np.uint8)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        first = int(ids[0])
        gaps = range(max(int(self.state[2]) + 1, first - self.ring + 1), first)
        done = 0
        if len(gaps):
            # ids skipped inside the ring's window: stored first alone, then the gaps take its offset, so that
            # while a gap is the oldest id the free space is measured from where the live units really start
            # (not from the head before the batch, which a wrap or a growth leaves behind)
            while done < 1:
                done += _put(self.arena, self.offs, self.lens, self.state, self.table, self.scratch, rows[:1],
                             ids[:1], self.ring)
                if done < 1:
                    self._grow(first)
            for g in gaps:
                self.offs[g % self.ring] = self.offs[first % self.ring]
                self.lens[g % self.ring] = EMPTY
        while done < m:
            done += _put(self.arena, self.offs, self.lens, self.state, self.table, self.scratch, rows[done:],
                         ids[done:], self.ring)
            if done < m:
                self._grow(int(ids[done]))
        self._maybe_shrink()

    def _live(self, first: int, last: int) -> int:
        """Compressed bytes of ids first..last (at most one ring's worth)."""
        return int(np.maximum(self.lens[np.arange(first, last + 1) % self.ring], 0).sum()) if last >= first else 0

    def _grow(self, writing: int) -> None:
        """Make room for the unit of id ``writing``: a larger arena holding the units that stay live."""
        last = int(self.state[2])
        first = max(writing - self.ring + 1, 0)
        live = self._live(first, last)
        self._move(max(int(1.5 * self.arena.shape[0]), live + 2 * bound(self.unit)), first, last)

    def _maybe_shrink(self) -> None:
        """Once per ``ring`` ids written: compact an arena over ``SHRINK_AT`` times the live bytes (and over
        ``INITIAL``) to 1.5x them. The measurement is O(ring), so O(1) per id written."""
        last = int(self.state[2])
        if last - getattr(self, "measured", -1) < self.ring:
            return
        self.measured = last
        first = max(last - self.ring + 1, 0)
        live = self._live(first, last)
        slack = 2 * bound(self.unit)  # room for a unit at the head and one that wraps, as a new arena has
        if self.arena.shape[0] > max(SHRINK_AT * live, INITIAL) + slack:
            self._move(int(1.5 * live) + slack, first, last)

    def _move(self, size: int, first: int, last: int) -> None:
        """A new arena of ``size`` bytes holding the units of ids first..last, compacted in id order."""
        out = np.empty(size, np.uint8)
        self.state[0] = _compact(self.arena, self.offs, self.lens, self.ring, first, last, out)
        self.arena = out

    def blocks(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the concatenated blocks, their lengths int32 [len(ids)], EMPTY for a slot never written) of
        ``ids``, in their order: what a saved file holds."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        lengths = self.lens[ids % self.ring]
        out = np.empty(int(np.maximum(lengths, 0).sum()), np.uint8)
        _blocks(self.arena, self.offs, self.lens, self.ring, ids, out)
        return out, lengths

    def restore(self, ids: np.ndarray, packed: np.ndarray, lengths: np.ndarray, name: str) -> None:
        """Load the units of ``ids`` (consecutive, the ring's live ids, oldest first) from :meth:`blocks`'s
        output, checking every block (the file is untrusted): a damaged block is refused with a ValueError
        naming ``name``, and nothing is changed."""
        from perx.samplers.base import check_array

        check_array(lengths, f"{name}_lengths", (len(ids),), np.dtype(np.int32))
        if not isinstance(packed, np.ndarray) or packed.ndim != 1:
            raise ValueError(f"{name}: expected a 1-D uint8 array of blocks, got {_short(packed)}")
        check_array(packed, name, (len(packed),), np.dtype(np.uint8))
        # every id of the ring's window is written in a saved buffer (a batch that skips ids fills the window)
        if (lengths < 1).any() or int(lengths.sum(dtype=np.int64)) != len(packed):
            raise ValueError(f"{name}_lengths: each block's length must be >= 1, and they must add up to the "
                             f"{len(packed)} bytes of {name}")
        bad = check_blocks(packed, lengths, self.unit)
        if bad >= 0:
            raise ValueError(f"{name}: block {bad} (id {int(ids[bad])}) is damaged: it does not decode to one "
                             f"observation unit of {self.unit} bytes")
        total = len(packed)
        arena = np.empty(int(1.25 * total) + 2 * bound(self.unit), np.uint8)
        arena[:total] = packed
        starts = np.concatenate(([0], np.cumsum(np.maximum(lengths, 0))[:-1])).astype(np.int64)
        slots = np.asarray(ids, np.int64) % self.ring
        self.arena = arena
        self.offs[:] = 0
        self.lens[:] = EMPTY
        self.offs[slots] = starts
        self.lens[slots] = lengths
        self.state[:] = (total, 1, int(ids[-1]) if len(ids) else -1)
        self.measured = int(self.state[2])
