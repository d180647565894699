"""The Appendix A variants study on the Blind Cliffwalk: every variant runs, converges on a small chain,
and changes only what its name says."""

import numpy as np
import pytest

import perx
from perx.experiments import variants as v


@pytest.mark.parametrize("variant", v.VARIANTS)
def test_every_variant_converges_on_a_small_chain(variant):
    row = v.run_one(variant, 4, 0, v.Config())
    assert row["converged"] and 0 < row["updates"] < 50 * row["memory_size"]


def test_each_variant_is_one_rule_or_sampler_on_the_same_baseline():
    cfg = v.Config()

    def factory(sampler):
        return perx.ReplayBuffer(8, sampler)

    buf, prio = v.make("proportional", cfg, factory, 8)
    assert isinstance(buf.sampler, perx.Proportional) and prio.rules == ()
    buf, prio = v.make("predecessor", cfg, factory, 8)
    assert buf.sampler.alpha == cfg.alpha and [type(r).__name__ for r in prio.rules] == ["PredecessorBoost"]
    buf, prio = v.make("rank-staleness", cfg, factory, 8)
    assert isinstance(buf.sampler, perx.RankBased) and prio.rules[0].rate == 1 / 8
    buf, prio = v.make("hybrid", cfg, factory, 8)
    assert prio is None and buf.sampler.mixing == "random"


def test_runs_are_seeded():
    a = v.run_one("learning-progress", 5, 3, v.Config())
    b = v.run_one("learning-progress", 5, 3, v.Config())
    assert a["updates"] == b["updates"]


def test_command_writes_csv_and_png(tmp_path):
    assert v.main(["--n-min", "2", "--n-max", "3", "--seeds", "2", "--variants", "uniform", "proportional",
                   "--workers", "1", "--out", str(tmp_path)]) == 0
    for name in ("runs.csv", "summary.csv", "meta.json", "variants.png"):
        assert (tmp_path / name).exists()


def test_holm_adjustment_matches_a_hand_computation():
    # sorted: 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04, raised to the running maximum 0.06
    np.testing.assert_allclose(v.holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    # ties share the adjusted value; the factor m - k + 1 is capped at 1
    np.testing.assert_allclose(v.holm([0.002, 0.002, 0.01, 0.6]), [0.008, 0.008, 0.02, 0.6])
    np.testing.assert_allclose(v.holm([0.3, 0.5]), [0.6, 0.6])
    assert v.holm([]).shape == (0,)


def test_compare_adjusts_over_the_variants_but_not_the_base():
    rows = [{"variant": name, "n": 3, "seed": s, "updates": 100 + s + shift}
            for name, shift in (("proportional", 0), ("uniform", 50), ("rank", 20)) for s in range(6)]
    table = {t["variant"]: t for t in v.compare(rows, 3)}
    assert np.isnan(table["proportional"]["holm_p"])
    raw = [table[name]["wilcoxon_p"] for name in ("uniform", "rank")]
    np.testing.assert_allclose([table[name]["holm_p"] for name in ("uniform", "rank")], v.holm(raw))
    assert table["uniform"]["holm_p"] == min(1.0, 2 * raw[0])  # two tests, equal p: both doubled


def test_output_defaults_to_a_folder_git_ignores(tmp_path, monkeypatch):
    assert v.build_parser().parse_args([]).out == v.DEFAULT_OUT == "runs/variants"
    monkeypatch.chdir(tmp_path)
    assert v.main(["--plot-only"]) == 1  # no runs in runs/variants: refused, and nothing created
    assert not any(tmp_path.iterdir())
