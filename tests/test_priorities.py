"""The priority variants of 000 Appendix A: each rule's effect on priorities and P(i) in tiny hand-checked cases."""

import numpy as np
import pytest

import perx
from perx.priorities import Asymmetric, LearningProgress, PredecessorBoost, ReturnBoost, Staleness
from tests.conftest import assert_same, snapshot, transitions


def buffer(sampler, n=3, capacity=8):
    buf = perx.ReplayBuffer(capacity, sampler, seed=0)
    buf.extend(**transitions(n))
    return buf


def plain(n=3, capacity=8):
    """Proportional with alpha 1 and eps 0: the probabilities are the priorities over their sum."""
    return buffer(perx.Proportional(alpha=1.0, eps=0.0), n, capacity)


def test_learning_progress_is_the_change_of_the_error_since_the_last_replay():
    buf = plain()
    prio = perx.Prioritizer(buf, LearningProgress())
    prio.update([0, 1], [2.0, -1.0])  # first replay: no earlier error, priority = |delta|
    np.testing.assert_array_equal(buf.priorities([0, 1]), [2.0, 1.0])
    prio.update([0, 1], [0.5, -3.0])  # |0.5 - 2| = 1.5 and |3 - 1| = 2
    np.testing.assert_array_equal(buf.priorities([0, 1]), [1.5, 2.0])
    # id 2 was never replayed and keeps the maximal priority it was added with, 1 (Alg. 1)
    np.testing.assert_allclose(buf.probabilities(), np.array([1.5, 2.0, 1.0]) / 4.5, rtol=1e-15)


def test_learning_progress_sign_rule_grows_while_signs_agree_and_shrinks_when_they_flip():
    buf = plain()
    prio = perx.Prioritizer(buf, LearningProgress(sign_rule=True, increase=2.0, decrease=0.5, bounds=(0.1, 5.0)))
    seen = []
    for td in [1.0, 3.0, 4.0, -5.0, 0.0, 7.0, 7.0, 7.0]:
        prio.update([0], [td])
        seen.append(buf.priorities([0])[0])
    # 1 (first), x2, x2, x0.5 (flip), x1 (zero), x1 (after a zero there is no sign to compare), x2, x2 -> capped
    assert seen == [1.0, 2.0, 4.0, 2.0, 2.0, 2.0, 4.0, 5.0]


def test_per_transition_state_does_not_survive_its_slot_being_reused():
    buf = plain(n=2, capacity=2)
    prio = perx.Prioritizer(buf, LearningProgress())
    prio.update([0], [3.0])
    buf.extend(**transitions(2, start=2))  # ids 2 and 3 overwrite slots 0 and 1
    prio.update([2], [4.0])
    assert buf.priorities([2])[0] == 4.0  # a first replay of id 2, not |4 - 3| from id 0's history
    assert prio.update([0], [9.0]) == 0  # a stale id is skipped, as by the buffer


def test_asymmetry_weights_positive_errors_more():
    buf = plain()
    prio = perx.Prioritizer(buf, Asymmetric(positive=3.0, negative=0.5))
    prio.update([0, 1, 2], [1.0, -1.0, 0.0])
    np.testing.assert_array_equal(buf.priorities([0, 1, 2]), [3.0, 0.5, 0.0])
    np.testing.assert_allclose(buf.probabilities(), [3 / 3.5, 0.5 / 3.5, 0.0])


def test_return_boost_adds_the_return_to_go():
    buf = plain()
    prio = perx.Prioritizer(buf, ReturnBoost(scale=2.0))
    prio.record_episode([0, 1, 2], [1.0, 0.0, 2.0], gamma=0.5)  # G = 1.5, 1.0, 2.0
    prio.update([0, 1, 2], [0.0, 0.25, -1.0])
    np.testing.assert_allclose(buf.priorities([0, 1, 2]), [3.0, 2.25, 5.0])


def test_return_boost_of_whole_episodes_and_negative_returns():
    buf = plain(n=5)
    prio = perx.Prioritizer(buf, ReturnBoost(scale=1.0, episode=True))
    prio.record_episode([0, 1, 2], [1.0, 0.0, 2.0])  # undiscounted episode return 3 for each step
    prio.record_episode([3, 4], [-1.0, -2.0])  # negative returns add nothing
    prio.update([0, 1, 2, 3, 4], [0.5, 0.5, 0.5, 0.5, 0.5])
    np.testing.assert_allclose(buf.priorities([0, 1, 2, 3, 4]), [3.5, 3.5, 3.5, 0.5, 0.5])


def test_rules_compose_in_order():
    buf = plain()
    prio = perx.Prioritizer(buf, Asymmetric(positive=2.0), ReturnBoost(scale=1.0))
    prio.record_episode([0, 1], [1.0, 1.0])  # G = 2, 1
    prio.update([0, 1], [1.0, -1.0])
    np.testing.assert_allclose(buf.priorities([0, 1]), [2.0 + 2.0, 1.0 + 1.0])


def test_the_samplers_priority_function_applies_last():
    buf = buffer(perx.LAP(alpha=1.0, kappa=1.0))  # max(|delta|, 1)
    prio = perx.Prioritizer(buf, Asymmetric(positive=3.0))
    prio.update([0, 1], [0.5, 0.2])
    np.testing.assert_allclose(buf.priorities([0, 1]), [1.5, 1.0])
    np.testing.assert_allclose(prio.compute([0, 1], [0.5, 0.2]), [1.5, 1.0])


def test_staleness_orders_by_error_plus_time_since_last_replay():
    # brute force: after updates at clock times t_i, the rank order must be that of e_i + rate * (t - t_i)
    rng = np.random.default_rng(0)
    buf = buffer(perx.RankBased(alpha=0.7, exact=True), n=12, capacity=12)
    rate = 0.3
    prio = perx.Prioritizer(buf, Staleness(rate, horizon=1000))
    last = {}
    for _ in range(40):
        ids = rng.choice(12, size=3, replace=False)
        td = rng.standard_normal(3) * 2
        for i, d in zip(ids.tolist(), td.tolist(), strict=True):
            last[i] = (abs(d), prio.clock)
        prio.update(ids, td)
    t = prio.clock
    replayed = sorted(last)
    bonus = {i: last[i][0] + rate * (t - last[i][1]) for i in replayed}
    ranks = buf.sampler.ranks(np.array(replayed))
    assert [replayed[j] for j in np.argsort(ranks)] == sorted(replayed, key=lambda i: -bonus[i])


def test_staleness_target_copy_advances_the_clock_by_the_updates_since_the_last_copy():
    buf = buffer(perx.RankBased(alpha=0.7), n=4)
    prio = perx.Prioritizer(buf, Staleness(1.0, horizon=100, target_bonus=2.0))
    for _ in range(3):
        prio.update([0], [1.0])
    assert prio.clock == 3
    prio.target_updated()
    assert prio.clock == 3 + 2 * 3
    prio.target_updated()
    assert prio.clock == 9  # no updates in between: no bonus
    assert buf.priorities([0])[0] == 1.0 + 1.0 * (100 - 2)  # written at clock 2


def test_staleness_refuses_proportional_sampling():
    with pytest.raises(ValueError, match="order-based"):
        perx.Prioritizer(plain(), Staleness(0.1))


def test_staleness_past_its_horizon_is_an_error_not_a_wrong_order():
    buf = buffer(perx.Greedy(), n=2)
    prio = perx.Prioritizer(buf, Staleness(1.0, horizon=3))
    prio.update([0], [1.0])
    prio.update([0], [1.0])
    prio.target_updated()  # clock 2 + 2
    with pytest.raises(ValueError, match="horizon"):
        prio.update([0], [1.0])
    assert buf.priorities([0])[0] == 1.0 + (3 - 1)  # the refused update wrote nothing


def test_predecessor_boost_adds_the_error_to_the_previous_step_unless_it_ended_an_episode():
    buf = perx.ReplayBuffer(8, perx.Proportional(alpha=1.0, eps=0.0), seed=0)
    for k in range(5):  # one stream; the step with id 2 terminates its episode
        buf.add(obs=[k], action=0, reward=0.0, next_obs=[k + 1], terminated=k == 2, truncated=False)
    np.testing.assert_array_equal(buf.predecessors([0, 1, 2, 3, 4]), [-1, 0, 1, -1, 3])
    prio = perx.Prioritizer(buf, PredecessorBoost(fraction=0.5))
    buf.set_priorities([0, 1, 2, 3, 4], [1.0, 1.0, 1.0, 1.0, 1.0])
    prio.update([1, 3, 4, 4], [2.0, -4.0, 1.0, 1.0])
    # id 1 -> pred 0 gets 0.5*2; id 3 starts an episode (pred 2 terminated): nothing;
    # id 4 twice -> pred 3, whose own new priority is 4, gets 0.5*1 twice
    np.testing.assert_allclose(buf.priorities([0, 1, 2, 3, 4]), [2.0, 2.0, 1.0, 5.0, 1.0])


def test_predecessors_follow_each_stream_and_never_point_at_an_overwritten_slot(tmp_path):
    rng = np.random.default_rng(5)
    streams, capacity = 3, 20
    buf = perx.ReplayBuffer(capacity, episodes=perx.Episodes(streams=streams, check=False), seed=0)
    expected = {}  # id -> predecessor id or -1
    last = [-1] * streams  # newest id of each stream if its episode goes on
    for _ in range(15):  # batches of steps from random streams, wrapping the buffer several times
        rows = int(rng.integers(1, 6))
        e = rng.integers(0, streams, rows)
        ended = rng.random(rows) < 0.25
        first = buf.next_index
        buf.extend(obs=rng.standard_normal((rows, 2)), action=np.zeros(rows, np.int64), reward=np.zeros(rows),
                   next_obs=rng.standard_normal((rows, 2)), terminated=ended, truncated=np.zeros(rows, bool),
                   stream=e)
        for j in range(rows):
            expected[first + j] = last[e[j]]
            last[e[j]] = -1 if ended[j] else first + j
        live = np.arange(max(0, buf.next_index - capacity), buf.next_index)
        oldest = live[0]
        want = [expected[i] if expected[i] >= oldest else -1 for i in live.tolist()]
        np.testing.assert_array_equal(buf.predecessors(live), want)
    buf.save(tmp_path / "e.perx")  # the links are rebuilt from the saved successors
    np.testing.assert_array_equal(perx.ReplayBuffer.load(tmp_path / "e.perx").predecessors(live), want)


def test_predecessor_boost_skips_a_predecessor_not_yet_replayed_by_a_heap_sampler():
    buf = perx.ReplayBuffer(8, perx.RankBased(alpha=0.7), seed=0)
    buf.extend(**{k: v for k, v in transitions(3).items()})
    buf.extend(obs=np.zeros((2, 3), np.float32), action=np.zeros(2, np.int64), reward=np.zeros(2, np.float32),
               next_obs=np.zeros((2, 3), np.float32), terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
    prio = perx.Prioritizer(buf, PredecessorBoost())
    prio.update([4], [1.0])
    assert buf.priorities([3])[0] == np.inf  # still above every replayed transition


def test_bad_input_changes_nothing():
    buf = plain()
    prio = perx.Prioritizer(buf, LearningProgress(), PredecessorBoost())
    prio.update([0, 1], [1.0, 2.0])
    before, state = snapshot(buf), prio.state_dict()
    saved = [{k: v.copy() for k, v in r.items()} for r in state["rules"]]
    for ids, td in [([0, 1], [1.0, np.nan]), ([0, 7], [1.0, 1.0]), ([0], [1.0, 2.0]), ([0], [1e310])]:
        with pytest.raises((ValueError, TypeError)):
            prio.update(ids, td)
    assert_same(before, snapshot(buf))
    assert prio.clock == 1
    for a, b in zip(saved, prio.state_dict()["rules"], strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_state_round_trips_and_a_bad_state_is_refused():
    buf = plain()
    prio = perx.Prioritizer(buf, LearningProgress(sign_rule=True), ReturnBoost())
    prio.record_episode([0, 1, 2], [1.0, 1.0, 1.0])
    prio.update([0, 1], [1.0, -2.0])
    twin = perx.Prioritizer(plain(), LearningProgress(sign_rule=True), ReturnBoost())
    twin.load_state_dict(prio.state_dict())
    np.testing.assert_array_equal(prio.compute([0, 1], [3.0, 1.0]), twin.compute([0, 1], [3.0, 1.0]))
    bad = prio.state_dict()
    bad["rules"][1] = {"owner": np.zeros(3, np.int64), "bonus": np.zeros(8)}
    fresh = perx.Prioritizer(plain(), LearningProgress(sign_rule=True), ReturnBoost())
    with pytest.raises(ValueError, match="owner"):
        fresh.load_state_dict(bad)
    assert (fresh.rules[0].state_dict()["owner"] == -1).all()  # the first rule was not half-loaded


@pytest.mark.parametrize(("make", "match"), [
    (lambda: LearningProgress(increase=0.5), "increase"),
    (lambda: LearningProgress(decrease=0.0), "decrease"),
    (lambda: LearningProgress(bounds=(2.0, 1.0)), "bounds"),
    (lambda: Asymmetric(positive=-1.0), "positive"),
    (lambda: ReturnBoost(scale=np.nan), "scale"),
    (lambda: Staleness(0.0), "rate"),
    (lambda: PredecessorBoost(fraction=-1), "fraction"),
])
def test_bad_rule_arguments_name_the_argument(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_works_with_a_hybrid_sampler():
    buf = buffer(perx.Hybrid([perx.Proportional(alpha=1.0, eps=0.0), perx.Uniform()], [0.5, 0.5]))
    prio = perx.Prioritizer(buf, Asymmetric(positive=2.0))
    prio.update([0, 1, 2], [1.0, -1.0, 1.0])
    np.testing.assert_allclose(buf.priorities([0, 1, 2]), [2.0, 1.0, 2.0])
    np.testing.assert_allclose(buf.probabilities(), 0.5 * np.array([2, 1, 2]) / 5 + 0.5 / 3)


def test_a_hybrid_applies_each_components_own_priority_function():
    def make():
        buf = perx.ReplayBuffer(4, perx.Hybrid([perx.LAP(alpha=0.4, kappa=1.0), perx.Uniform()], [0.5, 0.5]), seed=0)
        return buf, buf.extend(x=np.zeros(4))

    plain_buf, ids = make()
    plain_buf.update_priorities(ids, [0.1, 0.2, 0.0, 3.0])
    buf, _ = make()
    perx.Prioritizer(buf).update(ids, [0.1, 0.2, 0.0, 3.0])
    np.testing.assert_array_equal(buf.priorities(ids), plain_buf.priorities(ids))  # [1, 1, 1, 3]: LAP's floor


def test_a_predecessor_boost_that_would_overflow_is_refused_before_anything_changes():
    buf = perx.ReplayBuffer(4, perx.RankBased(), seed=0)
    ids = buf.extend(x=np.zeros(4), terminated=np.zeros(4, bool), truncated=np.zeros(4, bool))
    prio = perx.Prioritizer(buf, LearningProgress(), PredecessorBoost())
    prio.update(ids[:1], [1e308])
    before, state = snapshot(buf), prio.state_dict()
    owner = state["rules"][0]["owner"].copy()
    with pytest.raises(ValueError, match="td_errors"):
        prio.update(ids[1:2], [1e308])  # its predecessor (id 0) would reach 2e308 = inf
    assert_same(before, snapshot(buf))
    np.testing.assert_array_equal(prio.state_dict()["rules"][0]["owner"], owner)
    assert prio.clock == 1


@pytest.mark.parametrize(("sampler", "rules", "match"), [
    (lambda: perx.RankBased(), lambda: [Staleness(1.0), Asymmetric(2.0)], "last"),
    (lambda: perx.RankBased(), lambda: [Staleness(1.0), LearningProgress()], "last"),
    (lambda: perx.Proportional(), lambda: [PredecessorBoost(0.5), PredecessorBoost(0.5)], "at most one"),
    (lambda: perx.Uniform(), lambda: [PredecessorBoost()], "Uniform"),
    (lambda: perx.Hybrid([perx.Proportional(), perx.Uniform()], [0.5, 0.5]), lambda: [PredecessorBoost()], "Hybrid"),
])
def test_rule_combinations_that_cannot_work_are_refused(sampler, rules, match):
    with pytest.raises(ValueError, match=match):
        perx.Prioritizer(buffer(sampler()), *rules())


def test_staleness_followed_only_by_the_predecessor_boost_is_allowed():
    buf = buffer(perx.RankBased(), n=3)
    perx.Prioritizer(buf, Asymmetric(2.0), Staleness(1.0), PredecessorBoost())
