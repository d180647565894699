"""Small statistics shared by the studies: multiple-comparison correction and bootstrap intervals."""

from __future__ import annotations

import itertools

import numpy as np


def holm(pvalues) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values, in the input order (Holm 1979, Scand. J. Statist. 6: 65-70):
    with the m p-values sorted ascending, p_(j) -> max over k <= j of min(1, (m - k + 1) p_(k)). Rejecting
    where the adjusted value is <= a level controls the family-wise error rate at that level."""
    p = np.asarray(pvalues, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    # the running maximum keeps the adjusted values in the order of the raw ones (step-down)
    stepped = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = stepped
    return out



def bootstrap_interval(values: list[float], level: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values``. Exact (every one of the n^n resamples, each
    with its multinomial weight) for n <= 6, otherwise ``resamples`` draws with a fixed seed. Unlike a t
    interval it never leaves [min(values), max(values)], so a band drawn from it never shows values the
    metric cannot take (a return below 0 where returns are counts)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 1:
        return float(x[0]), float(x[0])
    if n <= 6:
        idx = np.array(list(itertools.product(range(n), repeat=n)))
        means = x[idx].mean(axis=1)  # each ordered resample once: equal weight is the multinomial weight
    else:
        means = x[np.random.default_rng(seed).integers(0, n, size=(resamples, n))].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))
