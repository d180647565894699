"""perx inside TorchRL: ``perx.torchrl.PerxSampler`` checked through TorchRL's own replay-buffer API.

Every test drives TorchRL's ``ReplayBuffer`` / ``TensorDictReplayBuffer`` with ``LazyTensorStorage`` or
``ListStorage`` and checks what comes out against perx's closed forms: P(i) = p_i^alpha / sum_k p_k^alpha
with p_i = |delta_i| + eps, and w_i = (N P(i))^-beta / max_j (N P(j))^-beta.
"""

import io
import multiprocessing
import pickle
import re
import tomllib
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
_start_method = multiprocessing.get_start_method(allow_none=True)
torchrl = pytest.importorskip("torchrl")
# importing torchrl sets the process-wide start method to "spawn"; give the rest of the session its own back
multiprocessing.set_start_method(_start_method, force=True)
from scipy import stats  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.scheduler import LinearScheduler  # noqa: E402

import perx  # noqa: E402
from perx.torchrl import PerxSampler, make_sampler  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EPS = 1e-6  # perx.Proportional's default eps
#: Goodness-of-fit threshold: a chi-square test at a fixed seed fails below this p-value. Stratified
#: sampling draws with less variance than multinomial draws, so the test is conservative for it.
P_MIN = 1e-3

torch.set_num_threads(1)


def td_buffer(capacity, sampler="per", size=None, batch_size=None, **kwargs):
    """A TensorDictReplayBuffer holding ``size`` items whose field "key" is their insertion number."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=batch_size,
                                sampler=PerxSampler(capacity, sampler, seed=0, **kwargs))
    if size:
        rb.extend(TensorDict({"key": torch.arange(size)}, [size]))
    return rb


def closed_form(td, alpha):
    """P(i) from TD errors: p_i = |delta_i| + eps."""
    return from_priorities(np.abs(td) + EPS, alpha)


def from_priorities(p, alpha):
    """P(i) from stored raw priorities."""
    mass = np.asarray(p, dtype=np.float64) ** alpha
    return mass / mass.sum()


def counts_of(rb, batches, batch_size, n_keys):
    keys = torch.cat([rb.sample(batch_size)["key"] for _ in range(batches)])
    return np.bincount(keys.numpy(), minlength=n_keys)


# -- (a) sampling frequencies ------------------------------------------------------------------------------
def test_proportional_frequencies_match_the_exact_distribution():
    rb = td_buffer(10)
    rb.extend(TensorDict({"key": torch.arange(10)}, [10]))
    td = np.array([0.05, 0.1, 0.3, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0])
    rb.update_priority(torch.arange(10), torch.tensor(td))
    expected = closed_form(td, 0.6)
    np.testing.assert_allclose(rb.sampler.probabilities().numpy(), expected, rtol=1e-12)
    counts = counts_of(rb, 400, 64, 10)  # 25,600 draws, counted by the stored data, not by index
    chi2 = stats.chisquare(counts, counts.sum() * expected)
    assert chi2.pvalue > P_MIN
    # the same counts reject alpha applied twice: the test can fail
    wrong = closed_form(closed_form(td, 0.6), 0.6)
    assert stats.chisquare(counts, counts.sum() * wrong).pvalue < P_MIN


@pytest.mark.parametrize("kind", ["uniform", "rank"])
def test_uniform_and_rank_frequencies_match_perx_probabilities(kind):
    rb = ReplayBuffer(storage=ListStorage(12), sampler=PerxSampler(12, kind, seed=1))
    rb.extend([torch.tensor(i) for i in range(12)])
    rb.update_priority(torch.arange(12), torch.linspace(0.1, 3.0, 12))
    expected = rb.sampler.probabilities(batch_size=32).numpy()
    if kind == "uniform":
        np.testing.assert_allclose(expected, np.full(12, 1 / 12))
    else:  # highest |delta| = rank 1 = most likely
        assert np.all(np.diff(expected) > 0)
    keys = torch.cat([rb.sample(32) for _ in range(300)])  # ListStorage of ints: the data is the key
    counts = np.bincount(keys.numpy(), minlength=12)
    assert stats.chisquare(counts, counts.sum() * expected).pvalue > P_MIN


# -- (b) IS weights ---------------------------------------------------------------------------------------
def test_weights_equal_the_closed_form_and_follow_beta():
    rb = td_buffer(16, beta=0.4)
    rb.extend(TensorDict({"key": torch.arange(10)}, [10]))
    td = np.linspace(0.2, 5.0, 10)
    rb.update_priority(torch.arange(10), torch.tensor(td))
    prob = closed_form(td, 0.6)
    for beta in (0.4, 0.7, 1.0):
        rb.sampler.beta = beta
        batch, info = rb.sample(64, return_info=True)
        w = (10 * prob) ** -beta
        want = w[batch["key"].numpy()] / w.max()
        assert batch["priority_weight"].dtype == torch.float32
        np.testing.assert_allclose(batch["priority_weight"].numpy(), want, rtol=1e-6)
        np.testing.assert_array_equal(info["priority_weight"].numpy(), batch["priority_weight"].numpy())
    assert torch.equal(batch["index"], batch["key"])  # no wrap yet: storage index = insertion number


def test_torchrl_linear_scheduler_anneals_beta():
    rb = td_buffer(8, size=8, beta=0.4)
    rb.update_priority(torch.arange(8), torch.arange(1.0, 9.0))
    scheduler = LinearScheduler(rb, param_name="beta", final_value=1.0, num_steps=3)
    for _ in range(4):
        scheduler.step()
    assert rb.sampler.beta == 1.0
    batch = rb.sample(32)
    w = (8 * closed_form(np.arange(1.0, 9.0), 0.6)) ** -1.0
    np.testing.assert_allclose(batch["priority_weight"].numpy(), w[batch["key"].numpy()] / w.max(), rtol=1e-6)


@pytest.mark.parametrize("kind", ["uniform", "lap", "greedy"])
def test_samplers_without_is_weights_return_ones(kind):
    rb = td_buffer(8, kind, size=8, beta=0.5)
    rb.update_priority(torch.arange(8), torch.arange(8.0))
    assert torch.equal(rb.sample(4)["priority_weight"], torch.ones(4))


# -- (c) priority updates -----------------------------------------------------------------------------------
def test_update_priority_on_a_plain_replay_buffer_sets_priorities_from_td_errors():
    rb = ReplayBuffer(storage=ListStorage(6), sampler=PerxSampler(6, "per", alpha=0.5, seed=0))
    rb.extend([torch.tensor(i) for i in range(6)])
    td = np.array([-2.0, 0.5, 1.0, 0.0, 3.0, 1.5])  # any sign: perx takes |delta|
    rb.update_priority(torch.arange(6), torch.tensor(td))
    np.testing.assert_allclose(rb.sampler.priorities(torch.arange(6)).numpy(), np.abs(td) + EPS)
    np.testing.assert_allclose(rb.sampler.probabilities().numpy(), closed_form(td, 0.5), rtol=1e-12)
    rb.update_priority(2, 7.0)  # one int index, one number
    assert rb.sampler.priorities([2]).item() == 7.0 + EPS
    rb.update_priority(torch.tensor([1, 1]), torch.tensor([4.0, 0.25]))  # duplicates: the last wins
    assert rb.sampler.priorities([1]).item() == 0.25 + EPS


def test_priority_key_write_back_through_tensordict_replay_buffer():
    rb = td_buffer(32, batch_size=16)
    # extend with a priority key: TorchRL writes it back at once
    rb.extend(TensorDict({"key": torch.arange(20), "td_error": torch.full((20,), 0.5)}, [20]))
    np.testing.assert_allclose(rb.sampler.priorities(torch.arange(20)).numpy(), 0.5 + EPS)
    batch = rb.sample()
    batch["td_error"] = (batch["key"].double() + 1.0).unsqueeze(-1)  # [B, 1], as TorchRL's losses write it
    rb.update_tensordict_priority(batch)
    keys = batch["key"].numpy()
    np.testing.assert_allclose(rb.sampler.priorities(batch["index"]).numpy(), keys + 1.0 + EPS)
    p = np.full(20, 0.5)
    p[keys] = keys + 1.0
    np.testing.assert_allclose(rb.sampler.probabilities().numpy(), closed_form(p, 0.6), rtol=1e-12)


def test_add_without_priority_keeps_the_new_item_priority_exactly():
    """TensorDictReplayBuffer.add sends default_priority back through update_priority: no eps creeps in."""
    rb = td_buffer(64, size=4)
    rb.update_priority(torch.arange(4), torch.tensor([0.1, 0.2, 2.5, 0.3], dtype=torch.float64))
    top = rb.sampler.default_priority
    assert top == 2.5 + EPS
    for k in range(50):
        rb.add(TensorDict({"key": torch.tensor(4 + k)}, []))
    assert rb.sampler.default_priority == top
    np.testing.assert_array_equal(rb.sampler.priorities(torch.arange(4, 54)).numpy(), top)


def test_rank_and_greedy_new_items_stay_not_yet_replayed_after_add():
    for kind in ("rank", "greedy"):
        rb = td_buffer(8, kind, size=2)
        rb.update_priority(torch.arange(2), torch.tensor([1.0, 2.0]))
        rb.add(TensorDict({"key": torch.tensor(2)}, []))  # TorchRL sends +inf, perx's "not yet replayed"
        assert rb.sampler.priorities(torch.arange(3)).tolist() == [1.0, 2.0, np.inf]
        with pytest.raises(ValueError, match="priority"):  # but an inf TD error is refused
            rb.update_priority(torch.tensor([0]), torch.tensor([np.inf]))


def test_slot_updates_land_on_the_new_item_and_update_by_id_skips_them():
    rb = td_buffer(4, size=4)
    batch = rb.sample(4)
    rb.extend(TensorDict({"key": torch.arange(4, 8)}, [4]))  # every sampled slot is overwritten
    assert rb.sampler.update_by_id(batch["perx_id"], torch.full((4,), 9.0)) == 0  # perx: stale, skipped
    assert rb.sampler.priorities(torch.arange(4)).tolist() == [1.0] * 4
    rb.update_tensordict_priority(batch.set("td_error", torch.full((4,), 9.0)))  # TorchRL: by slot
    assert rb.sampler.priorities(torch.arange(4)).tolist() == [9.0 + EPS] * 4
    fresh = rb.sample(4)
    assert rb.sampler.update_by_id(fresh["perx_id"], torch.full((4,), 0.5)) == 4


def test_mark_update_gives_proportional_items_the_new_item_priority_again():
    rb = td_buffer(8, size=6)
    rb.update_priority(torch.arange(6), torch.tensor([3.0, 0.1, 0.1, 0.1, 0.1, 0.1]))
    rb.mark_update(torch.tensor([1, 2]))
    assert rb.sampler.priorities(torch.tensor([1, 2])).tolist() == [3.0 + EPS] * 2
    rank = td_buffer(8, "rank", size=3)
    with pytest.raises(NotImplementedError, match="mark_update"):
        rank.mark_update(torch.tensor([0]))


# -- (d) wrap-around ----------------------------------------------------------------------------------------
def test_after_wrap_around_only_stored_items_are_sampled_and_new_ones_get_max_priority():
    rb = td_buffer(6, size=6)
    rb.update_priority(torch.arange(6), torch.tensor([0.1, 0.2, 0.3, 0.4, 5.0, 0.6], dtype=torch.float64))
    rb.extend(TensorDict({"key": torch.arange(6, 9)}, [3]))  # overwrites slots 0, 1, 2
    assert len(rb) == 6 and len(rb.sampler) == 6
    top = 5.0 + EPS
    stored = {0: 6, 1: 7, 2: 8, 3: 3, 4: 4, 5: 5}  # slot -> key
    assert rb.sampler.default_priority == top
    np.testing.assert_allclose(rb.sampler.priorities(torch.arange(6)).numpy(), [top, top, top, 0.4 + EPS, top,
                                                                                 0.6 + EPS])
    prob = rb.sampler.probabilities().numpy()
    np.testing.assert_allclose(prob, from_priorities([top, top, top, 0.4 + EPS, top, 0.6 + EPS], 0.6), rtol=1e-12)
    batch = rb.sample(256)
    assert set(batch["key"].tolist()) <= set(stored.values())
    assert all(stored[i] == k for i, k in zip(batch["index"].tolist(), batch["key"].tolist(), strict=True))
    # a batch larger than the storage: only the last six are kept, as both TorchRL and perx do
    rb.extend(TensorDict({"key": torch.arange(100, 110)}, [10]))
    assert sorted(rb.sample(128)["key"].unique().tolist()) == list(range(104, 110))


def test_list_storage_wraps_the_same_way():
    rb = ReplayBuffer(storage=ListStorage(5), sampler=PerxSampler(5, "per", seed=0))
    rb.extend([torch.tensor(i) for i in range(5)])
    rb.update_priority(torch.arange(5), torch.full((5,), 0.1, dtype=torch.float64))
    rb.add(torch.tensor(5))  # into slot 0, at the historical maximum (1, the initial priority)
    data, info = rb.sample(400, return_info=True)
    assert torch.equal(data, torch.where(info["index"] == 0, 5, info["index"]))
    expected = from_priorities([1.0] + [0.1 + EPS] * 4, 0.6)
    np.testing.assert_allclose(rb.sampler.probabilities().numpy(), expected, rtol=1e-12)


# -- (e) save / load ----------------------------------------------------------------------------------------
def filled(kind="per"):
    rb = td_buffer(16, kind, batch_size=8, beta=0.6)
    rb.extend(TensorDict({"key": torch.arange(20)}, [20]))
    for _ in range(3):
        batch = rb.sample()
        rb.update_tensordict_priority(batch.set("td_error", batch["key"].double().sqrt()))
    rb.add(TensorDict({"key": torch.tensor(20)}, []))  # one fresh item, not yet updated
    return rb


def same_next_batches(a, b, n=5):
    for _ in range(n):
        x, y = a.sample(), b.sample()
        for key in ("index", "key", "priority_weight", "perx_id"):
            assert torch.equal(x[key], y[key]), key
        a.update_tensordict_priority(x.set("td_error", x["key"] * 0.1))
        b.update_tensordict_priority(y.set("td_error", y["key"] * 0.1))


@pytest.mark.parametrize("kind", ["per", "rank"])
def test_state_dict_round_trip_through_torch_save_gives_identical_samples(kind):
    rb = filled(kind)
    blob = io.BytesIO()
    torch.save(rb.state_dict(), blob)
    blob.seek(0)
    state = torch.load(blob, weights_only=True)  # tensors and numbers only
    other = td_buffer(16, kind, batch_size=8, beta=0.1)
    other.load_state_dict(state)
    assert other.sampler.beta == 0.6
    # item 20 (slot 4) kept its "written, not updated since" mark: TorchRL's default write-back is a no-op
    for buf in (rb, other):
        buf.update_priority(torch.tensor([4]), torch.tensor(buf.sampler.default_priority))
    np.testing.assert_array_equal(other.sampler.priorities(torch.arange(16)).numpy(),
                                  rb.sampler.priorities(torch.arange(16)).numpy())
    assert other.sampler.default_priority == rb.sampler.default_priority
    same_next_batches(rb, other)


def test_dumps_loads_round_trip_gives_identical_samples(tmp_path):
    rb = filled()
    rb.dumps(tmp_path / "rb")
    other = td_buffer(16, batch_size=8)
    other.loads(tmp_path / "rb")
    assert len(other) == 16
    same_next_batches(rb, other)


@pytest.mark.parametrize("kind", ["per", "greedy"])
def test_empty_starts_over(kind):
    rb = filled(kind)
    rb.empty()
    assert len(rb.sampler) == 0 and rb.sampler.default_priority == (1.0 if kind == "per" else np.inf)
    rb.extend(TensorDict({"key": torch.arange(8)}, [8]))
    assert set(rb.sample()["key"].tolist()) == set(range(8))


def test_pickled_sampler_draws_the_same_batches():
    """TorchRL pickles samplers (buffers sent to other processes); TorchRL's PrioritizedSampler refuses."""
    for kind in ("per", "greedy"):
        rb = filled(kind)
        copy = pickle.loads(pickle.dumps(rb.sampler))
        a, info_a = rb.sampler.sample(rb.storage, 8)
        b, info_b = copy.sample(rb.storage, 8)
        assert torch.equal(a, b) and torch.equal(info_a["priority_weight"], info_b["priority_weight"])


# -- (f) every kind runs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["uniform", "per", "proportional", "rank", "lap", "greedy"])
def test_every_sampler_kind_runs_a_sample_update_loop(kind):
    rb = td_buffer(16, kind, size=6, batch_size=8)
    for step in range(1, 6):
        rb.extend(TensorDict({"key": torch.arange(6 * step, 6 * step + 6)}, [6]))
        batch = rb.sample()
        assert batch["index"].shape == (8,) and batch["priority_weight"].shape == (8,)
        assert (batch["priority_weight"] > 0).all() and (batch["priority_weight"] <= 1).all()
        rb.update_tensordict_priority(batch.set("td_error", torch.rand(8)))
    assert len(rb) == 16 and set(batch["key"].tolist()) <= set(range(20, 36))
    if kind == "greedy":  # the top-8 by |delta|, all distinct
        assert len(set(batch["index"].tolist())) == 8


def test_a_perx_sampler_instance_is_accepted():
    hybrid = perx.Hybrid([perx.Proportional(alpha=0.5), perx.Uniform()], [0.5, 0.5])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=PerxSampler(8, hybrid, seed=0))
    rb.extend(TensorDict({"key": torch.arange(8)}, [8]))
    batch = rb.sample(8)
    rb.update_tensordict_priority(batch.set("td_error", torch.rand(8)))
    assert rb.sampler.perx_sampler is hybrid
    assert type(make_sampler("lap", kappa=2.0)) is perx.Proportional


# -- (g) bad input raises naming the argument ---------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"max_capacity": 0}, "max_capacity: must be > 0, got 0"),
    ({"max_capacity": 4.0}, "max_capacity: expected a positive int"),
    ({"sampler": "prioritized"}, "sampler: expected one of .* got 'prioritized'"),
    ({"sampler": 3}, "sampler: expected one of"),
    ({"sampler": "rank", "eps": 0.1}, "eps: sampler 'rank' takes no eps"),
    ({"sampler": "per", "kappa": 1.0}, "kappa: sampler 'per' takes no kappa"),
    ({"sampler": perx.Uniform(), "alpha": 0.5}, "alpha: give it to the perx sampler"),
    ({"alpha": -1.0}, "alpha"),
    ({"beta": 1.5}, r"beta: must be in \[0, 1\], got 1.5"),
    ({"beta": "0.4"}, "beta: expected a number"),
    ({"reduction": "mode"}, "reduction: expected one of .* got 'mode'"),
])
def test_bad_construction_raises_naming_the_argument(kwargs, match):
    kwargs = {"max_capacity": 8, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        PerxSampler(**kwargs)


def test_bad_updates_raise_naming_the_argument_and_change_nothing():
    rb = td_buffer(8, size=5)
    before = rb.sampler.priorities(torch.arange(5)).clone()
    cases = [
        ((torch.tensor([0, 1]), torch.tensor([1.0, float("nan")])), r"priority: must be finite, got nan at position 1"),
        ((torch.tensor([0, 1]), torch.tensor([1.0, 2.0, 3.0])), r"priority: expected one value or one per index"),
        ((torch.tensor([0, 7]), torch.tensor([1.0, 2.0])), r"index: 7 is not a storage index holding data"),
        ((torch.tensor([0.0, 1.0]), torch.tensor([1.0, 2.0])), r"index: expected integer storage indices"),
        ((torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0])), r"index: PerxSampler supports 1-D storages"),
    ]
    for (index, priority), match in cases:
        with pytest.raises((ValueError, TypeError), match=match):
            rb.update_priority(index, priority)
    with pytest.raises(ValueError, match="perx_id: 9 was never issued"):
        rb.sampler.update_by_id(torch.tensor([9]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"beta: must be in \[0, 1\], got 2"):
        rb.sampler.beta = 2
    with pytest.raises(ValueError, match="alpha: a perx sampler's alpha is fixed"):
        rb.sampler.alpha = 0.3
    assert torch.equal(rb.sampler.priorities(torch.arange(5)), before)
    rb.update_priority(torch.tensor([-1, 0]), torch.tensor([5.0, 2.0]))  # -1: TorchRL's "skip this one"
    assert rb.sampler.priorities([0]).item() == 2.0 + EPS


def test_mismatched_storages_and_foreign_writes_raise():
    with pytest.raises(ValueError, match="storage: its max_size 8 differs from the sampler's max_capacity 4"):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=PerxSampler(4))
        rb.extend(TensorDict({"key": torch.arange(2)}, [2]))
        rb.sample(2)
    storage = LazyTensorStorage(4)
    TensorDictReplayBuffer(storage=storage).extend(TensorDict({"key": torch.arange(3)}, [3]))
    # TorchRL writes default priorities for data already stored when a prioritized sampler is attached
    with pytest.raises(ValueError, match="index: 0 is not a storage index holding data"):
        TensorDictReplayBuffer(storage=storage, sampler=PerxSampler(4))
    sampler = PerxSampler(4)
    with pytest.raises(ValueError, match=r"index: PerxSampler expected the next write at storage indices \[0, 1\]"):
        sampler.extend(torch.tensor([2, 3]))


def test_loading_another_samplers_state_raises():
    state = filled("per").state_dict()  # the buffer's; the sampler's is state["_sampler"]
    rb = td_buffer(16, "rank")
    with pytest.raises(ValueError, match="state_dict: saved by a PerxSampler"):
        rb.load_state_dict(state)
    with pytest.raises(ValueError, match="state_dict: not a PerxSampler state"):
        rb.sampler.load_state_dict({"_alpha": 0.6})
    broken = dict(state["_sampler"], perx_buffer=state["_sampler"]["perx_buffer"][:100])
    with pytest.raises(ValueError, match="state_dict: the saved perx buffer is damaged"):
        rb.sampler.load_state_dict(broken)


# -- extras and docs ----------------------------------------------------------------------------------------
def test_the_torchrl_extra_pins_the_installed_versions_and_torch():
    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    reqs = {Requirement(r).name: Requirement(r) for r in extras["torchrl"]}
    assert str(reqs["torch"].specifier) == "==2.13.0"
    for name, req in reqs.items():
        assert req.specifier.contains(metadata.version(name), prereleases=True), (name, metadata.version(name))


def test_the_dqn_loop_in_the_docs_runs():
    pytest.importorskip("torchrl.objectives")
    text = (ROOT / "docs" / "training_loops.md").read_text()
    section = text[text.index("## TorchRL: `perx.torchrl`"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "steps = 200" in code
    namespace: dict = {}
    exec(compile(code.replace("steps = 200", "steps = 4"), "docs/training_loops.md", "exec"), namespace)
    rb = namespace["rb"]
    assert len(rb) == 4 * 8 and rb.sampler.beta == 1.0
