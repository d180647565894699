"""perx._prefetch: a hint to the CPU that compiles into the kernels and changes no value."""

import numpy as np
from numba import njit

from perx._prefetch import prefetch, prefetch_write


@njit(cache=False)
def _sum_with_prefetches(a, ahead):
    flat = a.reshape(-1)
    total = 0.0
    for i in range(flat.shape[0]):
        if i + ahead < flat.shape[0]:
            prefetch(a, i + ahead)
            prefetch_write(flat, i + ahead)
        total += flat[i]
    return total


def test_prefetching_changes_no_value_of_a_kernel():
    rng = np.random.default_rng(0)
    for shape in [(1,), (1000,), (64, 3)]:
        a = rng.random(shape)
        before = a.copy()
        expected = 0.0
        for v in a.reshape(-1):
            expected += v
        for ahead in (0, 1, 16, 5000):
            assert _sum_with_prefetches(a, ahead) == expected
        np.testing.assert_array_equal(a, before)


def test_prefetch_refuses_what_is_not_an_array_and_an_integer_index():
    import numba
    import pytest

    @njit(cache=False)
    def bad(x):
        prefetch(x, 0)

    with pytest.raises(numba.core.errors.TypingError):
        bad(1.0)
