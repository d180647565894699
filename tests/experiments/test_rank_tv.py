"""The heap approximation of rank-based PER against the exact power law (docs/rank_based.md)."""

import json

import numpy as np

from perx.experiments.rank_tv import Config, main, run_stream

#: Documented tolerance: with the default sort_every (= capacity) the distribution the heap sampler
#: draws stays within this total-variation distance of the exact power law on the stream of
#: perx.experiments.rank_tv (measured 0.13-0.18 at N = 5000; 0.17 mean, 0.34 max at N = 1e5).
HEAP_TV_TOLERANCE = 0.25


def test_heap_mode_stays_within_the_documented_tolerance():
    cfg = Config(capacity=5000, steps=1500, measure_every=300)
    rows = run_stream(cfg, sort_every=5000, seed=0)
    assert max(r["tv_total"] for r in rows) < HEAP_TV_TOLERANCE
    # the segments alone (a perfectly sorted order) are much closer
    assert max(r["tv_segments"] for r in rows) < 0.06


def test_sorting_more_often_brings_the_heap_closer_to_the_power_law():
    cfg = Config(capacity=5000, steps=1500, measure_every=300)
    tv = {se: np.mean([r["tv_total"] for r in run_stream(cfg, sort_every=se, seed=1)])
          for se in (500, 5000, 0)}
    assert tv[500] < tv[5000] < tv[0]


def test_rank_tv_command_writes_csv_png_and_meta(tmp_path):
    out = tmp_path / "rtv"
    assert main(["--capacity", "2000", "--steps", "200", "--measure-every", "100", "--seeds", "1",
                 "--sort-every", "500", "0", "--out", str(out)]) == 0
    for name in ("rank_tv.csv", "summary.csv", "segments.csv", "meta.json", "rank_tv.png"):
        assert (out / name).stat().st_size > 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["config"]["capacity"] == 2000
    assert (out / "summary.csv").read_text().count("\n") == 3  # header + 2 settings


def test_output_defaults_to_a_folder_git_ignores():
    from perx.experiments import rank_tv

    assert rank_tv.build_parser().parse_args([]).out == rank_tv.DEFAULT_OUT == "runs/rank_tv"
