"""The TD3 overhead benchmark: perx's one TD3 with every buffer, paired intervals, other libraries' buffers."""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("mujoco")

import _peers  # benchmarks/, on pytest's pythonpath
import bench_td3_overhead as bench


def test_paired_interval_is_the_median_ratio_and_brackets_it():
    ref = [1.0, 2.0, 4.0, 1.0, 3.0]
    mid, lo, hi = bench.paired_interval([1.1, 2.2, 4.4, 1.1, 3.3], ref)
    assert mid == pytest.approx(0.1) and lo == pytest.approx(0.1) and hi == pytest.approx(0.1)
    ratios = [0.0, 0.1, 0.2, 0.3, 0.4]
    mid, lo, hi = bench.paired_interval([r + 1 for r in ratios], [1.0] * 5)
    assert mid == pytest.approx(0.2) and 0.0 <= lo < 0.2 < hi <= 0.4


def test_a_tiny_run_times_perx_td3_for_every_installed_row_in_rotated_order():
    seen = []
    result = bench.run("Hopper-v5", warmup=40, steps=4, rounds=2, log=seen.append)
    assert {"uniform", "perx per", "perx lap", "perx pal"} <= result["times"].keys()
    assert all(len(v) == 2 and min(v) > 0 for v in result["times"].values())
    assert seen[0].startswith("round 0: uniform") and seen[len(result["times"])].startswith("round 1: perx per")
    md = bench.table(result, "perx bench-td3")
    assert "| perx per |" in md and "% to " in md


def _rows(n, terminated_at=()):
    rng = np.random.default_rng(0)
    term = np.zeros(n, np.bool_)
    term[list(terminated_at)] = True
    return dict(obs=rng.standard_normal((n, 3), dtype=np.float32), action=rng.uniform(-1, 1, (n, 2)).astype(np.float32),
                reward=np.arange(n, dtype=np.float32), next_obs=rng.standard_normal((n, 3), dtype=np.float32),
                terminated=term, truncated=np.zeros(n, np.bool_))


@pytest.mark.parametrize("name", sorted(_peers.PEERS))
def test_a_peer_buffer_returns_what_the_agent_reads_with_discount_zero_only_where_terminated(name):
    pytest.importorskip(name.split()[0])
    buf = _peers.PEERS[name](16, gamma=0.9)
    rows = _rows(8, terminated_at=[3])
    buf.extend(**rows)
    batch = buf.sample(64, beta=0.4)
    assert {"obs", "action", "next_obs", "return", "discount"} <= batch.keys()
    ret = np.asarray(batch["return"]).astype(int)
    np.testing.assert_allclose(batch["discount"], np.where(ret == 3, 0.0, 0.9), rtol=1e-6)
    np.testing.assert_array_equal(batch["obs"], rows["obs"][ret])
    assert batch.weights.shape == (64,) and len(batch.indices) == 64
    buf.update_priorities(batch.indices, np.full(64, 2.0))
