"""Shard checkpoints at an fsspec URL: what a cluster without a shared file system uses (issue 39 item 7)."""

import time
import uuid

import numpy as np
import pytest

import perx

pytest.importorskip("ray")
fsspec = pytest.importorskip("fsspec")

from perx.distributed import Shard, ShardedReplay  # noqa: E402
from perx.distributed.store import CheckpointStore, is_url  # noqa: E402


def memory_url():
    # fsspec's memory file system lives in this process only: a second Shard built here stands for a
    # process restarted on another node that reaches the same store
    return f"memory://perx-test/{uuid.uuid4().hex}"


def test_a_shard_restarted_elsewhere_restores_its_checkpoint_from_the_url():
    url = memory_url()
    first = Shard(0, 16, perx.Proportional(alpha=1.0), seed=0, checkpoint_dir=url, job="j")
    first.add({"x": np.arange(6.0)}, priorities=np.arange(1.0, 7.0))
    assert first.checkpoint() == f"{url}/shard-0.perx"
    first.add({"x": np.arange(6.0, 9.0)})  # after the checkpoint: lost with the process
    again = Shard(0, 16, perx.Proportional(alpha=1.0), seed=0, checkpoint_dir=url, job="j")
    assert again.incarnation == 1 and again.restored_from == f"{url}/shard-0.perx"
    assert again.restores[-1] == [1, 6] and len(again.buffer) == 6
    np.testing.assert_array_equal(again.buffer.get(np.arange(6))["x"], np.arange(6.0))
    assert again.buffer.mass_totals()[0] == pytest.approx(21.0)  # the priorities came back with the data


def test_a_new_job_at_the_same_url_starts_empty_and_removes_the_old_checkpoint():
    url = memory_url()
    old = Shard(0, 16, perx.Proportional(alpha=1.0), checkpoint_dir=url, job="a")
    old.add({"x": np.arange(4.0)})
    old.checkpoint()
    new = Shard(0, 16, perx.Proportional(alpha=1.0), checkpoint_dir=url, job="b")
    assert new.incarnation == 0 and len(new.buffer) == 0
    assert not CheckpointStore(url).exists("shard-0.perx")


def test_a_failed_upload_leaves_the_previous_checkpoint_whole(monkeypatch):
    url = memory_url()
    shard = Shard(0, 16, perx.Uniform(), checkpoint_dir=url, job="j")
    shard.add({"x": np.arange(5.0)})
    shard.checkpoint()
    shard.add({"x": np.arange(5.0, 8.0)})

    def broken_move(self, *args, **kwargs):
        raise OSError("connection reset")

    monkeypatch.setattr(type(shard._store.fs), "mv", broken_move)
    with pytest.raises(OSError, match="connection reset"):
        shard.checkpoint()
    monkeypatch.undo()
    restored = CheckpointStore(url).load_buffer("shard-0.perx")
    assert len(restored) == 5  # the old generation, not a half-written new one


def test_local_paths_and_urls_are_told_apart_and_a_bad_protocol_names_the_argument(tmp_path):
    assert not is_url(str(tmp_path)) and not is_url(tmp_path) and is_url("s3://bucket/run")
    assert CheckpointStore(tmp_path).location == str(tmp_path.resolve())
    with pytest.raises(ValueError, match="checkpoint_dir: cannot open 'nosuchprotocol://x'"):
        CheckpointStore("nosuchprotocol://x")


def test_sharded_replay_restores_a_killed_shard_through_an_fsspec_url(ray_cluster, tmp_path):
    import ray

    # file:// goes through fsspec in the shard actors, as s3:// or gs:// would
    url = f"file://{tmp_path}/ckpt"
    replay = ShardedReplay(2, 40, perx.Proportional(alpha=1.0), seed=0, checkpoint_dir=url)
    try:
        replay.add(shard=0, obs=np.arange(8.0)[:, None])
        replay.add(shard=1, obs=np.arange(8.0, 12.0)[:, None])
        replay.checkpoint()
        replay.add(shard=0, obs=np.arange(20.0, 23.0)[:, None])
        assert (tmp_path / "ckpt" / "shard-0.perx").exists()
        incarnation = replay.stats[0]["incarnation"]
        ray.kill(replay.shards[0], no_restart=False)
        deadline = time.monotonic() + 120
        while replay.refresh()[0]["incarnation"] == incarnation and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = replay.refresh()[0]
        assert stats["size"] == 8 and stats["restored_next_id"] == 8
        assert replay.restarts[0]["lost_at_least"] == 3
    finally:
        replay.close()
