"""LAP (004 eq. 9 and 30): proportional sampling with another priority function and no IS."""

import numpy as np
import pytest

import perx
from tests.conftest import filled


def test_lap_is_a_configuration_of_proportional():
    s = perx.LAP(alpha=0.4, kappa=1.0)
    assert type(s) is perx.Proportional
    assert s.config() | {} == {"alpha": 0.4, "eps": 0.0, "stratified": True, "normalize": "batch",
                               "max_priority": "historical", "min_priority": 1.0,
                               "importance_sampling": False}


def test_lap_priorities_are_clipped_at_kappa_and_alpha_applied_once():
    buf = filled(perx.LAP(alpha=0.4, kappa=0.5), capacity=4)
    buf.update_priorities([0, 1, 2, 3], [0.1, -0.5, 2.0, -3.0])
    assert buf.sampler.priorities(np.arange(4)).tolist() == [0.5, 0.5, 2.0, 3.0]
    np.testing.assert_allclose(buf.sampler.masses, np.array([0.5, 0.5, 2.0, 3.0]) ** 0.4, rtol=1e-15)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_lap_weights_are_one_whatever_beta(beta):
    buf = filled(perx.LAP(), capacity=50)
    buf.update_priorities(np.arange(50), np.linspace(-5, 5, 50))
    assert (buf.sample(32, beta=beta).weights == 1.0).all()


def test_lap_new_transitions_get_the_largest_priority_seen():
    buf = filled(perx.LAP(alpha=0.4, kappa=1.0), capacity=4)
    buf.update_priorities([0, 1, 2, 3], [7.0, 0.2, 0.3, 0.4])
    idx = buf.extend(obs=np.zeros((1, 3), np.float32), action=np.zeros(1, np.int64),
                     reward=np.zeros(1, np.float32), next_obs=np.zeros((1, 3), np.float32),
                     terminated=np.zeros(1, bool), truncated=np.zeros(1, bool))
    assert buf.sampler.priorities(idx % 4).tolist() == [7.0]


@pytest.mark.parametrize("kappa", [0.0, -1.0])
def test_lap_refuses_a_non_positive_kappa(kappa):
    with pytest.raises(ValueError, match="kappa"):
        perx.LAP(kappa=kappa)
