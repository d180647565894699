"""Software prefetch for the compiled kernels (LLVM's ``llvm.prefetch``).

A batched kernel that walks B independent random addresses (a tree descent level by level, a row gather)
is bound by how many cache misses are in flight at once. Out-of-order execution overlaps only the few
iterations in its window; asking for the line of the element D iterations ahead keeps more misses in flight.
With D = 16, 256 draws of the block-tree search took about 30% less time at N = 2^20 and nearly half less at
N = 2^24, caches disturbed between calls (measured: docs/history/speed.md, change 21).

A prefetch is a hint: it never faults (the address need not be valid) and changes no value, so the kernels
that use it return exactly what they returned without it.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

#: How many iterations ahead the batched kernels prefetch (16 was best of 4..64 for the search above).
AHEAD = 16


def _emit(builder, context, aryty, ary, index, write: int) -> None:
    data = context.make_array(aryty)(context, builder, ary).data
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    ptr = builder.bitcast(builder.gep(data, [index]), i8p)
    # (address, 0 read / 1 write, locality 3 = keep in every cache level, 1 = data cache)
    builder.call(fn, [ptr, ir.Constant(i32, write), ir.Constant(i32, 3), ir.Constant(i32, 1)])


def _intrinsic(write: int, doc: str):
    def hint(typingctx, arr, index):
        if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            _emit(builder, context, signature.args[0], args[0], args[1], write)
            return context.get_dummy_value()

        return types.void(arr, index), codegen

    hint.__doc__ = doc
    return intrinsic(hint)


#: prefetch(arr, index): start loading the line of element ``index`` of the array ``arr``'s data, for reading:
#: a flat offset in elements from its data pointer (so, for a strided view, a row's first element is the row times
#: the row stride in elements), not bounds-checked: any value is harmless.
prefetch = _intrinsic(0, "Start loading the line of flat element ``index`` of C-contiguous ``arr``, for reading.")
#: prefetch_write(arr, index): :data:`prefetch` for a line about to be written.
prefetch_write = _intrinsic(1, "Start loading the line of flat element ``index`` of C-contiguous ``arr``, for "
                               "writing.")
