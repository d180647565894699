"""Importance-sampling weights (Schaul et al. 2016, Sec. 3.4): w_i = (N * P(i))^-beta / max_j w_j."""

from __future__ import annotations

import warnings

import numpy as np

from perx.validation import check_choice, check_real


class WeightScaleWarning(UserWarning):
    """Every IS weight of a batch is far below 1, so the loss (and, with an optimiser whose eps exceeds the
    gradients, the update) shrinks by the same factor: what made PER collapse in docs/dqn.md."""


def check_weight_scale(weights, *, threshold: float = 1e-3, where: str = "") -> bool:
    """Warn (:class:`WeightScaleWarning`) when the largest IS weight of a batch is below ``threshold``; returns
    whether it did. With weights divided by the buffer-wide maximum (``normalize="buffer"``, 000 Sec. 3.4)
    one stored transition whose priority fell to the floor eps sets that maximum, and every sampled weight
    is then (p_i / p_min)^(-alpha beta): below 1e-3 for p_i / p_min above 1e5 at alpha 0.6, beta 1. Cost:
    one pass over the B weights (any array or tensor with ``max``)."""
    top = float(weights.max()) if len(weights) else 1.0
    if top >= threshold:
        return False
    # the text does not carry the batch's value, so Python's default filter shows it once per call site and
    # `where` instead of once per batch
    warnings.warn(f"{where + ': ' if where else ''}every IS weight of a batch is below {threshold:g}: the loss "
                  f"is scaled down by that factor or more. With normalize='buffer' one transition "
                  f"at the priority floor sets the maximum weight; use normalize='batch' (perx's default) or a "
                  f"larger eps (docs/dqn.md, 'Why PER collapsed')", WeightScaleWarning, stacklevel=2)
    return True


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
