"""Double DQN with perx replay: targets, losses, priorities, lockstep runs, checkpoints."""

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

import perx  # noqa: E402
import perx.torch as pt  # noqa: E402
from perx.agents import dqn, stacked  # noqa: E402
from perx.agents.dqn import DQNConfig  # noqa: E402

SMALL = dict(total_steps=400, learning_starts=100, eval_every=200, eval_episodes=2, capacity=1000, batch_size=16,
             target_update=20, eval_max_steps=200)


def cartpole(**kw):
    return DQNConfig(env_id="CartPole-v1", **{**SMALL, **kw})


@pytest.mark.parametrize("env_id", ["CartPole-v1", "MinAtar/Breakout-v0"])
def test_every_variant_runs_a_few_hundred_steps(env_id):
    pytest.importorskip("minatar") if env_id.startswith("MinAtar") else None
    configs = [DQNConfig(env_id=env_id, variant=v, seed=i, **SMALL) for i, v in enumerate(dqn.VARIANTS)]
    rows = dqn.train(configs)
    for run in rows:
        assert [r["step"] for r in run] == [200, 400]
        assert np.isfinite(run[-1]["loss"]) and np.isfinite(run[-1]["eval_return"])


def tiny_runs(variant="per", **kw):
    runs = dqn.Runs([cartpole(variant=variant, **kw)])
    runs.start()
    for _ in range(120):  # fill the buffer with random steps
        runs.obs, *_ = runs.recorder.step(runs.act(runs.obs, 1.0))
        runs.step += 1
    return runs


def test_double_dqn_target_matches_a_hand_computation():
    net = stacked.StackedNet(lambda: torch.nn.Sequential(torch.nn.Linear(2, 2)), [0])
    target = stacked.StackedNet(lambda: torch.nn.Sequential(torch.nn.Linear(2, 2)), [1])
    # weights in torch.nn's [out, in] layout; off-diagonal terms so that a transposed layout would show
    net.load_run_state(0, {"layers.0.weight": torch.tensor([[1.0, 0.0], [0.5, 2.0]]),  # Q(s) = (s0, s0/2 + 2 s1)
                           "layers.0.bias": torch.zeros(2)})
    target.load_run_state(0, {"layers.0.weight": torch.tensor([[3.0, 0.0], [1.0, 5.0]]),  # Qt = (3 s0, s0 + 5 s1)
                              "layers.0.bias": torch.tensor([0.5, -0.5])})
    s2 = torch.tensor([[[1.0, 1.0], [4.0, 0.5]]])  # online: (1, 2.5) -> action 1; (4, 3) -> action 0
    y = dqn.double_dqn_target(net, target, s2, torch.tensor([[1.0, 2.0]]), torch.tensor([[0.9, 0.0]]))
    # row 0: 1 + 0.9 * Qt(s2)[1] = 1 + 0.9 * (1 + 5 - 0.5); row 1: terminated, discount 0: just 2
    np.testing.assert_allclose(y.numpy(), [[1 + 0.9 * 5.5, 2.0]], rtol=1e-6)


def test_terminated_stops_bootstrapping_and_truncated_does_not():
    buf = perx.ReplayBuffer(10, episodes=perx.Episodes(gamma=0.9))
    o = np.zeros(2, np.float32)
    buf.add(obs=o, next_obs=o + 1, action=0, reward=1.0, terminated=True, truncated=False)
    buf.add(obs=o + 5, next_obs=o + 6, action=0, reward=1.0, terminated=False, truncated=True)
    batch = buf.get([0, 1])
    assert batch["discount"].tolist() == [0.0, 0.9]  # the agent's target is return + discount * value


@pytest.mark.parametrize("variant", ["per", "rank", "lap"])
def test_update_uses_is_weights_and_writes_abs_delta_for_the_sampled_ids(variant):
    runs = tiny_runs(variant)
    for _ in range(3):
        runs.update()  # so that priorities differ and IS weights are not all 1
    buf = runs.buffers[0]
    seen = {}
    sample, update = buf.sample, buf.update_priorities

    def record_sample(*a, **k):
        seen["batch"] = sample(*a, **k)
        return seen["batch"]

    def record_update(ids, td):
        seen["ids"], seen["td"] = np.asarray(ids).copy(), np.asarray(td).copy()
        return update(ids, td)

    buf.sample, buf.update_priorities = record_sample, record_update
    q_before = {k: v.clone() for k, v in runs.q.state_dict().items()}
    loss = runs.update()
    batch = seen["batch"]
    np.testing.assert_array_equal(seen["ids"], batch.indices)  # exactly the sampled ids
    # recompute delta with the networks as they were before the step
    net = stacked.StackedNet(lambda: stacked.mlp(4, 2), [0])
    net.load_state_dict(q_before)
    obs = torch.as_tensor(batch["obs"], dtype=torch.float32)[None]
    nxt = torch.as_tensor(batch["next_obs"], dtype=torch.float32)[None]
    y = dqn.double_dqn_target(net, runs.target, nxt, torch.as_tensor(batch["return"], dtype=torch.float32)[None],
                              torch.as_tensor(batch["discount"], dtype=torch.float32)[None])
    with torch.no_grad():
        q = net(obs)[0].gather(-1, torch.as_tensor(batch["action"]).long()[:, None])[:, 0]
    delta = (q - y[0]).numpy()
    np.testing.assert_allclose(seen["td"], delta, rtol=1e-5, atol=1e-6)
    kappa = runs.kappa.item()
    weights = torch.as_tensor(batch.weights, dtype=torch.float32)
    expected = pt.huber(torch.as_tensor(delta), kappa=kappa, weights=weights).item()
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    if variant in ("per", "rank"):
        assert weights.min() < 1.0  # the IS weights were not all 1: they mattered
    else:
        assert (weights == 1).all()  # LAP: no IS weights


def test_pal_loss_equals_perx_torch_pal():
    delta = torch.tensor([[0.001, -0.5, 3.0, 0.02]])
    got = dqn.variant_loss(delta, torch.ones_like(delta), torch.tensor([0.01]), torch.tensor([0.6]),
                           torch.tensor([True]))
    assert got.item() == pytest.approx(pt.pal(delta[0], alpha=0.6, kappa=0.01).item(), rel=1e-6)


def test_lockstep_runs_equal_the_same_runs_one_by_one():
    configs = [cartpole(variant="per", seed=0), cartpole(variant="pal", seed=1)]
    together, alone = {0: [], 1: []}, {0: [], 1: []}
    dqn.train(configs, on_update=lambda step, losses: [together[r].append(losses[r]) for r in range(2)])
    for r, cfg in enumerate(configs):
        dqn.train(cfg, on_update=lambda step, losses, r=r: alone[r].append(losses[0]))
    for r in range(2):
        # same data, same random numbers; only the batched kernels' rounding may differ
        np.testing.assert_allclose(together[r], alone[r], rtol=1e-4, atol=1e-6)


def test_resuming_from_a_checkpoint_continues_exactly(tmp_path):
    configs = [cartpole(variant="per", seed=0), cartpole(variant="lap", seed=1)]
    full_losses, resumed_losses = [], []
    full = dqn.train(configs, [tmp_path / "full0", tmp_path / "full1"],
                     on_update=lambda s, losses: full_losses.append((s, losses.copy())))
    dirs = [tmp_path / "cut0", tmp_path / "cut1"]
    dqn.train(configs, dirs, stop_after=200)  # interrupted right after the checkpoint at step 200
    assert not (dirs[0] / "done").exists()
    resumed = dqn.train(configs, dirs, on_update=lambda s, losses: resumed_losses.append((s, losses.copy())))
    after = [(s, losses) for s, losses in full_losses if s > 200]
    assert len(after) == len(resumed_losses) > 0
    for (s1, l1), (s2, l2) in zip(after, resumed_losses, strict=True):
        assert s1 == s2
        np.testing.assert_array_equal(l1, l2)  # bit for bit
    for a, b in zip(full, resumed, strict=True):
        assert [{k: v for k, v in r.items() if k != "steps_per_second"} for r in a] == \
               [{k: v for k, v in r.items() if k != "steps_per_second"} for r in b]
    assert (dirs[0] / "done").exists() and (dirs[0] / "metrics.csv").exists()


@pytest.mark.slow
def test_atari_pipeline_runs_with_frames_stored_once():
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    cfg = DQNConfig(env_id="ALE/Pong-v5", variant="per", total_steps=300, learning_starts=200, eval_every=300,
                    eval_episodes=1, eval_max_steps=100, capacity=1000, batch_size=8, train_frequency=50)
    runs = dqn.Runs([cfg])
    runs.start()
    assert runs.obs.shape == (1, 4, 84, 84) and runs.obs.dtype == np.uint8
    rows = dqn.train(cfg)
    assert rows[0][-1]["step"] == 300


def test_frame_stacks_are_stored_once_for_atari_shaped_observations():
    cfg = perx.Episodes(frame_stack=4)
    assert cfg.next_obs == "shared"  # stacks imply one frame per step


def test_checkpoints_of_a_group_at_different_steps_are_refused(tmp_path):
    configs = [cartpole(variant="per", seed=0), cartpole(variant="lap", seed=1)]
    dirs = [tmp_path / "a", tmp_path / "b"]
    dqn.train(configs, dirs, stop_after=200)
    dqn.train(configs[:1], dirs[:1], stop_after=400)  # run a alone moves on: the group no longer agrees
    with pytest.raises(ValueError, match="different steps"):
        dqn.train(configs, dirs)


def test_a_sampler_passed_in_gets_the_priorities_whatever_the_variant():
    runs = dqn.Runs([cartpole(variant="uniform")], samplers=[perx.Proportional()])
    assert runs.writes_priorities == [True]


@pytest.mark.slow
def test_atari_evaluation_cap_counts_agent_steps():
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    from perx.agents.envs import make_env

    env = make_env("ALE/Pong-v5", max_episode_steps=40)
    env.reset(seed=0)
    steps, done = 0, False
    while not done:
        _, _, term, trunc, _ = env.step(0)
        steps += 1
        done = term or trunc
    assert steps == 40


def test_priority_rules_are_built_per_run_and_resume_exactly(tmp_path):
    """An App. A rule (perx.priorities) in the agent: its state is checkpointed, so a resumed run continues
    bit for bit."""
    configs = [cartpole(variant="per", seed=0, priority_rule="learning-progress"),
               cartpole(variant="per", seed=0, priority_rule="predecessor")]
    full_losses, resumed_losses = [], []
    dqn.train(configs, [tmp_path / "f0", tmp_path / "f1"],
              on_update=lambda s, losses: full_losses.append((s, losses.copy())))
    dirs = [tmp_path / "c0", tmp_path / "c1"]
    dqn.train(configs, dirs, stop_after=200)
    dqn.train(configs, dirs, on_update=lambda s, losses: resumed_losses.append((s, losses.copy())))
    after = [(s, losses) for s, losses in full_losses if s > 200]
    assert len(after) == len(resumed_losses) > 0
    for (s1, l1), (s2, l2) in zip(after, resumed_losses, strict=True):
        assert s1 == s2
        np.testing.assert_array_equal(l1, l2)
    plain = dqn.Runs([cartpole(variant="per", seed=0)])
    ruled = dqn.Runs([cartpole(variant="per", seed=0, priority_rule="learning-progress")])
    assert plain.prioritizers == [None] and isinstance(ruled.prioritizers[0], perx.Prioritizer)
    with pytest.raises(ValueError, match="priority_rule"):
        dqn.Runs([cartpole(variant="per", priority_rule="nonsense")])


def test_return_boost_records_each_finished_episode_with_its_returns_to_go():
    runs = dqn.Runs([cartpole(variant="per", seed=0, priority_rule="return-boost"), cartpole(variant="per", seed=1)])
    runs.start()
    ended_steps = 0
    for _ in range(120):
        runs.env_step(np.array([runs.rngs[r].integers(2) for r in range(2)]))
        if not runs.episode_ids[0]:
            ended_steps = runs.step  # every step so far belongs to a finished episode
    assert ended_steps > 0
    boost = runs.prioritizers[0].rules[0]
    recorded = np.flatnonzero(boost._bonus)
    # CartPole pays 1 per step: each recorded step's bonus is 0.1 x its discounted return-to-go (> 0)
    assert len(recorded) == ended_steps and runs.prioritizers[1] is None
    assert (boost._bonus[recorded] >= 0.1 - 1e-12).all()
    assert boost._bonus[recorded].max() > 0.1  # an episode's first steps have more than one reward to go


def test_staleness_runs_with_rank_and_is_refused_with_proportional():
    dqn.train([cartpole(variant="rank", seed=0, priority_rule="staleness", total_steps=300)], None, progress=False)
    with pytest.raises(ValueError, match=r"[Ss]taleness"):
        dqn.Runs([cartpole(variant="per", priority_rule="staleness")])


def test_return_boost_resumes_exactly(tmp_path):
    cfg = [cartpole(variant="per", seed=0, priority_rule="return-boost")]
    full, resumed = [], []
    dqn.train(cfg, [tmp_path / "f"], on_update=lambda s, losses: full.append((s, losses.copy())))
    dqn.train(cfg, [tmp_path / "c"], stop_after=200)
    dqn.train(cfg, [tmp_path / "c"], on_update=lambda s, losses: resumed.append((s, losses.copy())))
    after = [(s, x) for s, x in full if s > 200]
    assert len(after) == len(resumed) > 0
    for (s1, l1), (s2, l2) in zip(after, resumed, strict=True):
        assert s1 == s2
        np.testing.assert_array_equal(l1, l2)


def test_study_labels_carry_the_priority_rule(tmp_path):
    from perx.experiments import study

    spec = {"envs": ["CartPole-v1"], "variants": ["per", "per+asymmetric"], "seeds": [0],
            "config": {"total_steps": 10}}
    (group,) = study.grid(spec)
    assert [study.label(c) for c in group] == ["per", "per+asymmetric"]
    assert group[1].variant == "per" and group[1].priority_rule == "asymmetric"


def test_study_grid_seed_order_makes_each_group_a_complete_comparison():
    from perx.experiments import study

    spec = {"envs": ["CartPole-v1"], "variants": ["uniform", "per", "lap"], "seeds": [0, 1, 2, 3],
            "order": "seeds", "group": 6, "config": {"total_steps": 10}}
    groups = study.grid(spec)
    assert [[(study.label(c), c.seed) for c in g] for g in groups] == [
        [(v, s) for s in (0, 1) for v in ("uniform", "per", "lap")],
        [(v, s) for s in (2, 3) for v in ("uniform", "per", "lap")]]
    spec["order"] = "random"
    with pytest.raises(SystemExit, match="order"):
        study.grid(spec)


def test_study_spec_accepts_rule_variants_and_refuses_unknown_rules(tmp_path):
    import argparse

    from perx.experiments import study

    def spec(variants):
        args = argparse.Namespace(config=None, agent=None, envs=["CartPole-v1"], variants=variants, seeds=1,
                                  steps=10, group=None, set=[])
        return study.study_spec(args)

    assert spec(["per", "per+predecessor"])["variants"] == ["per", "per+predecessor"]
    with pytest.raises(SystemExit, match="priority rules"):
        spec(["per+nonsense"])
    with pytest.raises(SystemExit, match="unknown"):
        spec(["nonsense+asymmetric"])


def test_paired_table_counts_seeds_and_gives_the_exact_wilcoxon_p():
    from perx.experiments.study import _paired_lines

    finals = {"E": {"uniform": {s: 1.0 + 0.1 * s for s in range(6)},
                    "per": {s: 2.0 + 0.1 * s for s in range(6)},
                    "lap": {s: 2.0 + 0.1 * s + (0.01 if s % 2 else -0.01) * (s + 1) for s in range(6)}}}
    lines = _paired_lines(finals, ["E"], ["uniform", "per", "lap"])
    # per beats uniform on all 6 seeds: the exact two-sided signed-rank p is 2 / 2^6; Holm over the table's
    # 2 tests (per and lap vs uniform, both p = 1/32): each doubled
    assert "| E | - | 6/6, p = 0.031 (Holm 0.062) |" in lines[3]
    vs_per = lines[-1]
    assert vs_per.startswith("| E | 0/6, p = 0.031 (Holm 0.062) | - | 3/6,")
    too_few = {"E": {"uniform": {0: 1.0}, "per": {0: 2.0}}}
    assert _paired_lines(too_few, ["E"], ["uniform", "per"]) == []  # no table of dashes


class Killed(Exception):
    """Stands for the process being killed at a point of a checkpoint save."""


def test_a_group_checkpoint_killed_at_any_point_of_its_save_resumes_bit_for_bit(tmp_path, monkeypatch):
    from perx.agents import runner

    kw = dict(total_steps=300, learning_starts=40, eval_every=100, eval_episodes=1, eval_max_steps=30,
              capacity=500, batch_size=8, target_update=10)
    configs = [cartpole(variant="per", seed=0, **kw), cartpole(variant="lap", seed=1, **kw)]
    full: dict[int, np.ndarray] = {}
    points: list[tuple[str, int]] = []
    monkeypatch.setattr(runner, "_fault_point", lambda stage, r: points.append((stage, r)))
    dqn.train(configs, [tmp_path / "full0", tmp_path / "full1"],
              on_update=lambda s, losses: full.update({s: losses.copy()}))
    per_save = len(points) // 3  # saves at steps 100, 200 and 300
    assert per_save == 8 and points[:per_save] == [
        (stage, r) for r in (0, 1) for stage in ("buffer", "state written", "state renamed")] + [
        ("cleanup", 0), ("cleanup", 1)]
    resumed_from = set()
    for k in range(per_save):  # kill the save at step 200 at its k-th point
        dirs = [tmp_path / f"k{k}" / "a", tmp_path / f"k{k}" / "b"]
        monkeypatch.setattr(runner, "_fault_point", lambda stage, r: None)
        dqn.train(configs, dirs, stop_after=100)
        calls = iter(range(per_save))

        def kill(stage, r, k=k, calls=calls):
            if next(calls) == k:
                raise Killed

        monkeypatch.setattr(runner, "_fault_point", kill)
        with pytest.raises(Killed):
            dqn.train(configs, dirs)
        monkeypatch.setattr(runner, "_fault_point", lambda stage, r: None)
        after: dict[int, np.ndarray] = {}
        rows = dqn.train(configs, dirs, on_update=lambda s, losses, after=after: after.update({s: losses.copy()}))
        start = min(after)
        resumed_from.add(start)
        assert set(after) == {s for s in full if s >= start}
        for s in after:
            np.testing.assert_array_equal(after[s], full[s])  # bit for bit
        assert [r["step"] for r in rows[0]] == [100, 200, 300]
        # the last checkpoint is the only one left: a single generation per run
        for d in dirs:
            assert sorted(p.name for p in (d / "checkpoint").iterdir()) == ["buffer-300.npz", "state-300.pt"]
    # killed before the new generation was complete everywhere: the old step; after: the new one
    assert resumed_from == {104, 204}


def test_study_verify_repeats_a_tiny_study_exactly_and_detects_an_altered_row(tmp_path):
    from perx.experiments import study, verify

    spec = {"envs": ["CartPole-v1"], "variants": ["uniform", "per"], "seeds": [0, 1],
            "config": {**SMALL, "total_steps": 400, "eval_every": 200}}
    root = tmp_path / "tiny"
    study.run_study(root, spec, workers=1, log=lambda *a: None)
    result = verify.verify(root, steps=400, log=lambda *a: None)
    assert [r["status"] for r in result["runs"]] == ["exact"] * 4
    assert all(r["rows"] == 2 for r in result["runs"]) and result["test"] == {}
    with pytest.raises(SystemExit, match=r"no lockstep group .* in \['Acrobot-v1'\]"):  # --envs filters groups
        verify.verify(root, steps=400, log=lambda *a: None, envs=["Acrobot-v1"])
    # alter one recorded evaluation return: that run, and only that run, is reported with the row and field
    path = root / "CartPole-v1" / "per" / "seed=1" / "metrics.csv"
    lines = path.read_text().splitlines()
    cells = lines[2].split(",")
    cells[2] = str(float(cells[2]) + 1.0)
    lines[2] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    result = verify.verify(root, steps=400, log=lambda *a: None)
    status = {r["run"]: r for r in result["runs"]}
    bad = status[str(Path("CartPole-v1") / "per" / "seed=1")]
    assert bad["status"] == "differs"
    assert bad["first_difference"]["step"] == 400 and bad["first_difference"]["fields"] == ["eval_return"]
    assert bad["machine"] == {}  # same machine: nothing recorded differs
    assert sum(r["status"] == "exact" for r in result["runs"]) == 3
    assert result["differences"] == [0.0, -1.0]
    assert "3 of 4 runs repeat" in verify.report(result, root, 400)
    # the command's exit status says whether everything agreed
    assert verify.main([str(root), "--steps", "400"]) == 1


def test_study_regrouped_between_sessions_trains_only_unfinished_runs_and_verify_reruns_recorded_groups(tmp_path):
    import json
    import shutil

    from perx.experiments import study, verify

    quiet = dict(log=lambda *a: None)
    spec = {"envs": ["CartPole-v1"], "variants": ["uniform", "per"], "seeds": [0, 1, 2], "order": "seeds",
            "group": 4, "config": {**SMALL, "total_steps": 400, "eval_every": 200}}
    root = tmp_path / "tiny"
    study.run_study(root, spec, workers=1, **quiet)  # groups: seeds 0-1 (4 runs), seed 2 (2 runs)
    env = root / "CartPole-v1"
    kept = (env / "per" / "seed=0" / "metrics.csv").stat().st_mtime_ns
    # a scheduling change that leaves every group as it was (interleave spelled out) is not a regrouping
    study.run_study(root, {**spec, "interleave": False}, workers=1, **quiet)
    assert "regrouped" not in json.loads((root / "study.json").read_text())
    for v in ("uniform", "per"):  # as if the session had ended during the second group of the old grouping
        shutil.rmtree(env / v / "seed=1")
    # a change of anything but the scheduling is still refused
    with pytest.raises(SystemExit, match="another grid"):
        study.run_study(root, {**spec, "seeds": [0, 1]}, workers=1, **quiet)
    # a run with a checkpoint of its old group refuses a regrouping, naming the run
    (env / "uniform" / "seed=1" / "checkpoint").mkdir(parents=True)
    (env / "uniform" / "seed=1" / "checkpoint" / "state-100.pt").write_text("x")
    with pytest.raises(SystemExit, match="uniform/seed=1"):
        study.run_study(root, {**spec, "group": 3}, workers=1, **quiet)
    shutil.rmtree(env / "uniform" / "seed=1")
    # groups of 3 cut across the old ones: [u0 p0 u1], [p1 u2 p2]; only u1 and p1 are trained, each alone
    study.run_study(root, {**spec, "group": 3}, workers=1, **quiet)
    saved = json.loads((root / "study.json").read_text())
    assert saved["group"] == 3 and saved["regrouped"] == [{"group": 4, "interleave": False}]
    assert (env / "per" / "seed=0" / "metrics.csv").stat().st_mtime_ns == kept  # finished runs: not trained again
    partners = {f"{v}/seed={s}": json.loads((env / v / f"seed={s}" / "config.json").read_text())["lockstep"]
                for v in ("uniform", "per") for s in (0, 1, 2)}
    assert partners["per/seed=0"] == ["uniform/seed=0", "per/seed=0", "uniform/seed=1", "per/seed=1"]
    assert (partners["uniform/seed=1"], partners["per/seed=1"]) == (["uniform/seed=1"], ["per/seed=1"])
    # verify reruns each run in its recorded group: seeds 0-1 of the old grouping (seed 1 rerun, not checked
    # there), then each retrained run alone, then seed 2; every checked run repeats its digits
    groups = verify.recorded_groups(root, study.grid_runs(saved))
    assert [([f"{c.variant}/seed={c.seed}" for _, c in g], checked) for g, checked in groups] == [
        (partners["per/seed=0"], [True, True, False, False]),
        (["uniform/seed=1"], [True]), (["per/seed=1"], [True]), (partners["per/seed=2"], [True, True])]
    result = verify.verify(root, steps=400, **quiet)
    assert [r["status"] for r in result["runs"]] == ["exact"] * 6
    # a run recording partners the grid does not hold cannot be rerun as trained: refused, naming it
    cfg = json.loads((env / "per" / "seed=2" / "config.json").read_text())
    (env / "per" / "seed=2" / "config.json").write_text(json.dumps({**cfg, "lockstep_runs": ["per/seed=2",
                                                                                            "per/seed=7"]}))
    with pytest.raises(SystemExit, match="holds 0 runs named per/seed=7"):
        verify.recorded_groups(root, study.grid_runs(saved))
    # and a record that leaves the run itself out
    (env / "per" / "seed=2" / "config.json").write_text(json.dumps({**cfg, "lockstep_runs": ["uniform/seed=2"]}))
    with pytest.raises(SystemExit, match="without itself"):
        verify.recorded_groups(root, study.grid_runs(saved))


@pytest.mark.parametrize("record", ["lockstep", "lockstep_runs"])
def test_verify_keeps_grid_groups_whose_runs_share_a_variant_when_their_records_match(tmp_path, record):
    """Cells and +rule variants share variant/seed labels (the old ``lockstep`` record): a study that was never
    regrouped is rerun in its grid groups, as before records were read."""
    import json

    from perx.experiments import study, verify

    spec = {"envs": ["CartPole-v1"], "seeds": [0, 1], "variants": ["u-a", "p-a", "p-b", "per+learning-progress"],
            "config": {"total_steps": 10},
            "cells": {"u-a": {"variant": "uniform", "optimizer_eps": 0.01},
                      "p-a": {"variant": "per", "optimizer_eps": 0.01},
                      "p-b": {"variant": "per", "optimizer_eps": 1e-5},
                      "per+learning-progress": {"variant": "per", "optimizer_eps": 1e-5,
                                                "priority_rule": "learning-progress"}}}
    grid = study.grid_runs(spec)
    for group in grid:
        names = ([f"{c.variant}/seed={c.seed}" for _, c in group] if record == "lockstep"
                 else [f"{n}/seed={c.seed}" for n, c in group])
        for name, cfg in group:
            d = study.run_dir(tmp_path, cfg.env_id, name, cfg.seed)
            d.mkdir(parents=True)
            (d / "config.json").write_text(json.dumps({record: names}))
    assert verify.recorded_groups(tmp_path, grid) == [(g, [True] * len(g)) for g in grid]


def test_study_cells_name_their_runs_and_runs_differing_in_a_shared_field_get_separate_groups():
    from perx.experiments import study

    spec = {"envs": ["CartPole-v1"], "seeds": [0, 1], "variants": ["u-a", "p-a", "p-b"], "config": {"total_steps": 10},
            "cells": {"u-a": {"variant": "uniform", "optimizer_eps": 0.01},
                      "p-a": {"variant": "per", "optimizer_eps": 0.01, "normalize": "buffer"},
                      "p-b": {"variant": "per", "optimizer_eps": 1e-5, "lr_scale": 0.25}}}
    groups = study.grid_runs(spec)
    # optimizer_eps is shared by every run of a lockstep group (one optimiser): two groups, in order
    assert [[(name, c.seed) for name, c in g] for g in groups] == [
        [("u-a", 0), ("u-a", 1), ("p-a", 0), ("p-a", 1)], [("p-b", 0), ("p-b", 1)]]
    p_b = groups[1][0][1]
    assert (p_b.optimizer_eps, p_b.settings()["lr_scale"]) == (1e-5, 0.25)
    assert groups[0][2][1].settings()["normalize"] == "buffer"


def test_study_interleave_runs_the_first_group_of_every_env_before_the_second():
    from perx.experiments import study

    spec = {"envs": ["CartPole-v1", "Acrobot-v1"], "variants": ["uniform", "per"], "seeds": [0, 1, 2],
            "order": "seeds", "group": 4, "interleave": True, "config": {"total_steps": 10}}
    groups = study.grid(spec)
    assert [(g[0].env_id, sorted({c.seed for c in g})) for g in groups] == [
        ("CartPole-v1", [0, 1]), ("Acrobot-v1", [0, 1]), ("CartPole-v1", [2]), ("Acrobot-v1", [2])]


def test_pooled_table_scales_each_pair_by_the_games_mean_uniform_score():
    from perx.experiments.study import _pooled_lines

    finals = {"A": {"uniform": {0: 1.0, 1: 3.0, 2: 2.0}, "per": {0: 2.0, 1: 3.0, 2: 4.0}},
              "B": {"uniform": {0: 10.0, 1: 10.0, 2: 10.0}, "per": {0: 9.0, 1: 12.0, 2: 13.0}}}
    lines = _pooled_lines(finals, ["A", "B"], ["uniform", "per"])
    # pairs: A (1, 0, 2) / 2 = 0.5, 0, 1; B (-1, 2, 3) / 10 = -0.1, 0.2, 0.3: mean 0.3167, 4 of 6 above 0
    row = lines[-1]
    assert row.startswith("| per | 6 | +31.7% ± ") and "| 4/6 |" in row
    from scipy import stats

    p = stats.wilcoxon([0.5, 0.0, 1.0, -0.1, 0.2, 0.3]).pvalue
    assert row.endswith(f"| {p:.3f} ({p:.3f}) |")  # one test: Holm leaves it as it is
    assert _pooled_lines({"A": finals["A"]}, ["A"], ["uniform", "per"]) == []  # one game: nothing pooled
