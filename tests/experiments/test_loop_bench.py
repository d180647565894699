"""The in-loop buffer benchmark: each buffer's calls are timed and only they count as buffer time."""

import numpy as np
import pytest

pytest.importorskip("torch")

import bench_loop as loop_bench  # benchmarks/, on pytest's pythonpath


def test_timed_wrapper_counts_only_the_time_inside_the_buffer():
    class Slow:
        name = "slow"

        def sample(self, b, *, beta):
            import time

            time.sleep(0.01)
            return b

    timed = loop_bench._Timed(Slow())
    assert timed.name == "slow" and timed.seconds == 0.0  # attributes pass through, untimed
    assert timed.sample(3, beta=0.4) == 3
    assert 0.009 < timed.seconds < 0.1


def test_a_tiny_run_times_every_buffer_and_reports_the_extra_over_uniform(tmp_path):
    result = loop_bench.run(n=300, steps=5, rounds=2, device="cpu", log=lambda *_: None)
    times = result["times"]
    assert {"perx.Uniform", "perx.Proportional", "perx.Uniform out=", "perx.Proportional out="} <= times.keys()
    for t in times.values():
        assert len(t["step"]) == 2 and all(0 < b < s for b, s in zip(t["buffer"], t["step"], strict=True))
    md = loop_bench.table(result, "perx bench-loop")
    assert "| perx.Proportional |" in md and "%" in md and "| perx.Proportional out= |" in md


def test_the_out_rows_refill_one_batch():
    buf = loop_bench.make("perx.Proportional out=", 64, 0)
    buf.extend(**loop_bench._fill_data(64, 0))
    first = buf.sample(16, beta=0.4)
    second = buf.sample(16, beta=0.4)
    assert first is second and first["obs"] is second["obs"]


def test_the_prioritized_buffer_receives_the_critics_errors():
    buf = loop_bench._Timed(loop_bench.make("perx.Proportional", 400, 0))
    buf.extend(**loop_bench._fill_data(300, 0))
    loop_bench._round("per", buf, 3, 0, "cpu", lambda: None, 400)
    # new transitions hold priority 1; the draws' priorities were rewritten by the critics' |delta| + eps
    assert not np.all(buf.priorities(np.arange(300)) == 1.0)
    assert buf.seconds > 0


def test_uniform_rows_send_no_priorities():
    buf = loop_bench._Timed(loop_bench.make("perx.Uniform", 400, 0))
    buf.extend(**loop_bench._fill_data(300, 0))
    sent = []
    buf.inner.update_priorities = lambda *a: sent.append(a)
    loop_bench._round("uniform", buf, 3, 0, "cpu", lambda: None, 400)
    assert sent == []


def test_output_defaults_to_a_folder_git_ignores():
    assert loop_bench.build_parser().parse_args([]).out == loop_bench.DEFAULT_OUT == "runs/loop_bench.md"
