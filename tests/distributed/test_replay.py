"""ShardedReplay against the exact distribution of the union of its shards (000 eq. 1 and Sec. 3.4)."""

import time
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

import perx

ray = pytest.importorskip("ray")

from perx.distributed import Shard, ShardedReplay, decode_ids, encode_ids  # noqa: E402

#: chi-square tests reject at p < 1e-3 (fixed seeds: the tests are deterministic)
ALPHA_TEST = 1e-3


@pytest.fixture(scope="module")
def shards(ray_cluster, tmp_path_factory):
    """Three shard actors shared by the tests of this module (each test resets them: starting actors
    costs seconds, resetting a few milliseconds)."""
    replay = ShardedReplay(3, 3, checkpoint_dir=tmp_path_factory.mktemp("shards"))
    yield replay
    replay.close()


def fill(replay, sizes, rng, with_priorities=True):
    """sizes[k] transitions into shard k; obs holds a unique number; returns {obs: priority}."""
    prio = {}
    n = 0
    for k, size in enumerate(sizes):
        obs = np.arange(n, n + size, dtype=np.float64)
        p = rng.uniform(0.05, 3.0, size) if with_priorities else None
        replay.add(shard=k, priorities=p, obs=obs[:, None], action=np.zeros(size, np.int64))
        if with_priorities:
            prio.update(zip(obs.astype(int), p, strict=True))
        n += size
    return prio


@pytest.mark.parametrize("stratified", [True, False])
def test_sharded_frequencies_match_union_probabilities(shards, stratified):
    rng = np.random.default_rng(0)
    replay = shards
    replay.reset(300, perx.Proportional(alpha=0.6, stratified=stratified), seed=1)
    prio = fill(replay, [7, 12, 4], rng)
    keys = np.array(sorted(prio))
    mass = np.array([prio[k] for k in keys]) ** 0.6
    exact = mass / mass.sum()
    counts = np.zeros(len(keys))
    draws = 0
    for _ in range(150):
        batch = replay.sample(64, beta=0.5)
        obs = batch["obs"][:, 0].astype(int)
        np.testing.assert_allclose(batch.probabilities, exact[obs], rtol=1e-12)
        np.add.at(counts, obs, 1)
        draws += len(obs)
    p_value = stats.chisquare(counts, exact * draws).pvalue
    assert p_value > ALPHA_TEST, p_value


def test_uniform_shards_of_unequal_size_sample_one_over_n(shards):
    replay = shards
    replay.reset(300, perx.Uniform(), seed=2)
    fill(replay, [5, 20, 0], np.random.default_rng(0), with_priorities=False)  # one shard empty
    counts = np.zeros(25)
    for _ in range(100):
        batch = replay.sample(50)
        np.testing.assert_allclose(batch.probabilities, 1 / 25, rtol=1e-12)
        np.testing.assert_array_equal(batch.weights, 1.0)
        np.add.at(counts, batch["obs"][:, 0].astype(int), 1)
    assert stats.chisquare(counts).pvalue > ALPHA_TEST


@pytest.mark.parametrize("normalize", ["buffer", "batch"])
def test_is_weights_equal_the_single_buffer_formula(shards, normalize):
    rng = np.random.default_rng(3)
    replay = shards
    replay.reset(300, perx.Proportional(alpha=0.7, normalize=normalize), seed=4)
    prio = fill(replay, [6, 9, 5], rng)
    p_all = np.array([prio[k] for k in sorted(prio)])
    P = p_all ** 0.7 / (p_all ** 0.7).sum()
    beta = 0.4
    for _ in range(5):
        batch = replay.sample(32, beta=beta)
        P_b = P[batch["obs"][:, 0].astype(int)]
        ref = P.min() if normalize == "buffer" else P_b.min()
        np.testing.assert_allclose(batch.weights, (len(P) * P_b) ** -beta / (len(P) * ref) ** -beta, rtol=1e-12)
        # and the same numbers as perx's single-buffer helper
        np.testing.assert_allclose(batch.weights, perx.importance_weights(
            P_b, len(P), beta, normalize=normalize, min_probability=P.min()), rtol=1e-12)


def test_lap_shards_return_unit_weights(shards):
    replay = shards
    replay.reset(300, perx.LAP(alpha=0.4, kappa=1.0), seed=5)
    fill(replay, [4, 6, 2], np.random.default_rng(1))
    batch = replay.sample(16, beta=0.5)
    np.testing.assert_array_equal(batch.weights, 1.0)


def test_stale_updates_after_wraparound_are_skipped_across_shards(shards):
    replay = shards
    replay.reset(12, perx.Proportional(alpha=1.0), seed=6)  # 4 per shard
    fill(replay, [4, 4, 4], np.random.default_rng(2))
    old = replay.sample(16).indices
    # overwrite shard 0 completely: every id sampled from it is stale now
    replay.add(shard=0, obs=np.full((4, 1), 100.0), action=np.zeros(4, np.int64))
    applied = replay.update_priorities(old, np.full(len(old), 50.0), wait=True)
    from_others = int((decode_ids(old)[2] != 0).sum())
    assert 0 < from_others < len(old)
    assert applied == from_others and replay.skipped == len(old) - from_others
    shard0, shard1, _ = replay.refresh()
    # nothing landed on shard 0's new transitions: they all still hold the same (maximal) priority
    assert shard0["total"] == pytest.approx(4 * shard0["min"], rel=1e-12) and shard0["min"] < 50.0
    assert shard1["total"] > shard0["total"]


def test_bad_updates_raise_before_anything_is_sent(shards):
    replay = shards
    replay.reset(30, perx.Proportional(alpha=0.6), seed=7)
    fill(replay, [3, 3, 3], np.random.default_rng(4))
    batch = replay.sample(8)
    totals = [s["total"] for s in replay.refresh()]
    with pytest.raises(ValueError, match="td_errors"):
        replay.update_priorities(batch.indices, np.full(8, np.nan))
    with pytest.raises(ValueError, match="indices"):
        replay.update_priorities(batch.indices | 7, np.ones(8))  # shard 7 of 3
    assert [s["total"] for s in replay.refresh()] == totals


def test_rank_based_and_bound_samplers_are_refused(ray_cluster):
    with pytest.raises(ValueError, match=r"sampler: .*rank"):
        ShardedReplay(2, 10, perx.RankBased(alpha=0.7))
    bound = perx.Proportional()
    perx.ReplayBuffer(4, bound)
    with pytest.raises(ValueError, match="sampler: pass an unbound"):
        ShardedReplay(2, 10, bound)
    with pytest.raises(ValueError, match="num_shards"):
        ShardedReplay(0, 10)


def test_killed_shard_comes_back_with_its_checkpoint_and_sampling_goes_on(shards):
    replay = shards
    replay.reset(300, perx.Proportional(alpha=0.6), seed=8)
    kept = replay.add(shard=0, obs=np.arange(10.0)[:, None], action=np.zeros(10, np.int64))
    replay.add(shard=1, obs=np.arange(10.0, 15.0)[:, None], action=np.zeros(5, np.int64))
    replay.checkpoint()
    lost = replay.add(shard=0, obs=np.arange(20.0, 25.0)[:, None], action=np.zeros(5, np.int64))
    incarnation = replay.stats[0]["incarnation"]
    ray.kill(replay.shards[0], no_restart=False)
    # ray.kill is asynchronous: a call sent right after it may still be served by the dying process, so wait
    # until the restarted incarnation answers (the calls retry while the shard is down)
    deadline = time.monotonic() + 120
    while replay.refresh()[0]["incarnation"] == incarnation and time.monotonic() < deadline:
        time.sleep(0.05)
    batch = replay.sample(64)  # samples the restored shard
    obs = set(batch["obs"][:, 0].astype(int).tolist())
    assert not obs & set(range(20, 25))
    stats0 = replay.refresh()[0]
    assert stats0["size"] == 10 and stats0["incarnation"] == incarnation + 1
    assert replay.restarts and replay.restarts[0]["lost_at_least"] == 5
    # an update of a lost id must not land on the new transition that now has its local id
    fresh = replay.add(shard=0, obs=np.arange(30.0, 35.0)[:, None], action=np.zeros(5, np.int64))
    assert (decode_ids(fresh)[0] == decode_ids(lost)[0]).all()
    applied = replay.update_priorities(np.concatenate([kept, lost]), np.full(15, 9.0), wait=True)
    assert applied == 10
    probs = replay.sample(32)
    by_obs = dict(zip(probs["obs"][:, 0].astype(int).tolist(), probs.probabilities.tolist(), strict=True))
    p_fresh = [p for o, p in by_obs.items() if o >= 30]
    p_kept = [p for o, p in by_obs.items() if o < 10]
    assert p_fresh and p_kept and max(p_fresh) < min(p_kept)  # the fresh ones kept the initial priority 1


def test_shard_keeps_ids_of_old_incarnations_before_the_restore_point(tmp_path):
    shard = Shard(3, 16, perx.Proportional(alpha=1.0), seed=0, checkpoint_dir=str(tmp_path))
    first = shard.add({"x": np.arange(6.0)}, return_ids=True)["ids"]
    shard.checkpoint()
    gone = shard.add({"x": np.arange(6.0, 9.0)}, return_ids=True)["ids"]
    again = Shard(3, 16, perx.Proportional(alpha=1.0), seed=0, checkpoint_dir=str(tmp_path), resume=True)
    assert again.incarnation == 1 and len(again.buffer) == 6
    new = again.add({"x": np.arange(3.0)}, return_ids=True)["ids"]
    assert (decode_ids(new)[0] == decode_ids(gone)[0]).all() and (new != gone).all()
    applied, skipped, _ = again.update(np.concatenate([first, gone, new]), np.full(12, 2.0))
    assert (applied, skipped) == (9, 3)
    assert (decode_ids(encode_ids(np.array([5]), 1030, 7))[1] == 1030 % 1024).all()


def test_shard_restarted_without_checkpoints_makes_every_old_id_stale(tmp_path):
    # a restart is a second construction that finds its own job's incarnation file
    first = Shard(0, 16, perx.Proportional(alpha=1.0), job="j", meta_dir=str(tmp_path))
    old = first.add({"x": np.arange(10.0)}, return_ids=True)["ids"]
    again = Shard(0, 16, perx.Proportional(alpha=1.0), job="j", meta_dir=str(tmp_path))
    assert again.incarnation == 1 and len(again.buffer) == 0
    again.add({"x": np.arange(3.0)})
    applied, skipped, stats = again.update(old, np.full(10, 50.0))
    assert (applied, skipped) == (0, 10)
    assert stats["total"] == pytest.approx(3.0)  # the three new transitions kept priority 1
    other_job = Shard(0, 16, perx.Proportional(alpha=1.0), job="k", meta_dir=str(tmp_path))
    assert other_job.incarnation == 0  # another job's files are not a restart


def test_shard_with_zero_mass_returns_no_draws():
    shard = Shard(0, 8, perx.Proportional(alpha=1.0, eps=0.0))
    ids = shard.add({"x": np.arange(4.0)}, return_ids=True)["ids"]
    shard.update(ids, np.zeros(4), raw=True)
    data, got, _, stats = shard.sample(5)
    assert data is None and len(got) == 0 and stats["total"] == 0.0


def test_shard_refuses_a_too_large_priority_before_storing():
    shard = Shard(0, 8, perx.Proportional(alpha=1.0))
    with pytest.raises(ValueError, match="priorities"):
        shard.add({"x": np.arange(2.0)}, priorities=np.array([1.0, 1e308]))
    assert len(shard.buffer) == 0


def bookkeeping(num_shards, shards=None):
    """A ShardedReplay with only the learner's bookkeeping (and the given shard handles), no actors."""
    replay = ShardedReplay.__new__(ShardedReplay)
    replay.num_shards, replay.shards = num_shards, shards
    replay._configure(10 * num_shards, perx.Proportional(alpha=1.0), 0)
    replay._stats, replay.restarts, replay._replaced = [None] * num_shards, [], [set() for _ in range(num_shards)]
    return replay


def test_late_replies_do_not_overwrite_newer_totals():
    replay = bookkeeping(1)
    base = {"shard": 0, "size": 4, "next_id": 4, "min": 1.0, "incarnation": 0, "restored_next_id": None,
            "checkpoints": 0, "instance": "a", "incarnation_drawn": False}
    replay._note({**base, "total": 50.0, "version": 3})
    replay._note({**base, "total": 80.0, "version": 2})  # an update reply collected late
    assert replay.stats[0]["total"] == 50.0
    replay._note({**base, "total": 4.0, "version": 0, "incarnation": 2, "next_id": 1, "restored_next_id": 1,
                  "instance": "b"})
    assert replay.stats[0]["total"] == 4.0
    assert replay.restarts[0]["restarts"] == 2 and replay.restarts[0]["lost_at_least"] == 3


def test_a_restart_with_a_lower_incarnation_is_newer_and_the_old_process_is_not(tmp_path):
    replay = bookkeeping(1)
    first = Shard(0, 16, perx.Proportional(alpha=1.0), job="j", meta_dir=str(tmp_path / "node-a"))
    first.add({"x": np.arange(6.0)})
    for _ in range(3):
        replay._note(first.reset(16, perx.Proportional(alpha=1.0)))  # same process: newer, not a restart
    replay._note(first.add({"x": np.arange(6.0)}))
    assert replay.stats[0]["incarnation"] == 3 and replay.stats[0]["size"] == 6 and not replay.restarts
    # restarted on a node without its incarnation file: an incarnation below 3 (a random draw, or 0 here)
    again = Shard(0, 16, perx.Proportional(alpha=1.0), job="j", meta_dir=str(tmp_path / "node-b"))
    assert again.incarnation < 3
    replay._note(again.add({"x": np.arange(2.0)}))
    assert replay.stats[0]["size"] == 2 and len(replay.restarts) == 1
    assert replay.restarts[0]["lost_at_least"] == 6
    replay._note(first.update(np.empty(0, np.int64), np.empty(0))[2])  # a late reply of the replaced process
    replay._note(again.stats())
    assert replay.stats[0]["size"] == 2 and len(replay.restarts) == 1


def test_redraws_after_a_shard_lost_its_mass_are_bounded(ray_cluster):
    stats = {"shard": 0, "size": 4, "next_id": 4, "total": 4.0, "min": 1.0, "incarnation": 0,
             "restored_next_id": None, "checkpoints": 0, "version": 0, "instance": "a", "incarnation_drawn": False,
             "max_accepted_priority": np.inf}
    # a shard whose totals promise mass its draws never deliver (as one emptied between every reading of
    # the totals and the draws would be): the batch is drawn again a few times, then sample gives up
    hollow = SimpleNamespace(sample=SimpleNamespace(remote=lambda n: ray.put((None, np.empty(0, np.int64),
                                                                                 np.empty(0), stats))),
                             stats=SimpleNamespace(remote=lambda: ray.put(stats)))
    replay = bookkeeping(1, [hollow])
    replay.refresh()
    with pytest.raises(RuntimeError, match=r"sample: \d+ draws in a row"):
        replay.sample(8)


def test_pipelined_batches_have_the_union_probabilities_when_nobody_writes(shards):
    replay = shards
    replay.reset(300, perx.Proportional(alpha=0.6), seed=9)
    prio = fill(replay, [5, 8, 3], np.random.default_rng(5))
    replay.refresh()
    p = np.array([prio[k] for k in sorted(prio)]) ** 0.6
    exact = p / p.sum()
    pending = [replay.sample_async(16, 0.5) for _ in range(3)]
    for _ in range(5):
        batch = pending.pop(0).result()
        np.testing.assert_allclose(batch.probabilities, exact[batch["obs"][:, 0].astype(int)], rtol=1e-12)
        pending.append(replay.sample_async(16, 0.5))


def test_an_update_a_shard_refuses_is_raised_once_and_counted(shards):
    replay = shards
    replay.reset(30, perx.Proportional(alpha=0.6), seed=10)
    ids = replay.add(shard=1, obs=np.zeros((3, 1)), action=np.zeros(3, np.int64))
    bogus = encode_ids(np.array([10**6]), replay.stats[1]["incarnation"], 1)  # never issued
    calls = [lambda: replay.update_priorities(np.concatenate([ids, bogus]), np.ones(4)),
             lambda: replay.update_priorities(ids, np.ones(3)), replay.flush, replay.flush]
    raised = 0
    for call in calls:  # the call that first collects the refused reply raises (a non-blocking collect may)
        try:
            call()
        except ValueError as err:
            assert "refused" in str(err)
            raised += 1
    assert raised == 1  # accounted for: not raised again
    assert replay.failed_updates == 1 and replay.applied == 3


@pytest.mark.parametrize("shard", [-1, 3, True, 1.0, "1"])
def test_add_refuses_a_shard_that_is_not_an_int_in_range(shards, shard):
    replay = shards
    replay.reset(30, perx.Proportional(alpha=0.6), seed=11)
    # -1 would store in shard K-1 and True in shard 1 (Python's indexing), so both are refused
    with pytest.raises(ValueError, match=rf"shard: .*got {shard!r}"):
        replay.add(shard=shard, obs=np.zeros((2, 1)), action=np.zeros(2, np.int64))
    assert [s["size"] for s in replay.refresh()] == [0, 0, 0]


@pytest.mark.parametrize("values", [[True, False], ["3.5", "1e2"], [1.0, None]])
def test_updates_that_are_not_real_numbers_are_refused_before_anything_is_sent(shards, values):
    replay = shards
    replay.reset(30, perx.Proportional(alpha=0.6), seed=12)
    ids = replay.add(shard=2, obs=np.zeros((2, 1)), action=np.zeros(2, np.int64))
    totals = [s["total"] for s in replay.refresh()]
    # as the core ReplayBuffer.update_priorities: bools, strings and objects are not converted to floats
    with pytest.raises(TypeError, match="td_errors: expected real numbers"):
        replay.update_priorities(ids, values, wait=True)
    with pytest.raises(TypeError, match="priorities: expected real numbers"):
        replay.update_priorities(ids, values, raw=True, wait=True)
    assert [s["total"] for s in replay.refresh()] == totals and replay.applied == 0


def test_reset_with_a_bad_seed_changes_nothing(shards):
    replay = shards
    replay.reset(30, perx.Proportional(alpha=0.6), seed=13)
    prototype, shard_capacity = replay.prototype, replay.shard_capacity
    replay.add(shard=0, obs=np.zeros((2, 1)), action=np.zeros(2, np.int64))
    for seed in (-1, 1.5, True):
        with pytest.raises(ValueError, match=rf"seed: .*got {seed!r}"):
            replay.reset(300, perx.Uniform(), seed=seed)
    assert replay.prototype is prototype and replay.shard_capacity == shard_capacity == 10
    assert [s["size"] for s in replay.refresh()] == [2, 0, 0]


@pytest.mark.parametrize(("argument", "sharded", "single"), [
    ("indices", lambda r, ids: r.update_priorities(ids.astype(float), np.ones(2)), None),  # TypeError
    ("indices", lambda r, ids: r.update_priorities(ids[None], np.ones(2)), None),
    ("td_errors", lambda r, ids: r.update_priorities(ids, np.ones(3)), None),
    ("td_errors", lambda r, ids: r.update_priorities(ids, np.array(["1", "2"])), None),
    ("batch_size", lambda r, ids: r.sample(1.5), None),
    ("batch_size", lambda r, ids: r.sample(0), None),
    ("beta", lambda r, ids: r.sample(4, beta=True), None),
    ("beta", lambda r, ids: r.sample(4, beta=1.5), None),
    ("beta", lambda r, ids: r.sample(4, beta=float("nan")), None),
    ("sampler", lambda r, ids: ShardedReplay(2, 10, "per"), lambda b, ids: perx.ReplayBuffer(10, "per")),
    ("capacity", lambda r, ids: ShardedReplay(2, 10.0), lambda b, ids: perx.ReplayBuffer(10.0)),
    ("capacity", lambda r, ids: ShardedReplay(2, 0), lambda b, ids: perx.ReplayBuffer(0)),
])
def test_bad_arguments_raise_the_error_one_buffer_raises(shards, argument, sharded, single):
    # the checks are the core's: the same error type, naming the argument, and nothing sent or stored
    replay = shards
    replay.reset(30, perx.Proportional(alpha=0.6), seed=17)
    ids = replay.add(shard=0, obs=np.zeros((2, 1)), action=np.zeros(2, np.int64))
    buf = perx.ReplayBuffer(30, perx.Proportional(alpha=0.6))
    local = buf.extend(obs=np.zeros((2, 1)), action=np.zeros(2, np.int64))
    totals = [s["total"] for s in replay.refresh()]
    with pytest.raises((TypeError, ValueError)) as got:
        sharded(replay, ids)
    with pytest.raises((TypeError, ValueError)) as want:
        (single or sharded)(buf, local)
    assert type(got.value) is type(want.value), (got.value, want.value)
    assert str(got.value).startswith(f"{argument}: ") and str(want.value).startswith(f"{argument}: ")
    replay.flush()
    assert [s["total"] for s in replay.refresh()] == totals and replay.applied == 0


def test_shard_counts_are_checked_as_the_core_checks_counts_and_against_the_id_bits(ray_cluster):
    for num_shards, error in ((1.5, TypeError), (0, ValueError), (2000, ValueError)):  # 2000 > 2^SHARD_BITS
        with pytest.raises(error, match=rf"num_shards: .*{num_shards!r}"):
            ShardedReplay(num_shards, 4000)
    with pytest.raises(ValueError, match=r"capacity: at least num_shards \(4\), got 3"):
        ShardedReplay(4, 3)


@pytest.mark.parametrize("raw", [False, True])
def test_a_priority_above_a_shards_cap_is_refused_before_anything_is_sent(shards, raw):
    replay = shards
    replay.reset(30, perx.Proportional(alpha=1.0), seed=14)
    a = replay.add(shard=0, obs=np.zeros((2, 1)), action=np.zeros(2, np.int64))
    b = replay.add(shard=1, obs=np.zeros((2, 1)), action=np.zeros(2, np.int64))
    totals = [s["total"] for s in replay.refresh()]
    # finite, but its mass would overflow shard 0's sum; shard 1's part alone would be accepted
    with pytest.raises(ValueError, match=rf"{'priorities' if raw else 'td_errors'}: .*1e\+308.* shard 0"):
        replay.update_priorities(np.concatenate([a[:1], b[:1]]), np.array([1e308, 5.0]), raw=raw)
    replay.flush()
    assert [s["total"] for s in replay.refresh()] == totals
    assert replay.applied == 0 and replay.failed_updates == 0


def test_a_waited_update_returns_only_its_own_count(shards):
    replay = shards
    replay.reset(30, perx.Proportional(alpha=1.0), seed=15)
    ids = np.concatenate([replay.add(shard=k, obs=np.zeros((4, 1)), action=np.zeros(4, np.int64)) for k in range(3)])
    for _ in range(3):
        replay.update_priorities(ids[:10], np.full(10, 2.0))  # not waited for: collected by the next flush
        assert replay.update_priorities(ids[10:], np.full(2, 3.0), wait=True) == 2
    assert replay.applied == 36


def test_union_of_shards_near_the_mass_cap_samples_exactly_without_overflow(shards):
    replay = shards
    replay.reset(24, perx.Proportional(alpha=1.0), seed=16)  # 8 per shard
    cap = replay.stats[0]["max_accepted_priority"]
    rng = np.random.default_rng(6)
    prio = cap * rng.uniform(0.5, 1.0, 24)  # each shard's sum is finite, the three together exceed float64
    for k in range(3):
        replay.add(shard=k, priorities=prio[8 * k:8 * k + 8], obs=np.arange(8.0 * k, 8.0 * k + 8)[:, None],
                   action=np.zeros(8, np.int64))
    assert np.isinf(sum(s["total"] for s in replay.refresh()))
    scaled = prio / cap  # exact: the cap is a power of two at alpha = 1
    exact = scaled / scaled.sum()
    counts = np.zeros(3)
    for _ in range(20):
        batch = replay.sample(48, beta=0.5)
        obs = batch["obs"][:, 0].astype(int)
        np.testing.assert_allclose(batch.probabilities, exact[obs], rtol=1e-12)
        np.testing.assert_allclose(batch.weights, (exact[obs] / exact.min()) ** -0.5, rtol=1e-12)
        np.add.at(counts, obs // 8, 1)
    share = np.array([exact[8 * k:8 * k + 8].sum() for k in range(3)])
    assert stats.chisquare(counts, share * counts.sum()).pvalue > ALPHA_TEST


def test_resume_refuses_the_files_of_another_configuration(ray_cluster, tmp_path):
    for k in range(2):
        old = Shard(k, 10, perx.Proportional(alpha=0.6), checkpoint_dir=str(tmp_path))
        old.add({"x": np.arange(3.0)})
        old.checkpoint()
    # the shards would keep the old capacity and sampler while the learner splits and weighs with the new ones
    asked = [(2000, perx.Proportional(alpha=0.6), r"capacity: .*10 .*1000"),
             (20, perx.Uniform(), r"sampler: .*'Proportional'.*'Uniform'"),
             (20, perx.Proportional(alpha=1.0), r"sampler: .*alpha")]
    for capacity, sampler, message in asked:
        with pytest.raises(ValueError, match=message):
            ShardedReplay(2, capacity, sampler, checkpoint_dir=tmp_path, resume=True)
    Shard(0, 10, perx.Proportional(alpha=0.6), checkpoint_dir=str(tmp_path), resume=True)  # the same: resumed
    with pytest.raises(ValueError, match="capacity"):  # and so does a Shard made by hand
        Shard(0, 20, perx.Proportional(alpha=0.6), checkpoint_dir=str(tmp_path), resume=True)
    replay = ShardedReplay(2, 20, perx.Proportional(alpha=0.6), checkpoint_dir=tmp_path, resume=True)
    assert len(replay) == 6
    replay.close()


def test_new_transitions_get_their_own_shards_largest_priority():
    # documented (docs/distributed.md): one buffer would give both new transitions priority 100
    low, high = Shard(0, 8, perx.Proportional(alpha=1.0)), Shard(1, 8, perx.Proportional(alpha=1.0))
    low.add({"x": np.zeros(2)})
    seen = high.add({"x": np.zeros(2)}, return_ids=True)["ids"]
    high.update(seen[:1], np.array([100.0]))
    new_low = decode_ids(low.add({"x": np.ones(1)}, return_ids=True)["ids"])[0]
    new_high = decode_ids(high.add({"x": np.ones(1)}, return_ids=True)["ids"])[0]
    assert low.buffer.priorities(new_low)[0] == 1.0
    assert high.buffer.priorities(new_high)[0] == pytest.approx(100.0)


def test_close_kills_the_shards_even_when_an_update_it_waits_for_was_refused(ray_cluster):
    replay = ShardedReplay(2, 20, perx.Proportional(alpha=0.6), seed=0)
    ids = replay.add(shard=0, obs=np.zeros((3, 1)), action=np.zeros(3, np.int64))
    bogus = encode_ids(np.array([10**6]), replay.stats[0]["incarnation"], 0)  # never issued: refused
    replay.update_priorities(np.concatenate([ids, bogus]), np.ones(4))
    with pytest.raises(ValueError, match="refused"):
        replay.close()
    for shard in replay.shards:  # ray.kill takes effect asynchronously: a ping may still get through at first
        deadline = time.monotonic() + 30
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(shard.ping.remote(), timeout=30)
                time.sleep(0.1)


@pytest.fixture
def single(shards):
    """The module's shards drawing each batch from one shard (restored after the test)."""
    shards.single_shard_batches = True
    yield shards
    shards.single_shard_batches = False


def test_single_shard_batches_pick_shards_by_mass_and_draw_exactly_within_them(single):
    rng = np.random.default_rng(5)
    replay = single
    replay.reset(300, perx.Proportional(alpha=0.6, stratified=False), seed=6)
    sizes = [7, 12, 4]
    prio = fill(replay, sizes, rng)
    mass = np.array([prio[k] for k in sorted(prio)]) ** 0.6
    exact = mass / mass.sum()
    edges = np.cumsum([0, *sizes])
    q = np.array([mass[edges[k]:edges[k + 1]].sum() for k in range(3)]) / mass.sum()
    chosen = np.zeros(3)
    within = np.zeros(len(mass))
    for _ in range(400):
        batch = replay.sample(16, beta=0.5)
        obs = batch["obs"][:, 0].astype(int)
        k = int(np.searchsorted(edges, obs[0], side="right") - 1)
        assert np.all((edges[k] <= obs) & (obs < edges[k + 1]))  # the whole batch from one shard
        np.testing.assert_allclose(batch.probabilities, exact[obs], rtol=1e-12)  # P(i) = m_i / M per draw
        chosen[k] += 1
        np.add.at(within, obs, 1)
    # the shard of a batch ~ M_k / M (one choice per batch: independent across batches)
    assert stats.chisquare(chosen, q * chosen.sum()).pvalue > ALPHA_TEST
    # given its shard, draws ~ m_i / M_k (independent draws of that shard's sampler)
    for k in range(3):
        part = slice(edges[k], edges[k + 1])
        assert stats.chisquare(within[part], mass[part] / mass[part].sum() * within[part].sum()).pvalue > ALPHA_TEST


@pytest.mark.parametrize("normalize", ["buffer", "batch"])
def test_single_shard_batches_keep_the_closed_form_is_weights(single, normalize):
    replay = single
    replay.reset(300, perx.Proportional(alpha=0.7, normalize=normalize), seed=7)
    prio = fill(replay, [6, 9, 5], np.random.default_rng(8))
    replay.refresh()  # the other shards' totals, for buffer-wide normalisation
    P = np.array([prio[k] for k in sorted(prio)]) ** 0.7
    P = P / P.sum()
    for _ in range(6):
        batch = replay.sample(32, beta=0.4)
        P_b = P[batch["obs"][:, 0].astype(int)]
        np.testing.assert_allclose(batch.weights, perx.importance_weights(
            P_b, len(P), 0.4, normalize=normalize, min_probability=P.min()), rtol=1e-12)


def test_single_shard_batches_make_one_sample_call_and_one_update_call(single):
    replay = single
    replay.reset(300, perx.Proportional(alpha=0.6), seed=9)
    fill(replay, [10, 10, 10], np.random.default_rng(10))
    pending = replay.sample_async(16, beta=1.0)
    assert len(pending.refs) == 1
    batch = pending.result()
    before = len(replay._updates)
    replay.update_priorities(batch.indices, np.ones(16))
    assert len(replay._updates) - before <= 1  # one call (0 if it was already collected)
    assert replay.update_priorities(batch.indices, np.ones(16), wait=True) == 16


def test_single_shard_batches_come_to_a_shard_that_filled_up_behind_the_learners_back(single):
    replay = single
    replay.reset(300, perx.Proportional(alpha=0.6), seed=11)
    fill(replay, [10, 0, 0], np.random.default_rng(12))
    replay.refresh()
    for _ in range(3):
        replay.sample(8)  # shards 1 and 2 hold nothing yet: only shard 0 can be chosen
    rows = {"obs": np.full((40, 1), 99.0), "action": np.zeros(40, np.int64)}
    ray = pytest.importorskip("ray")
    ray.get(replay.shards[2].add.remote(rows, None, np.full(40, 5.0)))  # a writer's push, not through replay
    seen = set()
    for _ in range(12 * replay.num_shards):
        seen.add(int(replay.sample(8)["obs"][0, 0] == 99.0))
    assert 1 in seen  # the background refresh brought shard 2's mass in


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"scheduling_strategy": "PACK"}, ValueError, "scheduling_strategy: 'SPREAD', 'DEFAULT'"),
    ({"scheduling_strategy": None}, TypeError, "scheduling_strategy: 'SPREAD', 'DEFAULT'"),
    ({"memory": -1}, ValueError, "memory: bytes per shard, an int >= 0, got -1"),
    ({"memory": 1.5}, ValueError, "memory: bytes per shard"),
    ({"resources": {"CPU": 1}}, ValueError, "resources: custom resources only"),
    ({"resources": {"node_a": 0}}, ValueError, "resources: a dict of resource name -> amount > 0"),
])
def test_placement_options_are_checked_before_any_actor_starts(kwargs, error, match):
    with pytest.raises(error, match=match):
        ShardedReplay(2, 10, **kwargs)


def test_shards_report_their_node(shards):
    node = ray.get_runtime_context().get_node_id()
    assert shards.refresh() and shards.shard_nodes == [node] * 3


def test_batches_land_in_preallocated_arrays_and_a_mismatch_is_refused_before_drawing(shards):
    replay = shards
    replay.reset(300, perx.Proportional(alpha=1.0), seed=3)
    for k in range(3):  # obs = 100 k + local id: a row's obs tells its id
        replay.add(shard=k, obs=(100.0 * k + np.arange(20.0))[:, None], action=np.full(20, k, np.int64))
    dest = {"obs": np.full((16, 1), -1.0), "action": np.full(16, -1, np.int64)}
    batch = replay.sample(16, out=dest)
    assert batch["obs"] is dest["obs"] and batch["action"] is dest["action"]
    local, _, shard = decode_ids(batch.indices)
    np.testing.assert_array_equal(dest["obs"][:, 0], 100.0 * shard + local)
    np.testing.assert_array_equal(dest["action"], shard)
    again = replay.sample(16, out=batch)  # a previous batch's arrays, reused
    assert again["obs"] is dest["obs"]
    state = replay._rng.bit_generator.state
    for bad, match in [({"obs": np.zeros((16, 2)), "action": np.zeros(16, np.int64)}, r"out\['obs'\]: shape"),
                       ({"obs": np.zeros((16, 1), np.float32), "action": np.zeros(16, np.int64)}, "of float64"),
                       ({"obs": np.zeros((8, 1)), "action": np.zeros(8, np.int64)}, "an array of 16 rows"),
                       ({"obs": np.zeros((16, 1))}, "one array per field"),
                       ({"obs": np.zeros((16, 1)), "action": np.zeros(16, np.int64)[::1].view()}, None)]:
        if match is None:
            bad["action"].flags.writeable = False
            match = "writable"
        with pytest.raises(ValueError, match=match):
            replay.sample(16, out=bad)
    with pytest.raises(TypeError, match=r"out: a perx\.Batch or a dict"):
        replay.sample(16, out=[1, 2])
    assert replay._rng.bit_generator.state == state  # nothing was drawn
