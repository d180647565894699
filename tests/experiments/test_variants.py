"""The Appendix A variants study on the Blind Cliffwalk: every variant runs, converges on a small chain,
and changes only what its name says."""

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
