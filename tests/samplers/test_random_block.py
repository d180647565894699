"""Uniforms drawn ahead in blocks (Sampler._numbers) give exactly what drawing them one call at a time gives.

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
    "uniform": lambda: perx.Uniform(),
    "proportional": lambda: perx.Proportional(alpha=0.6),
    "lap": lambda: perx.LAP(alpha=0.4),
    "rank": lambda: perx.RankBased(alpha=0.7),
    "proportional_independent": lambda: perx.Proportional(alpha=0.6, stratified=False),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_blocked_draws_are_the_direct_draws_bit_for_bit(kind):
    # a full buffer: Uniform draws its slots from a block only then (the range stays the same)
    blocked, direct = _pair(MAKERS[kind], capacity=4000)
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


def test_numpy_integers_calls_of_one_range_concatenate():
    # what Sampler._numbers relies on for integers: k draws then m draws give one call of k + m, and the same state
    for seed in range(4):
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        sizes = (1, 7, 300, 5, POOL, 1, 33)
        x = np.concatenate([a.integers(0, 999_983, k) for k in sizes])
        assert np.array_equal(x, b.integers(0, 999_983, sum(sizes)))
        assert a.bit_generator.state == b.bit_generator.state


def test_uniform_draws_directly_while_filling_and_from_a_block_once_full():
    blocked, direct = (perx.ReplayBuffer(600, perx.Uniform(), seed=5) for _ in range(2))
    assert direct.sampler.rng is not None  # direct draws from here on
    rows = transitions(900)
    for start in range(0, 900, 50):
        part = {k: v[start:start + 50] for k, v in rows.items()}
        blocked.extend(**part)
        direct.extend(**part)
        for b in (1, 32, 3):
            _same_batch(blocked.sample(b), direct.sample(b))
        # distinct draws (rng.choice) come from the generator itself, brought level first
        _same_batch(blocked.sample(8, replace=False), direct.sample(8, replace=False))
    assert _rng_state(blocked) == _rng_state(direct)


def test_uniform_uses_a_block_once_the_buffer_is_full():
    blocked, _ = _pair(MAKERS["uniform"], capacity=4000)
    blocked.sample(3)
    assert blocked.sampler._pool is not None and blocked.sampler._pool_kind == 4000
    fill, _ = _pair(MAKERS["uniform"], capacity=5000)
    fill.sample(3)
    assert fill.sampler._pool is None


@pytest.mark.parametrize("how", ["sampler", "buffer", "bit_generator"])
def test_a_generator_passed_as_seed_stays_one_sequence_with_the_callers_draws(how):
    g = np.random.default_rng(0)
    if how == "sampler":
        buf = perx.ReplayBuffer(500, perx.Proportional(alpha=0.6, seed=g))
    elif how == "buffer":
        buf = perx.ReplayBuffer(500, perx.Proportional(alpha=0.6), seed=g)
    else:  # a Generator on the caller's bit generator shares its state
        buf = perx.ReplayBuffer(500, perx.Proportional(alpha=0.6, seed=g.bit_generator))
    buf.extend(**transitions(400))
    reference = np.random.default_rng(0)
    for b in (4, 1, 7):
        buf.sample(b)
        reference.random(b)
        assert g.random() == reference.random()  # the caller gets the numbers after the sampler's


class _Jitter(perx.Proportional):
    """A subclass that draws from the sampler's generator itself after each sample."""

    name = "_BlockTestJitter"

    def sample(self, batch_size, beta, size, next_id):
        out = super().sample(batch_size, beta, size, next_id)
        self.noise = self._rng.random()
        return out


def test_a_subclass_drawing_from_the_generator_gets_the_numbers_that_come_next():
    blocked, direct = _pair(lambda: _Jitter(alpha=0.6))
    for b in (2, 2, 5, 300):
        _same_batch(blocked.sample(b), direct.sample(b))
        assert blocked.sampler.noise == direct.sampler.noise
    assert _rng_state(blocked) == _rng_state(direct)


@pytest.mark.parametrize("kind", ["proportional", "rank"])
def test_a_sampler_pickled_before_the_blocks_continues_identically(kind):
    blocked, direct = _pair(MAKERS[kind])
    for b in (3, 40):
        _same_batch(blocked.sample(b), direct.sample(b))
    # what such a pickle holds: the generator as "_rng" (where the draws so far leave it), no block
    sampler = blocked.sampler
    state = {k: v for k, v in sampler.__dict__.items()
             if k not in ("_gen", "_pool", "_pool_kind", "_pool_state", "_cursor", "_pooling")}
    state["_rng"] = copy.deepcopy(sampler.rng)
    old = object.__new__(type(sampler))
    old.__setstate__(pickle.loads(pickle.dumps(state)))
    assert old._pooling and old._pool is None
    for b in (1, POOL, 17):
        x, y = old.sample(b, 0.4, 4000, 4000), direct.sampler.sample(b, 0.4, 4000, 4000)
        for u, v in zip(x, y, strict=True):
            assert np.array_equal(u, v)


@pytest.mark.parametrize("batch_size", [0, -1])
def test_a_batch_size_below_one_changes_nothing_that_drawing_directly_keeps(batch_size):
    # the samplers' own API (the buffer refuses such sizes before): the same error and the same state after
    blocked, direct = _pair(MAKERS["proportional"])
    _same_batch(blocked.sample(5), direct.sample(5))
    errors = []
    for buf in (blocked, direct):
        with pytest.raises(Exception) as err:  # whatever numpy or the kernel raises when drawing directly
            buf.sampler.sample(batch_size, 0.4, 4000, 4000)
        errors.append(type(err.value))
    assert errors[0] is errors[1]
    _same_batch(blocked.sample(9), direct.sample(9))
    assert _rng_state(blocked) == _rng_state(direct)
