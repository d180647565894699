"""A real two-node Ray cluster on this machine (``ray start`` twice): where shards and actors land, and a node
lost with its shards (issue 39 item 4). Slow: starting two nodes and waiting for Ray to declare one dead takes
about a minute; ``.ci/run`` runs it with the slow tests."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

# The driver runs in its own process: this test process may already be connected to the session's local cluster.
DRIVER = r'''
import json, sys, time
import numpy as np
import ray
import perx
from perx.distributed import ShardedReplay
from perx.distributed.apex import ApexActor, ApexConfig, _weights, build_network

address, folder, stage = sys.argv[1], sys.argv[2], sys.argv[3]
ray.init(address=address, log_to_driver=False)
deadline = time.monotonic() + 120  # node b may register after this driver connects (a loaded machine: seconds)
while sum(n["Alive"] for n in ray.nodes()) < 2 and time.monotonic() < deadline:
    time.sleep(0.5)
names = {n["NodeID"]: ("a" if "node_a" in n["Resources"] else "b") for n in ray.nodes() if n["Alive"]}
replay = ShardedReplay(4, 4 * 200, perx.Proportional(alpha=0.6), seed=0, checkpoint_dir=folder,
                       scheduling_strategy="SPREAD", memory=10_000_000)
cfg = ApexConfig(num_actors=4, num_shards=4, push_size=32, capacity=800, learning_starts=100)
Actor = ray.remote(ApexActor).options(num_cpus=0.25, scheduling_strategy="SPREAD")
actors = [Actor.remote(cfg, i, replay.shards) for i in range(4)]
replay.refresh()
weights = _weights(build_network(cfg, (4,), 2))  # CartPole's network
ray.get([a.set_weights.remote(weights, replay.shard_nodes) for a in actors])
report = {"shards": [names[n] for n in replay.shard_nodes]}
done = ray.get([a.collect.remote(200) for a in actors])
report["actors"] = [names[d["node"]] for d in done]
report["local"] = ray.get([a.__ray_call__.remote(lambda self: self.local) for a in actors])
replay.refresh()
report["next_ids"] = [s["next_id"] for s in replay.stats]
replay.checkpoint()
report["checkpointed"] = [s["next_id"] for s in replay.refresh()]
ray.get([a.collect.remote(100) for a in actors])  # pushed after the checkpoint: lost where a node dies
replay.refresh()
report["before_loss"] = [s["next_id"] for s in replay.stats]
print("RESULT", json.dumps(report), flush=True)
input()  # the test kills node b's raylet, then presses enter
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    stats = replay.refresh()
    if all(names.get(s["node"]) == "a" for s in stats):
        break
    time.sleep(0.5)
batch = replay.sample(64)
after = {"shards": [names.get(s["node"], s["node"]) for s in replay.stats],
         "next_ids": [s["next_id"] for s in replay.stats], "restarts": replay.restarts,
         "sampled": len(batch), "probabilities_sum_ok": bool(np.all(batch.probabilities > 0))}
print("RESULT", json.dumps(after), flush=True)
'''


def result(driver):
    """The driver's next report (Ray also prints its own messages to the driver's stdout); None at its end."""
    for line in driver.stdout:
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raylet_of(socket_name):
    """The pid of the raylet listening on ``socket_name`` (from /proc: no psutil needed)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"raylet") and f"--raylet_socket_name={socket_name}".encode() in cmd:
            return int(pid)
    return None


@pytest.mark.slow
def test_shards_spread_over_two_nodes_and_a_lost_nodes_shards_restart_on_the_head_from_checkpoints(tmp_path):
    ray_bin = str(Path(sys.executable).with_name("ray"))
    port = free_port()
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    env.setdefault("RAY_AUTH_MODE", "token")
    env.setdefault("RAY_AUTH_TOKEN", "0" * 64)
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "2", "--object-store-memory", str(80 * 2**20),
              "--disable-usage-stats", "--block"]
    # a short folder: Ray's unix sockets live under it, and pytest's tmp_path can exceed their 107-byte limit
    temp = tempfile.mkdtemp(prefix="perx-ray-", dir="/tmp")
    head = subprocess.Popen([ray_bin, "start", "--head", "--port", str(port), "--include-dashboard", "false",
                             "--resources", json.dumps({"node_a": 1}), "--temp-dir", temp, *common],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    nodes = [head]
    driver = None
    try:
        address = f"127.0.0.1:{port}"
        time.sleep(5)
        second = subprocess.Popen([ray_bin, "start", "--address", address, "--resources",
                                   json.dumps({"node_b": 1}), *common], env=env, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        nodes.append(second)
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, address, str(tmp_path / "ckpt"), "x"], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = result(driver)
        assert first is not None, driver.stderr.read()[-3000:]
        # SPREAD: the four shards and the four actors over both nodes
        assert sorted(first["shards"]) == ["a", "a", "b", "b"] and sorted(first["actors"]) == ["a", "a", "b", "b"]
        # every actor pushed only to the shards on its own node
        for node, local in zip(first["actors"], first["local"], strict=True):
            assert local and {first["shards"][k] for k in local} == {node}
        assert all(n > 0 for n in first["checkpointed"])
        # kill node b's raylet (kill -9): its workers, shards and actors die with it
        info = subprocess.run([sys.executable, "-c", "import json, ray, sys; ray.init(address=sys.argv[1], "
                               "log_to_driver=False); print(json.dumps(ray.nodes()))", address], env=env,
                              capture_output=True, text=True, timeout=120)
        table = json.loads(info.stdout.strip().splitlines()[-1])
        (b,) = [n for n in table if n["Alive"] and "node_b" in n["Resources"]]
        pid = raylet_of(b["RayletSocketName"])
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        driver.stdin.write("\n")
        driver.stdin.flush()
        after = result(driver)
        assert after is not None, driver.stderr.read()[-3000:]
        assert after["shards"] == ["a"] * 4  # node b's two shards now run on the head
        moved = [k for k, node in enumerate(first["shards"]) if node == "b"]
        restored = {r["shard"]: r for r in after["restarts"]}
        assert sorted(restored) == moved
        for k in moved:  # each came back from its checkpoint, and says what it lost
            assert after["next_ids"][k] == first["checkpointed"][k]
            assert restored[k]["restored_next_id"] == first["checkpointed"][k]
            assert restored[k]["lost_at_least"] == first["before_loss"][k] - first["checkpointed"][k] > 0
        assert after["sampled"] == 64
    finally:
        if driver is not None:
            driver.kill()
        for proc in reversed(nodes):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp, ignore_errors=True)
