"""Importance-sampling weights (Schaul et al. 2016, Sec. 3.4): w_i = (N * P(i))^-beta / max_j w_j."""

from __future__ import annotations

import numpy as np

from perx._validation import check_choice, check_real


def importance_weights(probabilities, size: int, beta: float, *, normalize: str | None = "buffer",
                       min_probability: float | None = None) -> np.ndarray:
    """Importance-sampling weights of sampled transitions; float64, shape of ``probabilities``.

    Args:
        probabilities: P(i) of each sampled transition (000 eq. 1), each in (0, 1].
        size: N, the number of transitions stored when they were sampled.
        beta: IS exponent in [0, 1]; 1 fully compensates non-uniform sampling.
        normalize: ``"buffer"`` divides by the largest weight any stored transition could get,
            (N * P_min)^-beta, which needs ``min_probability``; ``"batch"`` divides by the largest
            weight in this batch; ``None`` leaves the unnormalised (N P(i))^-beta.
        min_probability: smallest P(i) over the stored transitions (for ``"buffer"``).

    The buffer computes the same quantity inside its sampling kernel as (mass_i / mass_min)^-beta;
    tests/test_weights.py checks that the two agree.
    """
    p = np.asarray(probabilities, dtype=np.float64)
    beta = check_real(beta, "beta", low=0.0, high=1.0)
    if normalize is not None:
        check_choice(normalize, "normalize", ("buffer", "batch"))
    if size <= 0:
        raise ValueError(f"size: must be > 0, got {size!r}")
    if p.size and (not np.isfinite(p).all() or p.min() <= 0 or p.max() > 1):
        raise ValueError(f"probabilities: must lie in (0, 1], got {p!r}")
    if normalize is None:
        return _power_ratio(p, 1.0 / size, beta)
    if normalize == "batch":
        return _power_ratio(p, p.min(), beta) if p.size else p.copy()
    if min_probability is None:
        raise ValueError("min_probability: required with normalize='buffer', got None")
    if not 0 < min_probability <= 1:
        raise ValueError(f"min_probability: must lie in (0, 1], got {min_probability!r}")
    return _power_ratio(p, min_probability, beta)


def _power_ratio(p: np.ndarray, ref: float, beta: float) -> np.ndarray:
    """(p / ref)^-beta = (N p)^-beta / (N ref)^-beta; in log space where the ratio over- or underflows
    (probabilities spanning more than ~308 orders of magnitude), so the weight is exact, not 0 or NaN."""
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        ratio = p / ref
        w = ratio**-beta
        bad = ~np.isfinite(ratio) | (ratio < np.finfo(np.float64).tiny)
        if bad.any():
            w[bad] = np.exp(-beta * (np.log(p[bad]) - np.log(ref)))
    return w
