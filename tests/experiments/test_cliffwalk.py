"""Blind Cliffwalk learners, oracle and the `perx cliffwalk` runner (000 Sec. 3.1, App. B.1)."""

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest

from perx.envs import BlindCliffwalk
from perx.experiments import cliffwalk as cw


def learner(n, linear, theta, bias="shared"):
    lrn = cw.Learner(BlindCliffwalk(n), linear, np.random.default_rng(0), bias)
    lrn.theta[:] = theta
    return lrn


def test_one_tabular_update_matches_a_hand_computation():
    n = 3  # gamma = 2/3, right actions: state 0 -> 0, state 1 -> 1
    theta = np.array([0.1, -0.2, 0.3, 0.05, 0.0, 0.4])  # index 2s + a
    lrn = learner(n, False, theta)
    delta = lrn.td_error(0, 0, 0.0, 1, False)  # Q(0,0) = 0.1, max Q(1,.) = 0.3
    assert delta == pytest.approx(0 + 2 / 3 * 0.3 - 0.1)
    lrn.update(0, 0, delta)
    expected = theta.copy()
    expected[0] += 0.25 * delta
    np.testing.assert_allclose(lrn.theta, expected)


def test_one_linear_update_moves_the_pair_and_the_bias():
    n = 2  # gamma = 1/2
    theta = np.array([0.1, 0.2, 0.3, 0.4, 0.5])  # 4 one-hot weights + shared bias 0.5
    lrn = learner(n, True, theta)
    delta = lrn.td_error(0, 0, 0.0, 1, False)  # Q(0,0) = 0.6, max Q(1,.) = 0.9
    assert delta == pytest.approx(0.5 * 0.9 - 0.6)
    lrn.update(0, 0, delta, weight=0.5)
    np.testing.assert_allclose(lrn.theta, theta + 0.25 * 0.5 * delta * np.array([1, 0, 0, 0, 1]))
    terminal = lrn.td_error(1, 0, 0.0, 1, True)  # wrong in state 1: target 0
    assert terminal == pytest.approx(-(lrn.theta[2] + lrn.theta[4]))


def test_per_action_bias_is_shared_only_within_an_action():
    lrn = learner(2, True, np.array([0.0, 0.0, 0.0, 0.0, 1.0, 2.0]), bias="per-action")
    np.testing.assert_allclose(lrn.q(), [1.0, 2.0, 1.0, 2.0])
    lrn.update(1, 1, 4.0)
    np.testing.assert_allclose(lrn.theta, [0.0, 0.0, 0.0, 1.0, 1.0, 3.0])


def test_oracle_picks_the_stored_transition_whose_update_most_reduces_the_loss():
    """Trying the 2n distinct (s, a) equals trying every stored transition, duplicates included."""
    for linear in (False, True):
        env = BlindCliffwalk(4, seed=2)
        memory = env.replay_memory()
        lrn = cw.Learner(env, linear, np.random.default_rng(5))
        loss, path = cw.Oracle(lrn, memory).best_sequence(1)
        brute = []
        for i in range(len(memory["obs"])):  # every stored transition, one by one
            copy = cw.Learner(env, linear, np.random.default_rng(5))
            s, a = int(memory["obs"][i]), int(memory["action"][i])
            d = copy.td_error(s, a, float(memory["reward"][i]), int(memory["next_obs"][i]),
                              bool(memory["terminated"][i]))
            copy.update(s, a, d)
            brute.append((copy.mse(), 2 * s + a))
        best_loss, best_type = min(brute)
        assert loss == pytest.approx(best_loss, rel=1e-12)
        assert int(cw.Oracle(lrn, memory).types[path[0]]) == best_type


def test_literal_linear_oracle_reports_a_stall():
    rows = [cw.run_one("oracle-linear", 8, s, cw.Config()) for s in range(3)]
    assert all(r["stalled"] and not r["converged"] and not r["hit_cap"] for r in rows)
    assert all(r["final_mse"] > cw.CONVERGED_MSE for r in rows)


def test_tabular_oracle_and_greedy_beat_uniform():
    cfg = cw.Config()
    runs = {m: cw.run_one(m, 7, 0, cfg) for m in ("uniform-tabular", "greedy-tabular", "oracle-tabular")}
    assert all(r["converged"] for r in runs.values())
    assert runs["oracle-tabular"]["updates"] < runs["greedy-tabular"]["updates"] < runs["uniform-tabular"]["updates"]


def test_a_capped_run_is_reported_as_such():
    r = cw.run_one("proportional-linear-is", 5, 0, cw.Config(cap_factor=2))
    assert r["hit_cap"] and not r["converged"] and r["updates"] == r["cap"] == 1000


def test_runs_that_did_not_converge_are_summed_up_in_one_line_per_method(capsys):
    def row(method, n, stalled=False, hit_cap=False):
        return {"method": method, "n": n, "converged": not (stalled or hit_cap), "stalled": stalled,
                "hit_cap": hit_cap}

    rows = [row("uniform-linear", 3), row("oracle-linear", 7, stalled=True), row("oracle-linear", 8, stalled=True),
            row("oracle-linear", 6), row("proportional-linear-is", 4, hit_cap=True)]
    cw.print_not_converged(rows)
    assert capsys.readouterr().out.splitlines() == [
        "note: proportional-linear-is: 1 of 1 runs did not converge (0 stalled, 1 hit the cap) at n = 4",
        "note: oracle-linear: 2 of 3 runs did not converge (2 stalled, 0 hit the cap) at n = 7, 8"]


def test_runs_are_seeded():
    a = cw.run_one("rank-linear", 6, 3, cw.Config())
    b = cw.run_one("rank-linear", 6, 3, cw.Config())
    assert a["updates"] == b["updates"] and a["final_mse"] == b["final_mse"]


def test_cliffwalk_command_writes_csv_png_and_resumes(tmp_path, capsys):
    out = tmp_path / "cw"
    args = ["--n-max", "4", "--seeds", "2", "--workers", "1", "--out", str(out)]
    assert cw.main(args) == 0
    with open(out / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * len(cw.METHODS) * 2  # n = 2, 3, 4
    assert {r["method"] for r in rows} == set(cw.METHODS)
    for name in ("summary.csv", "meta.json", "cliffwalk.png"):
        assert (out / name).stat().st_size > 0
    capsys.readouterr()
    assert cw.main([*args, "--resume"]) == 0  # resumes: nothing left to run
    assert "0 to go" in capsys.readouterr().out
    assert cw.main([*args, "--plot-only"]) == 0
    assert cw.main([*args, "--resume", "--alpha-rank", "0.5"]) == 2  # other settings never mix into old runs


def test_an_interrupted_study_resumes_where_it_stopped(tmp_path):
    out = tmp_path / "cw"
    base = ["--n-max", "3", "--seeds", "2", "--workers", "1", "--out", str(out), "--methods", "uniform-tabular"]
    assert cw.main(base) == 0
    with open(out / "runs.csv") as f:
        lines = f.readlines()
    (out / "runs.csv").write_text("".join(lines[:3]))  # keep the header and 2 of the 4 runs
    assert cw.main([*base, "--resume"]) == 0
    rows = cw.read_runs(out / "runs.csv")
    assert sorted((r["n"], r["seed"]) for r in rows) == [(2, 0), (2, 1), (3, 0), (3, 1)]


def test_every_method_runs_on_the_representation_its_name_says():
    """Regression: the -is variants once ran tabular because the name ends in '-is', not '-linear'."""
    for method in cw.METHODS:
        assert cw.representation(method) == ("linear" if "-linear" in method else "tabular")
    assert cw.representation("proportional-linear-is") == "linear"


@pytest.mark.parametrize("bias", ["shared", "per-action"])
@pytest.mark.parametrize("linear", [False, True])
def test_compiled_oracle_steps_agree_with_the_reference_search(linear, bias):
    """The compiled loop's choice at each step equals the numpy search over every candidate (sequence)."""
    env = BlindCliffwalk(5, seed=3)
    memory = env.replay_memory()
    for seed in range(4):
        ref = cw.Learner(env, linear, np.random.default_rng(seed), bias)
        fast = cw.Learner(env, linear, np.random.default_rng(seed), bias)
        ref_oracle, fast_oracle = cw.Oracle(ref, memory), cw.Oracle(fast, memory)
        for _ in range(30):
            mse = ref.mse()
            loss, path = ref_oracle.best_sequence(1)
            if loss >= mse:
                loss, path = ref_oracle.best_sequence(2)
            if loss >= mse or mse < cw.CONVERGED_MSE:
                break
            for c in path:
                ref_oracle.apply(c)
            updates, _, stalled = fast_oracle.run(2, cap=len(path))  # exactly the same number of updates
            assert updates == len(path) and not stalled
            np.testing.assert_allclose(fast.theta, ref.theta, rtol=1e-12, atol=1e-15)


def test_compiled_learner_equals_the_python_updates():
    env = BlindCliffwalk(6, seed=1)
    memory = env.replay_memory()
    for linear in (False, True):
        a = cw.Learner(env, linear, np.random.default_rng(2), "per-action")
        b = cw.Learner(env, linear, np.random.default_rng(2), "per-action")
        w = np.random.default_rng(0).random(len(memory["obs"]))
        deltas = np.empty(len(w))
        done, mse = a.learn(memory["obs"], memory["action"], memory["reward"], memory["next_obs"],
                            memory["terminated"], w, deltas)
        for i in range(done):
            s, act = int(memory["obs"][i]), int(memory["action"][i])
            d = b.td_error(s, act, float(memory["reward"][i]), int(memory["next_obs"][i]),
                           bool(memory["terminated"][i]))
            assert d == pytest.approx(deltas[i], rel=1e-12, abs=1e-15)
            b.update(s, act, d, float(w[i]))
        np.testing.assert_allclose(a.theta, b.theta, rtol=1e-12)
        assert mse == pytest.approx(b.mse(), rel=1e-12)


def test_output_defaults_to_a_folder_git_ignores():
    assert cw.DEFAULT_OUT == "runs/cliffwalk"
    assert cw.build_parser().parse_args([]).out == "runs/cliffwalk"


def test_plot_only_reads_and_writes_the_out_folder_and_nothing_else(tmp_path, monkeypatch):
    """``--plot-only --out results/cliffwalk`` is how the committed figure is redrawn: from a copy of those runs
    here, it writes summary.csv and the PNG beside them, and creates no default folder."""
    committed = Path(__file__).resolve().parents[2] / "results" / "cliffwalk" / "runs.csv"
    out = tmp_path / "committed"
    out.mkdir()
    shutil.copy(committed, out / "runs.csv")
    monkeypatch.chdir(tmp_path)
    assert cw.main(["--plot-only", "--out", str(out)]) == 0
    assert (out / "summary.csv").stat().st_size > 0 and (out / "cliffwalk.png").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["committed"]  # no runs/ folder made
    assert cw.main(["--plot-only"]) == 1  # no runs in runs/cliffwalk: refused, and nothing created
    assert sorted(p.name for p in tmp_path.iterdir()) == ["committed"]


def test_twostep_oracle_applies_the_first_update_of_the_best_two_update_sequence():
    """n = 3, linear: every pair (k, k2) of the 6 distinct transitions is tried by hand (numpy, the reference
    learner's own update); the compiled oracle's single step equals applying the first update of the best pair."""
    env = BlindCliffwalk(3, seed=0)
    memory = env.replay_memory()
    for seed in range(5):
        ref = cw.Learner(env, True, np.random.default_rng(seed), "per-action")
        fast = cw.Learner(env, True, np.random.default_rng(seed), "per-action")
        oracle = cw.Oracle(ref, memory)
        assert len(oracle.types) == 6  # 2n distinct (s, a)
        losses = np.empty((6, 6))
        start = ref.theta.copy()
        for k in range(6):
            for k2 in range(6):
                ref.theta[:] = start
                oracle.apply(k)
                oracle.apply(k2)
                losses[k, k2] = ref.mse()
        ref.theta[:] = start
        first, _ = np.unravel_index(np.argmin(losses), losses.shape)
        assert losses.min() < ref.mse()  # the pair lowers the loss, so the oracle takes a step
        oracle.apply(int(first))
        updates, _, stalled = cw.Oracle(fast, memory).run_twostep(cap=1)
        assert updates == 1 and not stalled
        np.testing.assert_allclose(fast.theta, ref.theta, rtol=1e-12, atol=1e-15)


def test_twostep_oracle_converges_on_a_linear_chain():
    row = cw.run_one("oracle-twostep-linear", 6, 0, cw.Config())
    assert row["converged"] and not row["stalled"]
