"""The samples-per-insert rate limiter: the band holds whichever side is faster; ShardedReplay waits on it."""

import numpy as np
import pytest

pytest.importorskip("ray")  # perx.distributed imports ray

from perx.distributed.rate import RateLimiter


def simulate(limiter, insert_speed, sample_speed, m=8, n=32, ticks=3000):
    """Each tick the writers try ``insert_speed`` inserts of m and the learner ``sample_speed`` samples of
    n, each only when the limiter allows; returns the credit after every operation past the start."""
    credits = []
    for _ in range(ticks):
        for _ in range(insert_speed):
            if limiter.can_insert(m):
                limiter.inserted_to(limiter.inserted + m)
                if limiter.inserted >= limiter.min_size_to_sample:
                    credits.append(limiter.credit())
        for _ in range(sample_speed):
            if limiter.can_sample(n):
                limiter.sampled_more(n)
                credits.append(limiter.credit())
    return np.array(credits)


@pytest.mark.parametrize("insert_speed, sample_speed", [(10, 1), (1, 10), (1, 1)])
def test_the_ratio_stays_in_the_band_when_writers_are_10x_faster_or_slower(insert_speed, sample_speed):
    limiter = RateLimiter(samples_per_insert=4.0, min_size_to_sample=100, error_buffer=64.0)
    credits = simulate(limiter, insert_speed, sample_speed)
    assert len(credits) > 1000
    assert credits.min() >= -64.0 and credits.max() <= 64.0
    # over the run the realised ratio is the target within the band, whichever side was faster
    ratio = limiter.sampled / (limiter.inserted - 100)
    assert abs(ratio - 4.0) <= 64.0 / (limiter.inserted - 100)


def test_nothing_is_sampled_before_the_minimum_size():
    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=50, error_buffer=100.0)
    limiter.inserted_to(49)
    assert not limiter.can_sample(1) and limiter.can_insert(150)  # filling up is never held back
    limiter.inserted_to(50)
    assert limiter.can_sample(32)


def test_a_smaller_insert_count_after_a_restore_is_ignored():
    limiter = RateLimiter(samples_per_insert=1.0)
    limiter.inserted_to(500)
    limiter.inserted_to(300)
    assert limiter.inserted == 500


@pytest.mark.parametrize("kwargs, match", [
    ({"samples_per_insert": 0.0}, "samples_per_insert: a finite number > 0, got 0.0"),
    ({"samples_per_insert": float("nan")}, "samples_per_insert"),
    ({"samples_per_insert": 1.0, "error_buffer": -1.0}, "error_buffer: a finite number > 0, got -1.0"),
    ({"samples_per_insert": 1.0, "min_size_to_sample": 0}, "min_size_to_sample: an int >= 1, got 0"),
    ({"samples_per_insert": True}, "samples_per_insert"),
])
def test_bad_settings_are_refused_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RateLimiter(**kwargs)


def test_a_band_too_narrow_for_one_sample_and_one_insert_is_refused():
    limiter = RateLimiter(samples_per_insert=8.0, error_buffer=40.0)
    assert limiter.can_insert(4)  # 8 x 4 = 32 <= 80
    with pytest.raises(ValueError, match="error_buffer: 40 is too narrow for samples of 64 and inserts of 4"):
        limiter.can_sample(64)  # 64 + 32 > 80: both sides could be held at once


def test_sharded_replay_counts_the_shards_inserts_and_holds_samples(ray_cluster):
    from perx.distributed import ShardedReplay

    limiter = RateLimiter(samples_per_insert=2.0, min_size_to_sample=40, error_buffer=48.0)
    replay = ShardedReplay(2, 1000, seed=0, rate_limiter=limiter, sample_timeout=0.2)
    try:
        with pytest.raises(TimeoutError, match="rate limiter held a sample of 16"):
            replay.sample(16)  # nothing inserted yet
        credits = []
        for step in range(60):
            for _ in range(3 if step < 30 else 1):  # writers 3x faster, then the learner 2x faster
                if replay.can_insert(8):
                    replay.add(x=np.arange(8, dtype=np.float64))
            for _ in range(1 if step < 30 else 2):
                replay.refresh()
                limiter.inserted_to(replay._inserted())
                if limiter.can_sample(16):
                    replay.sample(16)
                    credits.append(limiter.credit())
        assert len(credits) > 20 and min(credits) >= -48.0 and max(credits) <= 48.0
        assert limiter.inserted == len(replay)  # the shards' counts, not the driver's guesses
    finally:
        replay.close()
