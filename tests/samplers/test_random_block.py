"""Uniforms drawn ahead in blocks (Sampler._uniforms) give exactly what drawing them one call at a time gives.

The reference in each test is the same sampler with the block turned off: taking ``sampler.rng`` makes a
sampler draw from its generator directly from then on, which is what every sampler did before the blocks.
"""

import copy
import pickle

import numpy as np
import pytest

import perx
from perx.samplers.base import POOL
from tests.conftest import transitions

# batch sizes that straddle the block's end, exceed a whole block, and repeat
SIZES = [1, 7, 32, 256, 1, 1, POOL - 300, 512, POOL + 5, 3, 64, 2 * POOL + 1, 5, 128]


def _pair(make, capacity=5000, n=4000, seed=3):
    """(blocked, direct): two buffers with the same transitions and seed; ``direct`` draws directly."""
    bufs = []
    for _ in range(2):
        buf = perx.ReplayBuffer(capacity, make(), seed=seed)
        buf.extend(**transitions(n))
        bufs.append(buf)
    assert bufs[1].sampler.rng is not None  # handing the generator out turns the block off
    assert bufs[0].sampler._pooling and not bufs[1].sampler._pooling
    return bufs


def _same_batch(a, b):
    assert np.array_equal(a.indices, b.indices)
    assert np.array_equal(a.weights, b.weights)
    assert np.array_equal(a.probabilities, b.probabilities)
    for name in a.data:
        assert np.array_equal(a.data[name], b.data[name])


def _rng_state(buf):
    return buf.sampler.state_dict()[0]["rng"]


MAKERS = {
    "proportional": lambda: perx.Proportional(alpha=0.6),
    "lap": lambda: perx.LAP(alpha=0.4),
    "rank": lambda: perx.RankBased(alpha=0.7),
    "proportional_independent": lambda: perx.Proportional(alpha=0.6, stratified=False),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_blocked_draws_are_the_direct_draws_bit_for_bit(kind):
    blocked, direct = _pair(MAKERS[kind])
    rng = np.random.default_rng(0)
    for b in SIZES:
        x, y = blocked.sample(b, beta=0.4), direct.sample(b, beta=0.4)
        _same_batch(x, y)
        td = rng.standard_normal(b)
        assert blocked.update_priorities(x.indices, td) == direct.update_priorities(y.indices, td)
    assert blocked.sampler._pool is not None  # the blocked one really drew ahead
    # the saved generator is where the direct draws leave it
    assert _rng_state(blocked) == _rng_state(direct)
    assert blocked.sampler._pool is None  # state_dict brought it level and dropped the block
    _same_batch(blocked.sample(9), direct.sample(9))


def test_the_generator_is_level_with_the_numbers_handed_out():
    blocked, _ = _pair(MAKERS["proportional"])
    drawn = sum(SIZES)
    for b in SIZES:
        blocked.sample(b)
    reference = np.random.default_rng(3)
    reference.random(drawn)
    assert blocked.sampler.rng.bit_generator.state == reference.bit_generator.state


def test_integer_draws_between_blocked_ones_keep_the_generators_32_bit_half():
    # RankBased with 16 segments: a batch of 16 takes one uniform per segment (blocked); a batch of 31 draws
    # its segments with integers() (32-bit values: an odd count leaves half of a 64-bit draw kept in the
    # state), which first brings the generator level.
    make = lambda: perx.RankBased(alpha=0.7, segments=16)  # noqa: E731
    blocked, direct = _pair(make)
    halves = 0
    for b in [16, 31, 16, 16, 31, 31, 16, 31, 16] * 3:
        _same_batch(blocked.sample(b, beta=0.5), direct.sample(b, beta=0.5))
        halves += direct.sampler.rng.bit_generator.state["has_uint32"]
    assert halves > 0  # the case under test happened
    assert _rng_state(blocked) == _rng_state(direct)


def test_state_saved_inside_a_block_continues_identically(tmp_path):
    blocked, direct = _pair(MAKERS["proportional"])
    for b in (5, 100, 7):
        _same_batch(blocked.sample(b), direct.sample(b))
    blocked.save(tmp_path / "b")
    twin = perx.ReplayBuffer.load(tmp_path / "b")
    for b in (1, POOL, 33):
        x = direct.sample(b)
        _same_batch(blocked.sample(b), x)
        _same_batch(twin.sample(b), x)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_made_inside_a_block_continues_identically(how):
    blocked, _ = _pair(MAKERS["rank"])
    blocked.sample(10)
    twin = copy.deepcopy(blocked) if how == "deepcopy" else pickle.loads(pickle.dumps(blocked))
    for b in (3, POOL, 40):
        _same_batch(blocked.sample(b), twin.sample(b))
    assert _rng_state(blocked) == _rng_state(twin)


def test_draws_on_the_handed_out_generator_interleave_as_one_sequence():
    blocked, _ = _pair(MAKERS["proportional"])
    blocked.sample(50)
    g = blocked.sampler.rng
    reference = np.random.default_rng(3)
    reference.random(50)
    for b in (4, 9):
        assert g.random() == reference.random()  # the caller's draw comes after the sampler's 50
        blocked.sample(b)
        reference.random(b)
    assert g.bit_generator.state == reference.bit_generator.state
    assert blocked.sampler._pool is None


def test_reseeding_drops_the_block():
    blocked, _ = _pair(MAKERS["proportional"])
    blocked.sample(20)
    blocked.sampler.reseed(11)
    assert blocked.sampler._pool is None and blocked.sampler._pooling
    fresh = perx.ReplayBuffer(5000, perx.Proportional(alpha=0.6), seed=11)
    fresh.extend(**transitions(4000))
    _same_batch(blocked.sample(8), fresh.sample(8))


def test_other_bit_generators_are_drawn_from_directly():
    blocked, _ = _pair(MAKERS["proportional"])
    blocked.sampler._rng = np.random.Generator(np.random.Philox(7))
    reference = np.random.Generator(np.random.Philox(7))
    for b in (1, 40):
        blocked.sample(b)
        reference.random(b)
    assert blocked.sampler._pool is None
    assert np.array_equal(blocked.sampler._rng.random(5), reference.random(5))
