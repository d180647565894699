"""LinearSchedule: linear from start to end, clamped at end, a pure function of the step."""

import itertools

import pytest

import perx


def test_linear_schedule_interpolates_and_clamps_at_end():
    beta = perx.LinearSchedule(0.4, 1.0, steps=1000)
    assert beta(0) == 0.4
    assert beta(500) == pytest.approx(0.7, abs=1e-15)
    assert beta(1000) == 1.0
    assert beta(10**9) == 1.0  # never anneals past its end (ray PR#6973)
    assert beta.value(250) == pytest.approx(0.55, abs=1e-15)


def test_decreasing_schedule_clamps_too():
    alpha = perx.LinearSchedule(0.5, 0.0, steps=10)  # 000 Table 3: alpha annealed 0.5 -> 0
    assert alpha(5) == pytest.approx(0.25)
    assert alpha(11) == 0.0


def test_schedule_is_monotone_and_stays_between_its_ends():
    s = perx.LinearSchedule(0.4, 1.0, steps=777)
    values = [s(t) for t in range(0, 1000, 3)]
    assert all(0.4 <= v <= 1.0 for v in values)
    assert all(a <= b for a, b in itertools.pairwise(values))


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [((0.4, 1.0, 0), ValueError, "steps"), ((0.4, 1.0, 2.5), TypeError, "steps"),
     ((float("nan"), 1.0, 10), ValueError, "start"), ((0.4, "1", 10), TypeError, "end")],
)
def test_bad_schedule_arguments_are_refused(args, error, match):
    with pytest.raises(error, match=match):
        perx.LinearSchedule(*args)


def test_negative_step_is_refused():
    with pytest.raises(ValueError, match="t"):
        perx.LinearSchedule(0.4, 1.0, 10)(-1)
