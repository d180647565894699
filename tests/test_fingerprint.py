"""Refactors change no numbers: a fixed-seed run of mixed extend/add/sample/update calls per sampler, reduced
to a SHA-256 fingerprint that is recorded here (issue 38: behaviour unchanged by the redesign).

What is hashed: the sampled ids (exact), IS weights and probabilities rounded to 9 significant digits, and at the
end every stored slot's priority as the buffer reports it (``ReplayBuffer.priorities``: the rank and greedy
keys too; +inf for a not yet replayed heap entry). The rounding keeps a last-bit difference of a summation on
another CPU (numba compiles for the host) from changing the fingerprint; a changed draw or key does.

A deliberate change of behaviour updates the table, saying why in the commit: run
``python -m tests.test_fingerprint`` for the current values.
"""

import hashlib

import numpy as np
import pytest

from tests.conftest import SAMPLERS, transitions

EXPECTED = {  # recorded on ec9fc89, before the redesign of issue 38
    "greedy": "b703e7f69257de0ecbb525cd",
    "hybrid": "65bc6986cdd2976c2c881d96",
    "hybrid-random": "b19c3da097b920ca96c56f41",
    "hybrid-rank-lap": "af3a66a2e7685ec11297f0ef",
    "lap": "9211b0705ea8df200168f669",
    "lap-small-kappa": "56e40681a371e13544a86f72",
    "proportional": "042b251c76f1613c54a8fb4c",
    "proportional-batchnorm": "8bd652b98cb58eab15c0be99",
    "proportional-buffermax": "7e904b4ea18107ea5bed5b24",
    "proportional-buffernorm": "2d65e665df7699ff8d1712ad",
    "proportional-independent": "43891538b0ef2c1d06fdfdcd",
    "rank": "11fd6039b26a08a57fbf2f0f",
    "rank-buffernorm": "83d035c2ce802e5036f164fe",
    "rank-exact": "18aa4f52b2766413a47ad858",
    "rank-fixed-segments": "fda2021c1251763b7ec6615e",
    "rank-sort-often": "00b0f496ee70ffea2cbc8f91",
    "uniform": "bcd021b2d92b4d39e2d7cbbf",
}


def _round(x: np.ndarray) -> bytes:
    x = np.asarray(x, np.float64)
    return np.array([float(f"{v:.9g}") for v in x.ravel()], np.float64).tobytes()


def fingerprint(name: str) -> str:
    import perx

    sampler = SAMPLERS[name]()
    buf = perx.ReplayBuffer(97, sampler, seed=1234)
    rng = np.random.default_rng(99)
    digest = hashlib.sha256()
    start = 0
    for step in range(40):
        n = int(rng.integers(1, 30))
        buf.extend(**transitions(n, start=start))
        start += n
        if step % 3 == 0:
            one = {k: v[0] for k, v in transitions(1, start=start).items()}
            buf.add(**one)
            start += 1
        batch = buf.sample(int(rng.integers(1, 40)), beta=float(rng.uniform(0.2, 1.0)))
        digest.update(batch.indices.tobytes())
        digest.update(_round(batch.weights))
        digest.update(_round(batch.probabilities))
        if name != "uniform":
            buf.update_priorities(batch.indices, rng.normal(size=len(batch)) * rng.uniform(0.1, 5.0))
    if name != "uniform":
        digest.update(_round(buf.priorities(np.arange(start - len(buf), start))))
    return digest.hexdigest()[:24]


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_fixed_seed_run_matches_the_recorded_fingerprint(name):
    assert fingerprint(name) == EXPECTED[name]


if __name__ == "__main__":
    for name in sorted(SAMPLERS):
        print(f'    "{name}": "{fingerprint(name)}",')
