"""Importance-sampling weights (000 Sec. 3.4) against the closed form, and their unbiasedness."""

import numpy as np
import pytest

import perx
from tests.conftest import transitions


def prioritized(normalize="buffer", size=80, alpha=0.6, seed=0):
    buf = perx.ReplayBuffer(size, perx.Proportional(alpha=alpha, normalize=normalize), seed=seed)
    buf.extend(**transitions(size))
    td = np.random.default_rng(1).exponential(1.0, size) * np.linspace(0.1, 5, size)
    buf.update_priorities(np.arange(size), td)
    return buf


@pytest.mark.parametrize("beta", [0.0, 0.4, 0.7, 1.0])
def test_buffer_normalised_weights_match_closed_form(beta):
    buf = prioritized("buffer")
    n = len(buf)
    all_p = buf.probabilities()
    batch = buf.sample(64, beta=beta)
    # w_i = (N P(i))^-beta / max_j (N P(j))^-beta over every stored j
    closed = (n * batch.probabilities) ** -beta / ((n * all_p) ** -beta).max()
    np.testing.assert_allclose(batch.weights, closed, rtol=1e-12)
    pure = perx.importance_weights(batch.probabilities, n, beta, normalize="buffer",
                                   min_probability=all_p.min())
    np.testing.assert_allclose(batch.weights, pure, rtol=1e-12)


@pytest.mark.parametrize("beta", [0.4, 1.0])
def test_batch_normalised_weights_match_closed_form(beta):
    buf = prioritized("batch")
    batch = buf.sample(64, beta=beta)
    raw = (len(buf) * batch.probabilities) ** -beta
    np.testing.assert_allclose(batch.weights, raw / raw.max(), rtol=1e-12)
    assert batch.weights.max() == 1.0
    np.testing.assert_allclose(
        batch.weights, perx.importance_weights(batch.probabilities, len(buf), beta, normalize="batch"),
        rtol=1e-12)


def test_buffer_normalisation_gives_weight_one_to_the_least_likely_transition():
    buf = prioritized("buffer", size=10)
    buf.set_priorities(np.arange(10), np.arange(1.0, 11.0))
    buf.set_priorities([0], [0.001])  # the least likely transition
    weights = []
    for _ in range(400):
        b = buf.sample(10, beta=1.0)
        weights.append(b.weights[b.indices == 0])
    w0 = np.concatenate(weights)
    assert w0.size > 0 and (w0 == 1.0).all()


def test_full_correction_makes_the_weighted_mean_unbiased():
    """beta = 1, unnormalised: E_{i~P}[w_i f(i)] = (1/N) sum_i f(i)."""
    buf = prioritized("batch", size=50, seed=2)
    f = np.sin(np.arange(50)) * 3 + np.arange(50) * 0.1  # any function of the transition
    n = len(buf)
    estimates = []
    for _ in range(4000):
        b = buf.sample(32, beta=1.0)
        w = perx.importance_weights(b.probabilities, n, 1.0, normalize=None)
        estimates.append(np.mean(w * f[b.indices % 50]))
    estimates = np.array(estimates)
    stderr = estimates.std(ddof=1) / np.sqrt(len(estimates))
    assert abs(estimates.mean() - f.mean()) < 4 * stderr
    # and without correction the estimate is visibly biased toward high-priority items
    p = buf.probabilities()
    assert abs((p * f).sum() - f.mean()) > 10 * stderr


def test_uniform_weights_are_one():
    buf = perx.ReplayBuffer(20, perx.Uniform(), seed=0)
    buf.extend(**transitions(20))
    assert (buf.sample(16, beta=1.0).weights == 1.0).all()


def test_beta_zero_gives_unit_weights():
    assert (prioritized().sample(32, beta=0.0).weights == 1.0).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"beta": 1.5}, "beta"),
        ({"normalize": "max"}, "normalize"),
        ({"normalize": "buffer", "min_probability": None}, "min_probability"),
    ],
)
def test_importance_weights_refuses_bad_arguments(kwargs, match):
    args = {"probabilities": [0.1, 0.2], "size": 10, "beta": 0.5, "normalize": "batch"} | kwargs
    with pytest.raises(ValueError, match=match):
        perx.importance_weights(**args)


def test_a_batch_of_collapsed_weights_warns_and_a_healthy_one_does_not():
    import warnings

    # 000 Sec. 3.4's buffer-wide maximum with one transition at the priority floor: every sampled weight tiny
    buf = perx.ReplayBuffer(100, perx.Proportional(alpha=0.6, eps=1e-10, normalize="buffer"), seed=0)
    buf.extend(x=np.arange(100.0))
    buf.update_priorities(np.arange(100), np.r_[0.0, np.full(99, 1.0)])  # one |delta| = 0: priority 1e-10
    batch = buf.sample(32, beta=1.0)
    assert batch.weights.max() < 1e-3  # (1 / 1e-10)^(-0.6): 1.6e-6
    with pytest.warns(perx.WeightScaleWarning, match="normalize='batch'"):
        assert perx.check_weight_scale(batch.weights, where="test")
    buf = perx.ReplayBuffer(100, perx.Proportional(alpha=0.6, eps=1e-10), seed=0)  # the default: the batch's max
    buf.extend(x=np.arange(100.0))
    buf.update_priorities(np.arange(100), np.r_[0.0, np.full(99, 1.0)])
    weights = buf.sample(32, beta=1.0).weights
    assert weights.max() == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not perx.check_weight_scale(weights)


def test_the_weight_scale_warning_is_shown_once_per_call_site_not_once_per_batch():
    import warnings

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")  # Python's own default: once per text and place
        for k in range(5):  # five collapsed batches of different scales from one training loop
            assert perx.check_weight_scale(np.full(4, 10.0 ** -(4 + k)), where="loop")
    assert len(shown) == 1 and issubclass(shown[0].category, perx.WeightScaleWarning)
