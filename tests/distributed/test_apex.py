"""Ape-X pieces: the exploration schedule, n-step transitions, and a short run on CartPole with faults."""

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")
ray = pytest.importorskip("ray")

from perx.distributed.apex import (  # noqa: E402
    ApexActor,
    ApexConfig,
    NStep,
    actor_epsilon,
    build_network,
    evaluate,
    push_shard,
    train,
)


def test_actor_epsilons_follow_apex_schedule():
    eps = [actor_epsilon(i, 8) for i in range(8)]
    np.testing.assert_allclose(eps, 0.4 ** (1 + 7 * np.arange(8) / 7))
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert actor_epsilon(0, 1) == 0.4


def test_nstep_returns_and_discounts_inside_an_episode():
    ns = NStep(3, 0.5)
    assert ns.step("s0", 0, 1.0, "s1", False, False) == []
    assert ns.step("s1", 1, 2.0, "s2", False, False) == []
    (t,) = ns.step("s2", 0, 4.0, "s3", False, False)
    assert t == ("s0", 0, 1.0 + 0.5 * 2.0 + 0.25 * 4.0, 0.125, "s3")


def test_nstep_termination_stops_bootstrapping_for_every_window():
    ns = NStep(3, 0.5)
    ns.step("s0", 0, 1.0, "s1", False, False)
    out = ns.step("s1", 1, 2.0, "s2", True, False)
    assert out == [("s0", 0, 2.0, 0.0, "s2"), ("s1", 1, 2.0, 0.0, "s2")]
    assert not ns.window


def test_nstep_truncation_bootstraps_from_the_last_observation():
    ns = NStep(2, 0.5)
    ns.step("s0", 0, 1.0, "s1", False, False)
    ns.step("s1", 1, 1.0, "s2", False, False)  # emits s0's window
    out = ns.step("s2", 0, 1.0, "s3", False, True)
    assert out == [("s1", 1, 1.5, 0.25, "s3"), ("s2", 0, 1.0, 0.5, "s3")]


@pytest.mark.parametrize(("field", "value"), [
    ("learning_starts", 0), ("learning_starts", -5), ("learning_starts", 1.5), ("replay_ratio", float("nan")),
    ("replay_ratio", float("inf")), ("replay_ratio", -1.0), ("replay_ratio", True), ("seed", -1),
    ("alpha", -0.5), ("beta0", 1.5), ("kappa", 0.0), ("gamma", 1.5), ("learning_rate", 0.0), ("eps_base", 2.0),
    ("eps_alpha", float("nan")), ("eval_epsilon", -0.1), ("eval_max_steps", 0), ("max_episode_steps", 0),
    ("checkpoint_every", -1), ("actor_cpus", -1.0), ("shard_cpus", float("inf")), ("num_shards", 2000),
    ("capacity", 1), ("hidden", 0), ("env_id", 3), ("device", None)])
def test_config_refuses_a_value_no_run_can_use(field, value):
    # learning_starts=0 with replay_ratio=0 sampled the empty replay; the others fail later, or silently
    with pytest.raises(ValueError, match=rf"{field}: .*got {value!r}"):
        ApexConfig(**{field: value})


@pytest.mark.parametrize(("num_actors", "num_shards"), [(1, 3), (2, 3), (2, 4), (3, 2), (4, 2), (3, 7), (5, 5)])
def test_pushes_give_every_shard_the_same_share(num_actors, num_shards):
    # one round per actor and push, num_shards / gcd rounds: the actors together cycle through every shard
    rounds = num_shards // np.gcd(num_actors, num_shards)
    shards = [push_shard(i, j, num_actors, num_shards) for i in range(num_actors) for j in range(rounds)]
    counts = np.bincount(shards, minlength=num_shards)
    assert len(counts) == num_shards and (counts == counts[0]).all()
    if num_actors % num_shards == 0:  # the assignment before: actor i always writes to shard i mod K
        assert all(push_shard(i, j, num_actors, num_shards) == i % num_shards
                   for i in range(num_actors) for j in range(rounds + 2))


def test_one_actor_fills_every_shard(ray_cluster):
    # with fewer actors than shards, a fixed shard per actor left some shards empty (learning might never start)
    cfg = ApexConfig(num_actors=1, num_shards=3, push_size=4, capacity=30, learning_starts=10)
    pushed = []

    def shard(k):
        return SimpleNamespace(add=SimpleNamespace(remote=lambda data, td: pushed.append(k) or ray.put(None)))

    actor = ApexActor(cfg, 0, [shard(k) for k in range(3)])
    actor.collect(40)
    assert len(pushed) >= 6 and pushed == [j % 3 for j in range(len(pushed))]


def test_apex_cartpole_improves_and_survives_a_killed_shard_and_actor(ray_cluster, tmp_path):
    # seed 1: its untrained network scores ~9 (seed 0's happens to score 83); at replay ratio 32 CartPole
    # reached 150-210 by 8k steps in each of 6 runs measured (seeds 0-2, two target periods)
    cfg = ApexConfig(total_steps=8_000, num_actors=2, num_shards=2, learning_starts=500, eval_every=4_000,
                     eval_episodes=5, checkpoint_every=500, actor_cpus=0.0, seed=1)
    untrained = evaluate(cfg, build_network(cfg, (4,), 2))
    rows = train(cfg, tmp_path, progress=False, log=None, kill_shard_at=2_000, kill_actor_at=3_000)
    last = rows[-1]
    assert last["step"] >= 8_000 and last["updates"] > 3_000
    assert last["shard_restarts"] >= 1 and last["actor_restarts"] >= 1
    assert last["eval_return"] >= max(60.0, untrained + 30.0), (untrained, [r["eval_return"] for r in rows])
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[:3] == ["step", "episodes", "eval_return"]
    assert (tmp_path / "config.json").exists()
