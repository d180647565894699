"""perx._jit: kernels called through one compiled signature, without numba's type dispatch."""

import os

import numpy as np
import pytest
from numba import njit

import perx
from perx import _jit


@njit(cache=False)
def _weighted_sum(values, scale):
    total = 0.0
    for v in values:
        total += v
    return total * scale


def test_the_suite_checks_every_entry_call():
    # tests/conftest.py turns the checks on, so every sampler test below also checks the declared signatures
    assert os.environ.get("PERX_CHECK_ENTRIES") == "1"


def test_an_entry_returns_what_the_dispatcher_returns():
    entry = _jit.Entry(_weighted_sum, (_jit.array(_jit.float64, 1), _jit.float64))
    x = np.arange(5.0)
    assert entry.fn(x, 2.0) == _weighted_sum(x, 2.0) == 20.0
    assert entry.fn(x, 3) == 30.0  # an int where the signature says float64: converted as float(3)


def test_a_loose_array_is_read_through_its_strides():
    entry = _jit.Entry(_weighted_sum, (_jit.loose(_jit.float64, 1), _jit.float64))
    x = np.arange(10.0)
    view = x[::3]  # not contiguous
    view.flags.writeable = False
    assert entry.fn(view, 1.0) == 0.0 + 3.0 + 6.0 + 9.0


@pytest.mark.parametrize("bad", [np.arange(5, dtype=np.float32), np.arange(6.0).reshape(2, 3), np.arange(10.0)[::2]])
def test_an_argument_of_another_type_than_the_signature_is_refused_in_check_mode(bad):
    entry = _jit.Entry(_weighted_sum, (_jit.array(_jit.float64, 1), _jit.float64))
    entry.fn(np.arange(3.0), 1.0)  # binds
    with pytest.raises(TypeError, match=r"_weighted_sum: argument 0 is array\(.*the signature says"):
        entry.fn(bad, 1.0)
    with pytest.raises(TypeError, match="argument 1 is bool"):
        entry.fn(np.arange(3.0), True)


@pytest.mark.parametrize("make", [lambda: perx.Proportional(alpha=0.6), lambda: perx.RankBased(alpha=0.7),
                                  lambda: perx.Greedy(), lambda: perx.Uniform()])
def test_updates_from_strided_and_other_dtype_arrays_match_contiguous_int64_ones(make):
    # strided ids/values take the loose entry point; int32 ids and float32 values (possible when the sampler is
    # called directly) take the dispatcher; both must give what contiguous int64/float64 arrays give
    rng = np.random.default_rng(0)
    bufs = [perx.ReplayBuffer(200, make(), seed=1) for _ in range(3)]
    obs = rng.standard_normal((300, 3))
    for buf in bufs:
        buf.extend(obs=obs)
    ids = rng.integers(100, 300, 40)
    td = rng.standard_normal(40)
    plain = bufs[0].sampler.update(ids.copy(), td.copy(), 300, raw=False)
    strided = bufs[1].sampler.update(np.repeat(ids, 2)[::2], np.repeat(td, 2)[::2], 300, raw=False)
    other = bufs[2].sampler.update(ids.astype(np.int32), td.astype(np.float32).astype(np.float64), 300, raw=False)
    assert plain == strided == other
    np.testing.assert_array_equal(bufs[0].probabilities(), bufs[1].probabilities())
    if not isinstance(bufs[0].sampler, perx.Uniform):
        same_values = bufs[0].sampler.update(ids.copy(), td.astype(np.float32).astype(np.float64), 300, raw=False)
        assert same_values == other
        np.testing.assert_array_equal(bufs[0].probabilities(), bufs[2].probabilities())
