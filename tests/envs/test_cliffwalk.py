"""The Blind Cliffwalk environment, its ground truth and the replay memory of 000 App. B.1."""

import numpy as np
import pytest

from perx.envs import BlindCliffwalk


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 12])
def test_memory_holds_all_sequences_and_one_reward(n):
    m = BlindCliffwalk(n, seed=0).replay_memory()
    assert len(m["obs"]) == 2 ** (n + 1) - 2
    assert m["reward"].sum() == 1.0 and (m["reward"] > 0).sum() == 1
    assert not m["truncated"].any()
    # each (s, a) appears once per sequence that reaches s and then plays a: 2^(n - s - 1) times
    counts = np.bincount(m["obs"] * 2 + m["action"], minlength=2 * n)
    np.testing.assert_array_equal(counts, np.repeat(2 ** (n - np.arange(n) - 1), 2))


def test_memory_transitions_follow_the_dynamics():
    env = BlindCliffwalk(6, seed=3)
    m = env.replay_memory()
    right = m["action"] == m["obs"] % 2
    assert (m["terminated"] == (~right | (m["obs"] == 5))).all()
    assert (m["next_obs"][right & ~m["terminated"]] == m["obs"][right & ~m["terminated"]] + 1).all()
    assert (m["reward"] == (right & (m["obs"] == 5))).all()
    # episodes start at state 0 and each sequence's transitions are consecutive states
    starts = np.flatnonzero(m["obs"] == 0)
    assert starts[0] == 0 and len(starts) == 2**6


def test_memory_order_is_random_but_seeded():
    a = BlindCliffwalk(5, seed=1).replay_memory()
    b = BlindCliffwalk(5, seed=1).replay_memory()
    c = BlindCliffwalk(5, seed=2).replay_memory()
    np.testing.assert_array_equal(a["obs"], b["obs"])
    assert not np.array_equal(a["action"], c["action"])


def test_ground_truth_q_values():
    env = BlindCliffwalk(4)
    g = 1 - 1 / 4
    expected = np.array([[g**3, 0], [0, g**2], [g, 0], [0, 1.0]])
    np.testing.assert_allclose(env.q_star(), expected)
    # Bellman: Q*(s, right) = gamma * max Q*(s+1), Q*(last, right) = 1, Q*(s, wrong) = 0
    q = env.q_star()
    for s in range(3):
        assert q[s, s % 2] == pytest.approx(g * q[s + 1].max())


def test_step_right_moves_wrong_terminates_last_right_pays():
    env = BlindCliffwalk(3)
    env.reset()
    assert env.step(0) == (1, 0.0, False, False, {})
    assert env.step(0) == (1, 0.0, True, False, {})  # wrong in state 1 (right is 1)
    env.reset()
    env.step(0)
    env.step(1)
    assert env.step(0) == (2, 1.0, True, False, {})


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_bad_chain_length_is_refused(n):
    with pytest.raises(ValueError, match="n"):
        BlindCliffwalk(n)
