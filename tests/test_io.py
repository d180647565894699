"""Save and load: complete state, atomic writes, clear errors on damaged files."""

import os
from pathlib import Path

import numpy as np
import pytest

import perx
from tests.conftest import filled, transitions


def test_round_trip_restores_counters_data_trees_and_rng(tmp_path):
    buf = filled(perx.Proportional(alpha=0.7, max_priority="buffer"), capacity=30, n=44, seed=4)
    buf.update_priorities(np.arange(14, 44), np.linspace(-2, 2, 30))
    path = tmp_path / "b.perx"
    buf.save(path)
    twin = perx.ReplayBuffer.load(path)
    assert twin.next_index == 44 and len(twin) == 30
    assert twin.sampler.max_priority == buf.sampler.max_priority
    for name in ("_mass", "_heap"):
        np.testing.assert_array_equal(getattr(twin.sampler, name), getattr(buf.sampler, name))
    assert twin.sampler.rng.bit_generator.state == buf.sampler.rng.bit_generator.state
    assert os.listdir(tmp_path) == ["b.perx"]  # the exact name, no temporary left behind


def test_partially_filled_and_empty_buffers_round_trip(tmp_path):
    empty = perx.ReplayBuffer(10, perx.Proportional())
    empty.save(tmp_path / "e")
    loaded = perx.ReplayBuffer.load(tmp_path / "e")
    assert len(loaded) == 0 and loaded.spec is None
    loaded.extend(**transitions(3))
    part = filled(perx.Uniform(), capacity=10, n=3)
    part.save(tmp_path / "p")
    again = perx.ReplayBuffer.load(tmp_path / "p")
    assert len(again) == 3 and again.sample(4).indices.max() < 3


def test_failed_save_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    buf = filled(perx.Proportional(), capacity=10)
    path = tmp_path / "b"
    buf.save(path)
    good = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        buf.save(path)
    assert path.read_bytes() == good
    assert os.listdir(tmp_path) == ["b"]


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_truncated_file_gives_a_clear_error(tmp_path, keep):
    buf = filled(perx.Proportional(), capacity=50)
    path = tmp_path / "b"
    buf.save(path)
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    with pytest.raises(ValueError, match="truncated or corrupted"):
        perx.ReplayBuffer.load(path)


def test_corrupted_bytes_give_a_clear_error(tmp_path):
    buf = filled(perx.Proportional(), capacity=50)
    path = tmp_path / "b"
    buf.save(path)
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid : mid + 16] = b"\xff" * 16
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="truncated or corrupted"):
        perx.ReplayBuffer.load(path)


def test_foreign_file_is_refused(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, meta=np.frombuffer(b'{"format": "other"}', np.uint8))
    with pytest.raises(ValueError, match=r"not a saved perx\.ReplayBuffer"):
        perx.ReplayBuffer.load(path)
    (tmp_path / "t.txt").write_text("hello")
    with pytest.raises(ValueError, match="truncated or corrupted"):
        perx.ReplayBuffer.load(tmp_path / "t.txt")
    with pytest.raises(FileNotFoundError):
        perx.ReplayBuffer.load(tmp_path / "missing")


def _fuzz_load(tmp_path, trials, seed):
    """Random truncations and bit flips of saved files: load gives ValueError or an identical buffer."""
    from tests.conftest import SAMPLERS, assert_same, snapshot

    rng = np.random.default_rng(seed)
    originals = []
    for name in ("uniform", "proportional-buffermax", "rank", "rank-exact", "greedy", "lap"):
        buf = filled(SAMPLERS[name](), capacity=24, n=37, seed=1)
        batch = buf.sample(8)
        buf.update_priorities(batch.indices, rng.standard_normal(8))
        path = tmp_path / f"{name}.npz"
        buf.save(path)
        originals.append((buf, path.read_bytes()))
    outcomes = {"refused": 0, "identical": 0}
    target = tmp_path / "fuzzed.npz"
    for _ in range(trials):
        buf, raw = originals[int(rng.integers(len(originals)))]
        data = bytearray(raw)
        if rng.random() < 0.3:
            data = data[: int(rng.integers(0, len(data)))]
        else:
            for _ in range(int(rng.integers(1, 4))):
                pos = int(rng.integers(len(data)))
                data[pos] ^= 1 << int(rng.integers(8))
        target.write_bytes(bytes(data))
        try:
            twin = perx.ReplayBuffer.load(target)
        except ValueError as err:
            assert str(target) in str(err)
            outcomes["refused"] += 1
            continue
        assert_same(snapshot(buf), snapshot(twin))  # a change that loads must have changed nothing
        outcomes["identical"] += 1
    return outcomes


def test_damaged_files_load_identically_or_raise_value_error(tmp_path):
    outcomes = _fuzz_load(tmp_path, 300, seed=0)
    assert outcomes["refused"] > 200  # most damage is detected; the rest hit bytes that zip ignores


@pytest.mark.slow
def test_damaged_files_fuzz_long(tmp_path):
    outcomes = _fuzz_load(tmp_path, 5000, seed=1)
    assert outcomes["refused"] > 3000


# tests/data/v1-{p,r,u}.npz were written by perx 0.1 (commit 5cd80d9), format version 1, with:
#
#     rng = np.random.default_rng(0)
#     for name, sampler in [("p", perx.Proportional(alpha=0.7, max_priority="buffer")),
#                           ("r", perx.RankBased()), ("u", perx.Uniform())]:
#         buf = perx.ReplayBuffer(30, sampler, seed=1)
#         buf.extend(obs=rng.standard_normal((45, 3)).astype(np.float32), action=np.arange(45))
#         batch = buf.sample(8)
#         buf.update_priorities(batch.indices, rng.standard_normal(8))
#         buf.save(f"tests/data/v1-{name}.npz")
V1 = Path(__file__).parent / "data"


@pytest.mark.parametrize("name", ["p", "r", "u"])
def test_files_of_format_version_1_still_load(name):
    twin = perx.ReplayBuffer.load(V1 / f"v1-{name}.npz")
    assert twin.next_index == 45 and len(twin) == 30
    np.testing.assert_array_equal(twin._storage.data["action"][np.arange(15, 45) % 30], np.arange(15, 45))
    batch = twin.sample(16, beta=0.5)
    assert np.isfinite(batch.weights).all() and (batch.indices >= 15).all()
