"""Prioritized supervised learning (000 Sec. 6, App. B.3): the imbalanced split and a tiny pipeline run."""

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("torch")

from perx.experiments import supervised


def test_imbalanced_split_keeps_one_percent_of_digits_0_to_4_and_balanced_test_sets():
    cfg = supervised.Config()
    data = supervised.load_split(cfg)
    train = np.bincount(data["y_train"], minlength=10)
    test = np.bincount(data["y_test"], minlength=10)
    val = np.bincount(data["y_val"], minlength=10)
    from sklearn.datasets import load_digits

    total = np.bincount(load_digits().target, minlength=10)
    pool = total - np.round(0.25 * total) - np.round(0.15 * total)
    np.testing.assert_array_equal(train[5:], pool[5:])  # every 5-9 of the pool
    np.testing.assert_array_equal(train[:5], np.maximum(1, np.round(0.01 * pool[:5])))  # 1% of 0-4, at least 1
    np.testing.assert_array_equal(test, np.round(0.25 * total))  # test keeps every class
    np.testing.assert_array_equal(val, np.round(0.15 * total))
    assert train[5:].min() / train[:5].max() >= 100  # 100 times more 5-9s, as B.3
    # the three sets are disjoint images of the original data
    seen = {x.tobytes() + bytes([y]) for name in ("train", "val", "test")
            for x, y in zip(data[f"x_{name}"], data[f"y_{name}"], strict=True)}
    assert len(seen) <= len(load_digits().target)


def test_keep_changes_only_the_rare_classes():
    a = np.bincount(supervised.load_split(supervised.Config(keep=0.5))["y_train"], minlength=10)
    b = np.bincount(supervised.load_split(supervised.Config())["y_train"], minlength=10)
    assert (a[:5] > b[:5]).all() and (a[5:] == b[5:]).all()


@pytest.mark.parametrize("method", supervised.METHODS)
def test_a_few_updates_lower_the_training_error(method):
    cfg = supervised.Config(updates=200, eval_every=100, seeds=1)
    rows = supervised.run_one(method, 0.1, 0, cfg)
    assert [r["update"] for r in rows] == [0, 100, 200]
    assert rows[-1]["train_errors"] < rows[0]["train_errors"]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]


def test_prioritized_runs_write_the_last_seen_losses_as_priorities(monkeypatch):
    seen = []
    original = supervised.perx.ReplayBuffer.update_priorities

    def spy(self, indices, td_errors):
        seen.append(np.asarray(td_errors).copy())
        return original(self, indices, td_errors)

    monkeypatch.setattr(supervised.perx.ReplayBuffer, "update_priorities", spy)
    supervised.run_one("prioritized", 0.1, 0, supervised.Config(updates=5, eval_every=5))
    assert len(seen) == 5 and all(len(s) == 60 and (s > 0).all() for s in seen)
    supervised.run_one("uniform", 0.1, 0, supervised.Config(updates=5, eval_every=5))
    assert len(seen) == 5  # uniform sampling writes no priorities


def test_a_diverging_step_size_is_marked_and_not_selected():
    cfg = supervised.Config(updates=50, eval_every=25, seeds=1, learning_rates=(1e6, 0.1), methods=("uniform",))
    rows = supervised.run_one("uniform", 1e6, 0, cfg) + supervised.run_one("uniform", 0.1, 0, cfg)
    assert any(r["lr"] == 1e6 and r["test_loss"] == np.inf for r in rows)
    assert [c["lr"] for c in supervised.select(rows, cfg)] == [0.1]


def test_one_diverged_seed_does_not_rule_out_a_step_size_and_is_counted_apart(tmp_path):
    cfg = supervised.Config(updates=100, seeds=3, learning_rates=(0.3, 0.03), methods=("uniform",))

    def final(lr, seed, val, errors, loss=1.0):
        return {"method": "uniform", "lr": lr, "seed": seed, "update": 100, "test_errors": errors, "test_loss": loss,
                "test_balanced_error": errors / 1000, "val_balanced_error": val, "train_errors": 0}

    rows = [final(0.3, 0, 0.2, 200), final(0.3, 1, 0.25, 300), final(0.3, 2, 1.0, 900, loss=np.inf),  # diverged
            *(final(0.03, s, 0.3, 400) for s in range(3))]
    (chosen,) = supervised.select(rows, cfg)
    # B.3's rule on the median validation error: 0.25 (the diverged run counts as 1.0) beats 0.3
    assert chosen["lr"] == 0.3 and chosen["median_val_balanced_error"] == 0.25
    # what is reported comes from the two runs that did not diverge
    assert (chosen["seeds"], chosen["diverged"], chosen["median_test_errors"]) == (2, 1, 250.0)
    rows[1] = final(0.3, 1, 1.0, 900, loss=np.inf)  # two of three diverged: median 1.0, the other step size wins
    assert [c["lr"] for c in supervised.select(rows, cfg)] == [0.03]
    rows[0] = final(0.3, 0, 1.0, 900, loss=np.inf)  # every run of the only step size diverged: reported as such
    (alone,) = supervised.select(rows[:3], supervised.Config(updates=100, seeds=3, learning_rates=(0.3,),
                                                             methods=("uniform",)))
    assert (alone["seeds"], alone["diverged"]) == (0, 3) and np.isnan(alone["median_test_errors"])
    supervised.plot(rows[:3], [alone], 1000, tmp_path / "all_diverged.png", "label")  # draws nothing, no error


def test_the_figure_title_names_the_share_of_rare_digits_kept():
    assert supervised.keep_label(supervised.Config(keep=0.1)) == "0-4 kept at 10%: 11 of 106-110 training examples each"
    assert supervised.keep_label(supervised.Config()).startswith("0-4 kept at 1%: 1 of ")


def test_output_defaults_to_a_folder_git_ignores(tmp_path, monkeypatch):
    assert supervised.build_parser().parse_args([]).out == supervised.DEFAULT_OUT == "runs/supervised"
    monkeypatch.chdir(tmp_path)
    assert supervised.main(["--plot-only"]) == 1  # no runs in runs/supervised: refused, and nothing created
    assert not any(tmp_path.iterdir())


def test_mnist1d_split_keeps_one_percent_of_its_rare_classes_and_trains_a_1d_network():
    pytest.importorskip("mnist1d")
    import torch

    cfg = supervised.Config(data="mnist1d", samples=3000, updates=30, eval_every=10, learning_rates=(0.1,))
    data = supervised.load_split(cfg)
    assert data["x_train"].shape[1:] == (1, 40) and data["x_train"].dtype == np.float32
    _, y = supervised._dataset("mnist1d", 3000)
    total = np.bincount(y, minlength=10)
    assert total.sum() == 3000
    pool = total - np.round(0.25 * total) - np.round(0.15 * total)
    train = np.bincount(data["y_train"], minlength=10)
    np.testing.assert_array_equal(train[5:], pool[5:])
    np.testing.assert_array_equal(train[:5], np.maximum(1, np.round(0.01 * pool[:5])))
    np.testing.assert_array_equal(np.bincount(data["y_test"], minlength=10), np.round(0.25 * total))
    kept, pools = supervised.rare_kept(cfg)
    assert kept == train[:5].tolist() and pools == pool[:5].tolist()
    assert supervised.network(0, "mnist1d")(torch.from_numpy(data["x_test"][:7])).shape == (7, 10)
    rows = supervised.run_one("prioritized", 0.1, 0, cfg, data)
    assert [r["update"] for r in rows] == [0, 10, 20, 30]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]



def _curve_rows(method, lr, seed, values, step=100):
    return [{"method": method, "lr": lr, "seed": seed, "update": i * step, "test_errors": v, "test_loss": 1.0,
             "test_balanced_error": v / 100, "val_balanced_error": v / 100, "train_errors": 0, "train_loss": 1.0,
             "seconds": 0.0} for i, v in enumerate(values)]


def test_speedup_is_updates_to_reach_uniforms_final_level_over_the_methods():
    steps = np.arange(13) * 100  # 0 .. 1200
    curves = {"uniform": np.maximum(10, 100 - 0.09 * steps),       # reaches its final level 10 at 1000
              "prioritized": np.maximum(10, 100 - 0.27 * steps),   # <= 10 from 333.3: first evaluation 400
              "informed": np.full(13, 50.0)}                       # never reaches it
    rows = [r for m, v in curves.items() for s in range(3) for r in _curve_rows(m, 0.1, s, v)]
    chosen = [{"method": m, "lr": 0.1} for m in curves]
    fast = {f["method"]: f for f in supervised.speedups(rows, chosen)}
    assert fast["uniform"]["speedup"] == 1.0 and fast["uniform"]["uniform_updates"] == 1000
    p = fast["prioritized"]
    assert (p["target"], p["updates"], p["speedup"]) == (10.0, 400, 2.5)
    assert (p["low"], p["high"], p["reached"]) == (2.5, 2.5, 1.0)  # identical seeds: no spread
    i = fast["informed"]
    assert i["updates"] == np.inf and i["speedup"] == 0.0 and i["reached"] == 0.0


def test_speedup_interval_reflects_the_spread_over_seeds():
    steps = np.arange(13) * 100
    rng = np.random.default_rng(0)
    rows = []
    for s in range(10):
        rows += _curve_rows("uniform", 0.1, s, np.maximum(10, 100 - 0.09 * steps))
        rate = 0.27 * rng.uniform(0.5, 1.5)  # each seed of the method learns at its own speed
        rows += _curve_rows("prioritized", 0.1, s, np.maximum(10, 100 - rate * steps))
    (_, p) = supervised.speedups(rows, [{"method": "uniform", "lr": 0.1}, {"method": "prioritized", "lr": 0.1}])
    assert p["low"] <= p["speedup"] <= p["high"] and p["low"] < p["high"]
    assert 1.0 < p["low"] and p["high"] <= 1000 / 200


def test_median_band_is_the_bootstrap_interval_of_the_median_and_stays_in_the_seeds_range():
    values = np.array([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0], [10.0, 5.0]])
    med, lo, hi = supervised.median_band(values)
    np.testing.assert_array_equal(med, [2.5, 5.0])
    assert 1.0 <= lo[0] < 2.5 < hi[0] <= 10.0 and lo[1] == hi[1] == 5.0


def test_select_seeds_runs_the_other_seeds_only_at_each_methods_chosen_step_size(tmp_path, monkeypatch):
    calls = []

    def fake_run(method, lr, seed, cfg, data=None):
        calls.append((method, lr, seed))
        error = 0.1 if lr == 0.01 else 0.5  # 0.01 is every method's best step size
        return [{"method": method, "lr": lr, "seed": seed, "update": u, "test_errors": 100 * error,
                 "test_loss": 1.0, "test_balanced_error": error, "val_balanced_error": error, "train_errors": 0,
                 "train_loss": 1.0, "seconds": 0.0} for u in range(cfg.updates + 1)]

    monkeypatch.setattr(supervised, "run_one", fake_run)
    out = tmp_path / "sup"
    args = ["--updates", "2", "--eval-every", "1", "--seeds", "4", "--select-seeds", "2", "--learning-rates", "0.1",
            "0.01", "--methods", "uniform", "prioritized", "--workers", "1", "--out", str(out)]
    assert supervised.main(args) == 0
    stage1 = {(m, lr, s) for m in ("uniform", "prioritized") for lr in (0.1, 0.01) for s in (0, 1)}
    stage2 = {(m, 0.01, s) for m in ("uniform", "prioritized") for s in (2, 3)}
    assert set(calls[:8]) == stage1 and set(calls[8:]) == stage2 and len(calls) == 12
    import csv

    with open(out / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert [(r["method"], r["lr"], r["seeds"]) for r in summary] == [("uniform", "0.01", "4"),
                                                                     ("prioritized", "0.01", "4")]
    assert (out / "speedup.csv").exists()
    with pytest.raises(SystemExit):
        supervised.main([*args[:6], "--select-seeds", "5"])  # more selection seeds than seeds: refused
