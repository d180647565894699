"""The sampler written from scratch in docs/samplers.md keeps the contract of every perx sampler.

Its code is taken from the page (the python block after the ``scratch-sampler`` marker), so the page and this test
cannot drift. Every test of tests/samplers/test_conformance.py runs against it unchanged: the test functions are
collected again in this module, where the ``make_sampler`` fixture builds the scratch sampler instead of the
conftest's SAMPLERS. Then its sampling frequencies are checked against the exact softmax distribution by a
chi-square test, as tests/samplers/test_distributions.py does for the built-in samplers: fixed seeds, and the
test fails when the p-value is below P_MIN = 1e-3 (a correct sampler would fail for about one seed in a thousand).
"""

import inspect
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from scipy import special, stats

import perx
import tests.samplers.test_conformance as conformance
from tests.conftest import SAMPLERS, assert_same, filled, snapshot, transitions

PAGE = Path(__file__).resolve().parents[2] / "docs" / "samplers.md"
MARKER = "<!-- scratch-sampler:"
P_MIN = 1e-3


def page_code() -> str:
    """The python block that follows the marker on docs/samplers.md."""
    text = PAGE.read_text()
    found = re.search(r"```python\n(.*?)\n```", text[text.index(MARKER):], re.S)
    assert found, "docs/samplers.md: no python block after the scratch-sampler marker"
    return found.group(1)


def load_page_module() -> types.ModuleType:
    """The page's code as a module of its own, registered in sys.modules so that its sampler pickles."""
    module = types.ModuleType("perx_docs_samplers")
    module.__file__ = str(PAGE)
    sys.modules[module.__name__] = module
    exec(compile(page_code(), str(PAGE), "exec"), module.__dict__)
    return module


Softmax = load_page_module().Softmax
NAME = "scratch-softmax"


def make():
    return Softmax(temperature=0.5)


@pytest.fixture
def make_sampler():
    """Overrides the conftest's fixture (params: SAMPLERS) for the tests collected into this module."""
    return make


def test_defining_the_class_registered_it_for_load():
    assert perx.Sampler.registry["Softmax"] is Softmax


# -- the conformance suite, unchanged ------------------------------------------------------------------------
_CONFORMANCE = {name: fn for name, fn in vars(conformance).items()
                if name.startswith("test_") and inspect.isfunction(fn) and fn.__module__ == conformance.__name__}
_BY_FIXTURE = [n for n, fn in _CONFORMANCE.items() if "make_sampler" in inspect.signature(fn).parameters]
_BY_NAME = [n for n, fn in _CONFORMANCE.items() if "name" in inspect.signature(fn).parameters]

for _name in _BY_FIXTURE:
    globals()[_name] = _CONFORMANCE[_name]  # collected again here, with this module's make_sampler


@pytest.mark.parametrize("test", _BY_NAME)
def test_conformance_tests_parametrised_by_sampler_name(test, monkeypatch):
    """The tests that take a name of conftest.SAMPLERS rather than the fixture, with the scratch sampler
    entered under NAME for the duration of the test only (tests/test_fingerprint.py records every entry)."""
    monkeypatch.setitem(SAMPLERS, NAME, make)
    _CONFORMANCE[test](NAME)


def test_every_conformance_test_is_run_here():
    assert _BY_FIXTURE and _BY_NAME
    assert set(_BY_FIXTURE) | set(_BY_NAME) == set(_CONFORMANCE), "a conformance test of another shape: run it here"
    assert all(globals()[n] is _CONFORMANCE[n] for n in _BY_FIXTURE)


# -- the distribution ------------------------------------------------------------------------------------------
def softmax_buffer(temperature, size=60, seed=0):
    buf = perx.ReplayBuffer(size, Softmax(temperature=temperature), seed=seed)
    buf.extend(**transitions(size))
    td = np.random.default_rng(123).standard_normal(size) * np.linspace(0.05, 4, size)
    buf.update_priorities(np.arange(size), td)
    return buf, td


def chi2_pvalue(counts, expected):
    stat = ((counts - expected) ** 2 / expected).sum()
    return stats.chi2.sf(stat, df=len(counts) - 1)


def test_probabilities_are_the_softmax_of_the_stored_priorities():
    buf, td = softmax_buffer(temperature=2.0)
    np.testing.assert_array_equal(buf.priorities(np.arange(60)), np.abs(td))
    np.testing.assert_allclose(buf.probabilities(), special.softmax(np.abs(td) / 2.0), rtol=1e-12)


@pytest.mark.parametrize("temperature", [2.0, 5.0])
def test_sampling_frequencies_match_the_softmax_distribution(temperature):
    buf, td = softmax_buffer(temperature)
    counts = np.zeros(60)
    for _ in range(2000):
        np.add.at(counts, buf.sample(32, beta=0.4).indices % 60, 1)
    exact = special.softmax(np.abs(td) / temperature)  # computed here, not by the sampler
    assert exact.min() * counts.sum() > 5  # every expected count large enough for the chi-square statistic
    assert chi2_pvalue(counts, exact * counts.sum()) > P_MIN
    # power: the same counts reject the distribution of a temperature 20% off
    wrong = special.softmax(np.abs(td) / (1.2 * temperature))
    assert chi2_pvalue(counts, wrong * counts.sum()) < 1e-12


def test_weights_are_eq_3_4_normalised_by_the_batch():
    buf, _ = softmax_buffer(temperature=1.0)
    batch = buf.sample(64, beta=0.6)
    w = (60 * batch.probabilities) ** -0.6
    np.testing.assert_allclose(batch.weights, w / w.max(), rtol=1e-12)


def test_new_transitions_get_the_largest_priority_applied_so_far():
    buf, td = softmax_buffer(temperature=1.0)
    ids = buf.extend(**transitions(3, start=60))
    np.testing.assert_array_equal(buf.priorities(ids), np.full(3, np.abs(td).max()))


def test_masses_that_underflow_are_never_drawn():
    buf = perx.ReplayBuffer(6, Softmax(temperature=0.001), seed=0)
    buf.extend(**transitions(6))
    buf.set_priorities(np.arange(6), [0.0, 5.0, 0.0, 5.0, 0.0, 0.0])  # exp(-5000) is 0 in float64
    for b in (1, 7, 1000):
        assert set((buf.sample(b).indices % 6).tolist()) <= {1, 3}
    assert buf.probabilities().tolist() == [0.0, 0.5, 0.0, 0.5, 0.0, 0.0]


class _Uniforms:
    """A stand-in generator whose ``random(n)`` gives n copies of one value: the ends of [0, 1)."""

    def __init__(self, value):
        self.value = value

    def random(self, n):
        return np.full(n, self.value)


@pytest.mark.parametrize("u", [0.0, np.nextafter(1.0, 0.0)])
def test_the_ends_of_the_uniforms_draw_a_stored_slot_of_positive_mass(u):
    for size, expected in ((6, {0: 1, 1: 3}), (5, {0: 0, 1: 4})):  # total 2 and total 3 (not a power of 2)
        buf = perx.ReplayBuffer(size, Softmax(temperature=0.001), seed=0)
        buf.extend(**transitions(size))
        mass = [0.0, 5.0, 0.0, 5.0, 0.0, 0.0] if size == 6 else [5.0, 0.0, 5.0, 0.0, 5.0]
        buf.set_priorities(np.arange(size), mass)  # exp(-5000) is 0: zero masses first, inside and last
        buf.sampler._rng = _Uniforms(u)
        assert (buf.sample(3).indices == expected[u > 0.5]).all()


# -- its own refusals ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("temperature", "error"), [(0.0, ValueError), (-1.0, ValueError), (np.inf, ValueError),
                                                    (1e-320, ValueError), ("1", TypeError)])
def test_a_bad_temperature_is_refused(temperature, error):
    with pytest.raises(error, match="temperature"):
        Softmax(temperature=temperature)


def test_a_priority_whose_quotient_overflows_is_refused_and_changes_nothing():
    buf = filled(Softmax(temperature=0.5), capacity=10)
    before = snapshot(buf)
    limit = buf.sampler.max_accepted_priority
    assert np.isfinite(limit / 0.5) and not np.isfinite(float(np.nextafter(limit, np.inf)) / 0.5)
    with pytest.raises(ValueError, match=r"td_errors.*largest accepted priority"):
        buf.update_priorities([0, 1], [1.0, np.nextafter(limit, np.inf)])
    assert_same(before, snapshot(buf))
    assert buf.set_priorities([0], [limit]) == 1


def test_a_crafted_state_is_refused_and_changes_nothing():
    buf = filled(Softmax(), capacity=10)
    meta, arrays = buf.sampler.state_dict()
    before = snapshot(buf)
    for name, bad in (("priority", -1.0), ("priority", np.nan), ("max_priority", 0.5), ("max_priority", "1")):
        m, a = dict(meta), {k: v.copy() for k, v in arrays.items()}
        if name == "priority":
            a["priority"][3] = bad
        else:
            m["max_priority"] = bad
        with pytest.raises(ValueError, match=name):
            buf.sampler.load_state_dict(m, a, size=10, next_id=10)
        assert_same(before, snapshot(buf))


# -- what the page says comes from the buffer --------------------------------------------------------------------
def test_it_works_with_episodes_and_a_lock():
    buf = perx.ReplayBuffer(40, Softmax(), seed=0, episodes=perx.Episodes(n_step=3), lock=True)
    steps = transitions(30)
    steps["obs"][:] = np.arange(30)[:, None]  # each step's next observation is the next step's observation
    steps["next_obs"] = steps["obs"] + 1
    buf.extend(**steps)
    batch = buf.sample(8)
    assert batch["return"].shape == (8,)
    assert buf.update_priorities(batch.indices, np.ones(8)) == 8


def test_it_is_a_hybrid_component(tmp_path):
    buf = perx.ReplayBuffer(30, perx.Hybrid([Softmax(temperature=0.5), perx.Uniform()], [0.5, 0.5]), seed=1)
    buf.extend(**transitions(45))
    batch = buf.sample(16, beta=0.5)
    np.testing.assert_array_equal(batch.probabilities, buf.probabilities(batch.indices, batch_size=16))
    assert buf.update_priorities(batch.indices, np.arange(16.0)) == 16
    before = snapshot(buf)
    with pytest.raises(ValueError, match=r"components\[0\]"):  # p / 0.5 overflows: refused before any applies
        buf.set_priorities([40], [1e308])
    assert_same(before, snapshot(buf))
    buf.save(tmp_path / "mixed.npz")
    twin = perx.ReplayBuffer.load(tmp_path / "mixed.npz")
    for _ in range(3):
        np.testing.assert_array_equal(twin.sample(16).indices, buf.sample(16).indices)
