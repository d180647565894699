"""Schedules for hyperparameters annealed over training, such as beta (Schaul et al. 2016, Sec. 3.4)."""

from __future__ import annotations

from perx.validation import check_positive_int, check_real


class LinearSchedule:
    """Linear interpolation from ``start`` to ``end`` over ``steps`` steps, then constant at ``end``.

    ``value(t) = start + (end - start) * min(t / steps, 1)`` for t >= 0. The schedule holds no state:
    pass the training step (not a count of ``sample`` calls), so checkpoints need nothing extra.

    Example:
        >>> beta = LinearSchedule(0.4, 1.0, steps=1_000_000)
        >>> beta(0), beta(500_000), beta(5_000_000)
        (0.4, 0.7, 1.0)
    """

    def __init__(self, start: float, end: float, steps: int) -> None:
        self.start = check_real(start, "start")
        self.end = check_real(end, "end")
        self.steps = check_positive_int(steps, "steps")

    def __call__(self, t: float) -> float:
        t = check_real(t, "t", low=0.0)
        frac = min(t / self.steps, 1.0)
        # Clamp at `end` exactly (no overshoot from rounding): the ray PR#6973 failure mode.
        return self.end if frac >= 1.0 else self.start + (self.end - self.start) * frac

    value = __call__

    def __repr__(self) -> str:
        return f"LinearSchedule(start={self.start!r}, end={self.end!r}, steps={self.steps!r})"
