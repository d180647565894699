"""Sum, min and max segment trees over float64 for prioritized replay (Schaul et al. 2016, App. B.2.1).

Layout: a complete binary tree in one float64 array ``nodes`` of length ``2 * L``, where ``L`` is the
smallest power of two >= capacity. ``nodes[1]`` is the root, the children of node ``k`` are ``2k`` and
``2k + 1``, and slot ``i`` lives in leaf ``nodes[L + i]``. Leaves past ``capacity`` are padding and hold
the operation's identity (0 for sums, +inf for minima, -inf for maxima), so any capacity >= 1 works.

For capacity 4 holding masses [0.5, 1.0, 0.5, 0.5]::

            [2.5]
       [1.5]     [1.0]
    [0.5] [1.0] [0.5] [0.5]

Invariant (the only one): every internal node equals ``op(left child, right child)`` evaluated on the
current children. Writes recompute ancestors from their children, never by adding deltas, so repeated
updates cannot drift: after any sequence of ``set`` calls the array is bit-for-bit what ``rebuild()``
produces from the same leaves (tests/test_trees.py::test_incremental_updates_equal_rebuild).

Batch operations run in numba and process the whole batch one tree level at a time, so the B independent
memory reads of a level are in flight together instead of B separate root-to-leaf walks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perx.validation import as_index_array, as_value_array, check_capacity

_SUM, _MIN, _MAX = 0, 1, 2
_IDENTITY = {_SUM: 0.0, _MIN: np.inf, _MAX: -np.inf}


def leaf_count(capacity: int) -> int:
    """Smallest power of two >= capacity (the number of leaves of the array tree)."""
    return 1 << max(0, int(capacity - 1).bit_length())


@njit(cache=True, nogil=True)
def _propagate(nodes, leaf_base, slots, count, op):
    """Recompute the ancestors of ``slots[:count]`` level by level. O(count * log L)."""
    pos = np.empty(count, np.int64)
    for b in range(count):
        pos[b] = slots[b] + leaf_base
    width = leaf_base
    while width > 1:
        last = -1
        for b in range(count):
            p = pos[b] >> 1
            pos[b] = p
            if p == last:
                continue  # both children are final at this level: recomputing p gives the same value
            last = p
            left = nodes[2 * p]
            right = nodes[2 * p + 1]
            if op == 0:
                nodes[p] = left + right
            elif op == 1:
                nodes[p] = left if left <= right else right
            else:
                nodes[p] = left if left >= right else right
        width >>= 1


@njit(cache=True, nogil=True)
def _set(nodes, leaf_base, slots, values, op):
    """Write leaves in order (a later duplicate wins), then recompute their ancestors."""
    n = slots.shape[0]
    for b in range(n):
        nodes[leaf_base + slots[b]] = values[b]
    _propagate(nodes, leaf_base, slots, n, op)


@njit(cache=True, nogil=True)
def _rebuild(nodes, leaf_base, op):
    for p in range(leaf_base - 1, 0, -1):
        left = nodes[2 * p]
        right = nodes[2 * p + 1]
        if op == 0:
            nodes[p] = left + right
        elif op == 1:
            nodes[p] = left if left <= right else right
        else:
            nodes[p] = left if left >= right else right


@njit(cache=True, nogil=True)
def find_prefix(nodes, leaf_base, targets, out):
    """Batch prefix-sum search on a sum tree; writes slots into ``out``.

    For each target t returns the slot i with prefix(i) <= t < prefix(i + 1), where prefix(i) is the
    sum of leaves before i; that is ``searchsorted(cumsum(leaves), t, side="right")``. A tie t ==
    prefix(i + 1) goes right, so a zero-mass leaf is never the answer. A target at or past the total
    (rounding can push a stratified draw there) returns the last leaf of positive mass. Requires
    ``nodes[1] > 0`` and ``t >= 0``. Each step enters only a child of positive mass, so the leaf
    returned always has positive mass: never padding, never an empty slot, never a zero priority.
    """
    n = targets.shape[0]
    node = np.ones(n, np.int64)
    t = targets.copy()
    width = leaf_base
    while width > 1:
        for b in range(n):
            k = 2 * node[b]
            left = nodes[k]
            tb = t[b]
            if tb < left:
                node[b] = k
            elif nodes[k + 1] > 0.0:
                t[b] = tb - left
                node[b] = k + 1
            else:
                # The right subtree is empty, so t lies past this subtree's mass only through
                # rounding: clamp into the left child, which holds all of this node's mass.
                node[b] = k
        width >>= 1
    for b in range(n):
        out[b] = node[b] - leaf_base


class _SegmentTree:
    _op = _SUM
    _name = "tree"

    def __init__(self, capacity: int, *, nodes: np.ndarray | None = None) -> None:
        self.capacity = check_capacity(capacity)
        self._leaf_base = leaf_count(self.capacity)
        if nodes is None:
            nodes = np.full(2 * self._leaf_base, _IDENTITY[self._op], dtype=np.float64)
        elif nodes.shape != (2 * self._leaf_base,) or nodes.dtype != np.float64:
            raise ValueError(f"nodes: expected float64 of shape ({2 * self._leaf_base},), got "
                             f"{nodes.dtype}{nodes.shape}")
        #: float64 [2L]; may be a strided view into a structure shared with another tree.
        self.nodes = nodes

    @property
    def root(self) -> float:
        return float(self.nodes[1])

    @property
    def leaves(self) -> np.ndarray:
        """Read-only view of the ``capacity`` leaves, float64, shape ``[capacity]``."""
        view = self.nodes[self._leaf_base : self._leaf_base + self.capacity]
        view.flags.writeable = False
        return view

    def _check_values(self, values: np.ndarray) -> None:
        if np.isnan(values).any():
            raise ValueError(f"values: NaN is not allowed in a {self._name}; got {values!r}")

    def set(self, slots, values) -> None:
        """Set leaves ``slots`` (int, shape [B]) to ``values`` (float, shape [B]); O(B log capacity).

        Duplicate slots: the last occurrence wins, as if the writes were made one by one.

        Raises:
            ValueError: slots out of [0, capacity), lengths differ, or a value is invalid for this tree.
                Nothing is written then.
        """
        slots = as_index_array(slots, "slots", upper=self.capacity)
        values = as_value_array(values, "values", length=slots.shape[0])
        self._check_values(values)
        _set(self.nodes, self._leaf_base, slots, values, self._op)

    def get(self, slots) -> np.ndarray:
        """Leaf values at ``slots``, float64, shape [B]."""
        slots = as_index_array(slots, "slots", upper=self.capacity)
        return self.nodes[self._leaf_base + slots]

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves; O(capacity)."""
        _rebuild(self.nodes, self._leaf_base, self._op)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, root={self.root!r})"


class SumTree(_SegmentTree):
    """Sum segment tree: ``total`` in O(1), batch ``set`` and prefix-sum ``find`` in O(B log N).

    Leaves must be finite and >= 0 (masses, ``priority ** alpha``).
    """

    _op = _SUM
    _name = "sum tree"

    @property
    def total(self) -> float:
        """Sum of all leaves (the root)."""
        return float(self.nodes[1])

    def _check_values(self, values: np.ndarray) -> None:
        if not np.isfinite(values).all() or (values < 0).any():
            bad = values[~(np.isfinite(values) & (values >= 0))][0]
            raise ValueError(f"values: sum-tree leaves must be finite and >= 0; got {bad!r}")

    def find(self, targets) -> np.ndarray:
        """Slots whose prefix-sum interval holds each target; see :func:`find_prefix`. O(B log N).

        Args:
            targets: float array [B], each in [0, total]; values past the total are clamped to the
                last leaf of positive mass.

        Returns:
            int64 array [B] of slots, each with a leaf of positive mass.

        Raises:
            ValueError: the tree is empty (total == 0) or a target is negative or not finite.
        """
        targets = np.ascontiguousarray(targets, dtype=np.float64).reshape(-1)
        if not self.nodes[1] > 0.0:
            raise ValueError(f"cannot search a sum tree whose total is {self.total!r}")
        if not np.isfinite(targets).all() or (targets < 0).any():
            raise ValueError(f"targets: must be finite and >= 0; got {targets!r}")
        out = np.empty(targets.shape[0], np.int64)
        find_prefix(self.nodes, self._leaf_base, targets, out)
        return out


class MinTree(_SegmentTree):
    """Min segment tree (``min`` in O(1)); empty leaves hold +inf."""

    _op = _MIN
    _name = "min tree"

    @property
    def min(self) -> float:
        return float(self.nodes[1])


class MaxTree(_SegmentTree):
    """Max segment tree (``max`` in O(1)); empty leaves hold -inf."""

    _op = _MAX
    _name = "max tree"

    @property
    def max(self) -> float:
        return float(self.nodes[1])
