"""Calling a compiled kernel without numba's type dispatch.

A call through a numba dispatcher types every argument and looks the signature up among the compiled
ones before it runs the machine code: a quarter to a third of a kernel call of 14-18 arguments at B = 1, a
tenth of a whole sample+update there (measured: docs/history/speed.md, change 26).
:class:`Entry` compiles (or loads from numba's disk cache) one explicit signature on first use and then
calls that overload's own entry point, which only unboxes the arguments.

The entry point trusts its arguments' types: an array of another dtype, rank or memory layout than the
signature says would be read as if it had the signature's. So a signature names only arrays whose types
are fixed by construction (the samplers' own trees, the storage's rows, arrays made right before the call)
and, for arrays that come from the caller, the loosest array type of their dtype and rank (:func:`loose`:
any strides, read-only, unaligned), checked for dtype and rank before the call. Scalars are converted as
Python converts them (``int(x)``, ``float(x)``, ``bool(x)``).

With the environment variable ``PERX_CHECK_ENTRIES=1`` (set by the test suite) every call first checks
each argument's type against the signature and raises TypeError on a mismatch, so the whole suite
verifies that the declared signatures are the types the callers really pass.
"""

from __future__ import annotations

import os
from typing import Any

from numba import typeof, types

int32 = types.int32
int64 = types.int64
float64 = types.float64
boolean = types.boolean
uint8 = types.uint8
uint64 = types.uint64


def array(dtype: Any, ndim: int) -> types.Array:
    """The type of a C-contiguous, writable, aligned array: what ``np.empty``/``np.zeros`` make."""
    return types.Array(dtype, ndim, "C")


def loose(dtype: Any, ndim: int) -> types.Array:
    """The type that accepts any array of this dtype and rank: any strides, read-only, unaligned. A
    kernel compiled for it only reads the array, through its strides."""
    return types.Array(dtype, ndim, "A", readonly=True, aligned=False)


def contiguous(dtype: Any, ndim: int) -> types.Array:
    """The type that accepts any C-contiguous array of this dtype and rank, read-only or unaligned too: for
    arrays from callers that are contiguous by construction (checked before the call), where a kernel's
    loops over them compile better than through strides."""
    return types.Array(dtype, ndim, "C", readonly=True, aligned=False)


class Entry:
    """``kernel`` compiled for ``signature`` (a tuple of numba types), called through ``fn``.

    ``fn`` first compiles (or loads) the overload and replaces itself with its entry point, so call
    sites write ``ENTRY.fn(...)``: one attribute lookup, then machine code. Instances hold no state a
    sampler saves or pickles (they live at module level).
    """

    __slots__ = ("fn", "kernel", "signature")

    def __init__(self, kernel: Any, signature: tuple) -> None:
        self.kernel = kernel
        self.signature = signature
        self.fn = self._bind

    def _bind(self, *args: Any) -> Any:
        entry = self.kernel.compile(self.signature)
        if os.environ.get("PERX_CHECK_ENTRIES") == "1":
            def checked(*args: Any) -> Any:
                self.check(args)
                return entry(*args)
            self.fn = checked
        else:
            self.fn = entry
        return self.fn(*args)

    def check(self, args: tuple) -> None:
        """Raise TypeError unless every argument has a type the signature's entry point reads correctly."""
        if len(args) != len(self.signature):
            raise TypeError(f"{self.kernel.__name__}: {len(args)} arguments for a signature of {len(self.signature)}")
        for k, (want, value) in enumerate(zip(self.signature, args, strict=True)):
            got = typeof(value)
            if isinstance(want, types.Array):
                ok = (isinstance(got, types.Array) and got.dtype == want.dtype and got.ndim == want.ndim
                      and (want.layout == "A" or got.layout == want.layout)
                      and (not want.mutable or got.mutable) and (not want.aligned or got.aligned))
            elif want == types.boolean:
                ok = isinstance(got, types.Boolean)
            elif isinstance(want, types.Integer):
                ok = isinstance(got, types.Integer) and not isinstance(value, bool)
            else:  # float64: a float, or an int (converted exactly below 2**53)
                ok = isinstance(got, (types.Float, types.Integer)) and not isinstance(value, bool)
            if not ok:
                raise TypeError(f"{self.kernel.__name__}: argument {k} is {got}, the signature says {want}")
