"""Defects found by trying the core as an adversarial user (issue 8); each test failed before its fix.

Crafted files are written with numpy's own ``np.savez`` so that only their *content* is hostile.
"""

import json
import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

import perx
from tests.conftest import SAMPLERS, assert_same, filled, snapshot, transitions


def members(path):
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays.pop("meta").tobytes().decode())
    return meta, arrays


def rewrite(path, meta, arrays):
    with open(path, "wb") as f:
        np.savez(f, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)


def saved(tmp_path, sampler, capacity=20, n=30, seed=0):
    buf = filled(sampler, capacity=capacity, n=n, seed=seed)
    rng = np.random.default_rng(seed)
    batch = buf.sample(8)
    buf.update_priorities(batch.indices, rng.standard_normal(8))
    path = tmp_path / "b.npz"
    buf.save(path)
    return buf, path


def refused(path, match=None):
    with pytest.raises(ValueError, match=match) as info:
        perx.ReplayBuffer.load(path)
    assert str(path) in str(info.value)  # every load error names the file


# -- 1. untrusted files ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["rank", "greedy"])
def test_heap_positions_out_of_range_are_refused_at_load(tmp_path, name):
    _, path = saved(tmp_path, SAMPLERS[name]())
    meta, arrays = members(path)
    arrays["sampler/pos"] = arrays["sampler/pos"].copy()
    arrays["sampler/pos"][3] = 10**9  # a compiled kernel would write there on the next update
    rewrite(path, meta, arrays)
    refused(path, "pos")


@pytest.mark.parametrize("name", ["rank", "greedy"])
def test_heap_that_breaks_the_heap_order_is_refused(tmp_path, name):
    _, path = saved(tmp_path, SAMPLERS[name]())
    meta, arrays = members(path)
    keys = arrays["sampler/keys"].copy()
    keys[0], keys[5] = -1.0, keys[0]  # a negative key at the root: neither a |delta| nor a heap
    arrays["sampler/keys"] = keys
    rewrite(path, meta, arrays)
    refused(path)


def test_heap_ids_that_are_not_the_live_ids_are_refused(tmp_path):
    _, path = saved(tmp_path, SAMPLERS["rank"]())
    meta, arrays = members(path)
    ids = arrays["sampler/ids"].copy()
    ids[2] = ids[2] - 20  # the id that lived in this slot one lap ago: stale
    arrays["sampler/ids"] = ids
    rewrite(path, meta, arrays)
    refused(path)


def test_mass_on_a_never_written_slot_is_refused(tmp_path):
    buf = perx.ReplayBuffer(16, perx.Proportional(), seed=0)
    buf.extend(**transitions(5))
    path = tmp_path / "b.npz"
    buf.save(path)
    meta, arrays = members(path)
    prio = arrays["sampler/priority"].copy()
    prio[9] = 1e6  # slot 9 was never written: sampling it would return id -2 with zeroed data
    arrays["sampler/priority"] = prio
    rewrite(path, meta, arrays)
    refused(path, "priority")


@pytest.mark.parametrize("value", [np.nan, -1.0, np.inf])
def test_bad_saved_priorities_are_refused(tmp_path, value):
    _, path = saved(tmp_path, perx.Proportional())
    meta, arrays = members(path)
    prio = arrays["sampler/priority"].copy()
    prio[1] = value
    arrays["sampler/priority"] = prio
    rewrite(path, meta, arrays)
    refused(path, "priority")


def test_a_saved_tree_is_not_trusted_it_is_rebuilt_from_the_priorities(tmp_path):
    buf, path = saved(tmp_path, perx.Proportional(alpha=0.7))
    twin = perx.ReplayBuffer.load(path)
    for name in ("_mass", "_heap"):
        np.testing.assert_array_equal(getattr(twin.sampler, name), getattr(buf.sampler, name))
    meta, arrays = members(path)
    assert "sampler/nodes" not in arrays
    arrays["sampler/nodes"] = np.zeros(4)  # an extra array is refused, not silently ignored
    rewrite(path, meta, arrays)
    refused(path, "nodes")


def test_historical_max_below_a_stored_priority_is_refused(tmp_path):
    _, path = saved(tmp_path, perx.Proportional())
    meta, arrays = members(path)
    meta["sampler"]["state"]["max_priority"] = 1e-3
    rewrite(path, meta, arrays)
    refused(path, "max_priority")


def test_next_id_and_data_rows_must_agree(tmp_path):
    _, path = saved(tmp_path, perx.Uniform())
    meta, arrays = members(path)
    meta["next_id"] = 5  # 5 transitions, but 20 rows saved
    rewrite(path, meta, arrays)
    refused(path)
    meta["next_id"] = -3
    rewrite(path, meta, arrays)
    refused(path, "next_id")


def test_exact_rank_file_with_a_wrong_id_is_refused(tmp_path):
    _, path = saved(tmp_path, SAMPLERS["rank-exact"]())
    meta, arrays = members(path)
    ids = arrays["sampler/ids"].copy()
    ids[4] += 1
    arrays["sampler/ids"] = ids
    rewrite(path, meta, arrays)
    refused(path)


def test_crafted_segment_cache_is_refused(tmp_path):
    buf = perx.ReplayBuffer(100, perx.RankBased(), seed=0)
    buf.extend(**transitions(60))
    buf.sample(8)
    path = tmp_path / "b.npz"
    buf.save(path)
    meta, arrays = members(path)
    meta["sampler"]["state"]["segments"] = [[8, 10**6]]  # boundaries for a million transitions
    rewrite(path, meta, arrays)
    refused(path, "segments")


def test_load_never_unpickles(tmp_path):
    _, path = saved(tmp_path, perx.Uniform())
    meta, arrays = members(path)
    arrays["data/obs"] = np.array([object()] * 20, dtype=object)
    with open(path, "wb") as f:
        np.savez(f, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
    refused(path)


# -- 2. overflowing and underflowing masses -------------------------------------------------------

def test_a_mass_that_overflows_is_refused_and_names_the_largest_priority():
    buf = filled(perx.Proportional(alpha=5.0), capacity=8)
    before = snapshot(buf)
    with pytest.raises(ValueError, match=r"td_errors.*1e\+300.*largest accepted priority"):
        buf.update_priorities([0, 1], [1.0, 1e300])
    assert_same(before, snapshot(buf))


def test_a_sum_of_masses_that_would_overflow_is_refused():
    buf = filled(perx.Proportional(alpha=1.0, eps=0.0), capacity=2)
    with pytest.raises(ValueError, match="priorities"):
        buf.set_priorities([0, 1], [1e308, 1e308])
    limit = buf.sampler.max_accepted_priority
    assert buf.set_priorities([0, 1], [limit, limit]) == 2  # the largest accepted value is accepted
    assert np.isfinite(buf.sampler.total_mass)
    assert np.isfinite(buf.probabilities()).all() and np.isfinite(buf.sample(4, beta=1.0).weights).all()


def test_priorities_at_the_limit_keep_probabilities_and_weights_exact():
    buf = filled(perx.Proportional(alpha=1.0, eps=0.0), capacity=1000)
    big = buf.sampler.max_accepted_priority
    prios = np.full(1000, 1.0)
    prios[:3] = big
    buf.set_priorities(np.arange(1000), prios)
    p = buf.probabilities()
    assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-12
    counts = np.bincount(buf.sample(3000).indices, minlength=1000)
    assert counts[:3].sum() == 3000  # the dominant items are the ones drawn


def test_masses_that_underflow_to_zero_give_a_clear_error_not_nan():
    buf = filled(perx.Proportional(alpha=2.0, eps=0.0), capacity=4)
    buf.set_priorities(np.arange(4), np.full(4, 1e-200))  # (1e-200)^2 underflows to 0
    with pytest.raises(ValueError, match="underflow"):
        buf.sample(2)
    with pytest.raises(ValueError, match="underflow"):
        buf.probabilities()


def test_weights_spanning_six_hundred_orders_of_magnitude_do_not_underflow():
    """(m_i / m_min)^-beta overflows in the ratio; computed in log space it is exact."""
    buf = filled(perx.Proportional(alpha=1.0, eps=0.0, stratified=False, normalize="buffer"), capacity=2)
    buf.set_priorities([0, 1], [1e300, 1e-300])
    batch = buf.sample(16, beta=0.5)
    assert (batch.indices == 0).all()
    np.testing.assert_allclose(batch.weights, 1e-300, rtol=1e-12)  # (1e600)^-0.5
    buf.set_priorities([0, 1], [1e-200, 1e200])
    np.testing.assert_allclose(buf.sample(16, beta=0.75).weights, 1e-300, rtol=1e-12)  # (1e400)^-0.75


# -- 3. exact save/load for RankBased's segment cache ----------------------------------------------

@pytest.mark.parametrize("exact", [False, True])
def test_rank_based_round_trips_its_segment_cache(tmp_path, exact):
    buf = perx.ReplayBuffer(10_000, perx.RankBased(exact=exact), seed=3)
    buf.extend(**transitions(3000))
    batch = buf.sample(32)
    buf.update_priorities(batch.indices, np.arange(32.0))
    buf.extend(**transitions(20, start=3000))  # N grows by < 1%: the cached boundaries stretch
    buf.save(tmp_path / "r.npz")
    twin = perx.ReplayBuffer.load(tmp_path / "r.npz")
    for step in range(20):
        a, b = buf.sample(32, beta=0.5), twin.sample(32, beta=0.5)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.probabilities, b.probabilities)
        np.testing.assert_array_equal(a.weights, b.weights)
        new = transitions(5, start=buf.next_index)
        buf.extend(**new)
        twin.extend(**new)
        if step % 5 == 0:
            buf.save(tmp_path / "r.npz")  # and again, with the stretched cache in use
            twin = perx.ReplayBuffer.load(tmp_path / "r.npz")


# -- 4. integer and float casts that do not fit -------------------------------------------------------

@pytest.mark.parametrize(("dtype", "value"), [(np.int8, 300), (np.int8, -129), (np.uint8, -1),
                                              (np.uint8, 256), (np.int64, 2**64 - 1), (np.int32, 2**31),
                                              (np.float32, 1e39), (np.float16, 70000.0)])
def test_values_that_do_not_fit_the_field_are_refused(dtype, value):
    buf = perx.ReplayBuffer(4, spec={"x": ((), dtype), "y": ((2,), dtype)})
    buf.add(x=1, y=[1, 2])
    before = snapshot(buf)
    with pytest.raises((TypeError, ValueError), match="x"):
        buf.add(x=value, y=[1, 2])
    with pytest.raises((TypeError, ValueError), match="y"):
        buf.extend(x=[1, 2], y=[[1, 2], [value, 3]])
    assert_same(before, snapshot(buf))


def test_values_that_fit_a_narrower_field_are_stored_exactly():
    buf = perx.ReplayBuffer(4, spec={"a": ((), np.int8), "r": ((), np.float32), "u": ((), np.uint8)})
    buf.extend(a=np.array([-128, 127]), r=np.array([1e38, -np.inf]), u=np.array([0, 255]))
    assert buf._storage.data["a"][:2].tolist() == [-128, 127]
    assert buf._storage.data["u"][:2].tolist() == [0, 255]
    assert buf._storage.data["r"][1] == -np.inf  # an infinity stays one; only finite overflow is refused


# -- 5. corrupt and crafted files: always ValueError with the path, no global side effects -------------

def _flip_central(path, offset, value):
    raw = bytearray(path.read_bytes())
    pos = raw.find(b"PK\x01\x02")
    raw[pos + offset] = value
    path.write_bytes(bytes(raw))


def test_compression_method_flipped(tmp_path):
    _, path = saved(tmp_path, perx.Proportional())
    _flip_central(path, 10, 99)  # compression method 99: NotImplementedError inside zipfile
    refused(path)


def test_encryption_flag_set(tmp_path):
    _, path = saved(tmp_path, perx.Proportional())
    _flip_central(path, 8, 1)  # general purpose flag bit 0: "encrypted", RuntimeError inside zipfile
    refused(path)


def test_plain_npy_file(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(10))
    refused(path)


def test_member_renamed(tmp_path):
    _, path = saved(tmp_path, perx.Proportional())
    raw = path.read_bytes().replace(b"meta.npy", b"mxta.npy")
    path.write_bytes(raw)
    refused(path)


@pytest.mark.parametrize("name", ["seed", "Generator", "RandomState", "__class__", "PCG64x"])
def test_bit_generator_name_that_is_not_a_bit_generator(tmp_path, name):
    _, path = saved(tmp_path, perx.Uniform())
    meta, arrays = members(path)
    meta["sampler"]["state"]["rng"]["bit_generator"] = name
    rewrite(path, meta, arrays)
    np.random.seed(123)  # noqa: NPY002 - the legacy global generator is what must stay untouched
    expected = np.random.get_state()[1].copy()  # noqa: NPY002
    refused(path, "bit_generator")
    np.testing.assert_array_equal(np.random.get_state()[1], expected)  # noqa: NPY002


def test_bit_generator_state_that_does_not_fit(tmp_path):
    _, path = saved(tmp_path, perx.Uniform())
    meta, arrays = members(path)
    meta["sampler"]["state"]["rng"]["state"] = {"state": "x"}
    rewrite(path, meta, arrays)
    refused(path, "rng")


def test_other_bit_generators_round_trip(tmp_path):
    buf = filled(perx.Uniform(), capacity=10)
    buf.sampler._rng = np.random.Generator(np.random.Philox(7))
    buf.save(tmp_path / "p.npz")
    twin = perx.ReplayBuffer.load(tmp_path / "p.npz")
    np.testing.assert_array_equal(buf.sample(5).indices, twin.sample(5).indices)


@pytest.mark.parametrize("capacity", [10**15, 2**62, -1, 0, 1.5, "10", True])
def test_impossible_capacity_in_the_metadata(tmp_path, capacity):
    _, path = saved(tmp_path, perx.Proportional())
    meta, arrays = members(path)
    meta["capacity"] = capacity
    rewrite(path, meta, arrays)
    refused(path)


@pytest.mark.parametrize("change", [
    lambda m: m.update(spec={"obs": [[3], "O"]}),
    lambda m: m.update(spec={"obs": [[-3], "<f4"]}),
    lambda m: m.update(spec=5),
    lambda m: m["sampler"].update(name="Proportional"),  # a Uniform file claiming to be Proportional
    lambda m: m["sampler"].update(config={"alpha": "x"}),
    lambda m: m["sampler"].update(config={"nope": 1}),
    lambda m: m["sampler"].update(name="Sampler"),
    lambda m: m.update(format=None),
    lambda m: m.update(next_id="7"),
])
def test_crafted_metadata_is_refused(tmp_path, change):
    _, path = saved(tmp_path, perx.Uniform())
    meta, arrays = members(path)
    change(meta)
    rewrite(path, meta, arrays)
    refused(path)


def test_a_sampler_name_swap_is_refused(tmp_path):
    _, path = saved(tmp_path, perx.Proportional())
    meta, arrays = members(path)
    meta["sampler"] = {"name": "Uniform", "config": {}, "state": {"rng": meta["sampler"]["state"]["rng"]}}
    rewrite(path, meta, arrays)
    refused(path, "priority")  # its arrays are not a Uniform sampler's: refused, not ignored


# -- 6. RankBased with alpha = 0 and k = N -------------------------------------------------------------

@pytest.mark.parametrize("alpha", [0.0, 0.7, 3.0])
def test_rank_based_with_as_many_segments_as_transitions(alpha):
    for n in [*range(1, 80), 255, 256, 1000, 4097]:
        buf = perx.ReplayBuffer(n, perx.RankBased(alpha=alpha), seed=n)
        buf.extend(**transitions(n))
        for k in sorted({1, 2, max(1, n // 2), n}):
            batch = buf.sample(k, beta=0.5)
            assert np.isfinite(batch.weights).all() and (batch.weights > 0).all() and batch.weights.max() <= 1
            p = buf.probabilities(batch_size=k)
            assert (p > 0).all() and abs(p.sum() - 1) < 1e-9
        if alpha == 0.0:  # uniform: the segments coincide with the positions, nothing straddles
            np.testing.assert_allclose(buf.probabilities(batch_size=n), 1 / n, rtol=1e-9)


# -- 7. temporary files of killed saves ------------------------------------------------------------------

def test_leftovers_of_a_killed_save_are_removed_by_the_next_save(tmp_path):
    path = tmp_path / "b.npz"
    script = (
        "import os, sys, numpy as np, perx\n"
        "buf = perx.ReplayBuffer(100, perx.Proportional()); buf.extend(obs=np.zeros((100, 3)))\n"
        "os.replace = lambda *a: os._exit(9)  # killed just before the rename\n"
        f"buf.save({str(path)!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == 9, proc.stderr.decode()
    leftovers = [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert len(leftovers) == 1 and not path.exists()
    # files that are not leftovers of saves of *this* path stay: another target, a user file
    (tmp_path / ".other.npz.tmp").write_bytes(b"x")
    (tmp_path / "b.npz.notes").write_text("mine")
    live = tmp_path / f".b.npz.perx-{socket.gethostname()}-1-abcdef.tmp"  # pid 1 is alive
    live.write_bytes(b"in progress elsewhere")
    buf = filled(perx.Uniform(), capacity=5)
    buf.save(path)
    assert sorted(os.listdir(tmp_path)) == sorted(["b.npz", ".other.npz.tmp", "b.npz.notes", live.name])


# -- 8. a failed first allocation --------------------------------------------------------------------

def test_a_failed_first_allocation_leaves_the_buffer_usable():
    buf = perx.ReplayBuffer(10**13)
    with pytest.raises(MemoryError, match="capacity"):
        buf.add(obs=np.zeros(4, np.float32), action=1)
    assert buf.spec is None and len(buf) == 0
    with pytest.raises(MemoryError, match="capacity"):  # the same clear error again, not a KeyError
        buf.add(obs=np.zeros(4, np.float32), action=1)


def test_a_failed_sampler_allocation_is_a_clear_memory_error():
    with pytest.raises(MemoryError, match="capacity"):
        perx.ReplayBuffer(10**13, perx.Proportional())


# -- 9. LAP's floor above the initial priority ----------------------------------------------------------

@pytest.mark.parametrize("mode", ["historical", "buffer"])
@pytest.mark.parametrize("kappa", [0.5, 2.0, 10.0])
def test_new_transitions_are_never_below_the_priority_floor(mode, kappa):
    buf = perx.ReplayBuffer(8, perx.LAP(kappa=kappa, max_priority=mode))
    buf.extend(**transitions(4))
    assert (buf.sampler.priorities(np.arange(4)) == max(1.0, kappa)).all()
    buf.update_priorities([0, 1], [0.0, 0.0])  # replayed with delta = 0: at the floor
    new = buf.extend(**transitions(1, start=4))
    p = buf.sampler.priorities(new % 8)[0]
    assert p >= buf.sampler.priorities(np.array([0]))[0] and p >= kappa


def test_eps_above_one_raises_the_initial_priority_too():
    buf = perx.ReplayBuffer(8, perx.Proportional(eps=3.0))
    buf.extend(**transitions(2))
    assert buf.sampler.max_priority == 3.0


# -- 10. threads ---------------------------------------------------------------------------------------

def _check_invariants(buf):
    sampler = buf.sampler
    n = len(buf)
    live = np.arange(buf.next_index - n, buf.next_index)
    obs = buf._storage.data["obs"][live % buf.capacity, 0]
    np.testing.assert_array_equal(obs, live.astype(np.float32))  # every row is the row of its id
    if isinstance(sampler, perx.Proportional):
        for now, rebuilt in zip((sampler._mass, sampler._heap), sampler._rebuilt(len(buf)),
                                strict=True):
            np.testing.assert_array_equal(now, rebuilt)
        # numpy's pow may differ from the compiled kernels' in the last bit
        np.testing.assert_allclose(sampler.masses[:n], sampler.priorities(np.arange(n)) ** sampler.alpha,
                                   rtol=1e-15)
    if isinstance(sampler, perx.RankBased) and not sampler.exact:
        from perx.samplers import _heap
        assert _heap.is_heap(sampler._keys, sampler._ids, sampler._pos, n, buf.capacity)
        assert set(sampler._ids[:n].tolist()) == set(live.tolist())
    if isinstance(sampler, perx.Greedy):
        from perx.samplers import _greedy
        _greedy.check(*sampler._arrays(), buf.capacity)
        assert set(sampler.state_dict()[1]["ids"][:n].tolist()) == set(live.tolist())


@pytest.mark.parametrize("name", ["uniform", "proportional", "proportional-buffermax", "rank", "greedy",
                                  "rank-exact", "lap"])
def test_actor_and_learner_threads_with_a_locked_buffer(name):
    buf = perx.ReplayBuffer(500, SAMPLERS[name](), seed=0, lock=True)
    buf.extend(**transitions(64))
    stop = threading.Event()
    errors = []

    def actor():
        start = 64
        while not stop.is_set():
            buf.extend(**transitions(37, start=start))
            start += 37

    def learner():
        rng = np.random.default_rng(1)
        try:
            for _ in range(300):
                batch = buf.sample(32, beta=0.5)
                # the rows are the rows of the returned ids even while the actor writes
                np.testing.assert_array_equal(batch["obs"][:, 0], batch.indices.astype(np.float32))
                buf.update_priorities(batch.indices, rng.standard_normal(32))
        except Exception as err:  # reported below, after the actor is stopped
            errors.append(err)

    threads = [threading.Thread(target=actor), threading.Thread(target=learner)]
    threads[1].start()
    threads[0].start()
    threads[1].join()
    stop.set()
    threads[0].join()
    assert not errors, errors[0]
    assert buf.next_index > 64
    _check_invariants(buf)


def test_the_lock_can_be_held_across_calls():
    buf = filled(perx.Proportional(), capacity=20)
    assert buf.lock is None
    locked = perx.ReplayBuffer(20, perx.Proportional(), lock=True)
    locked.extend(**transitions(20))
    with locked.lock:  # reentrant: a user can make sample + update one atomic step
        batch = locked.sample(4)
        locked.update_priorities(batch.indices, np.ones(4))


# -- 11. smaller ---------------------------------------------------------------------------------------

def test_ragged_lists_in_extend_name_the_field():
    buf = perx.ReplayBuffer(8)
    with pytest.raises(ValueError, match="obs"):
        buf.extend(obs=[[1.0, 2.0], [3.0]], action=[1, 2])
    assert buf.spec is None
    buf.extend(obs=[[1.0, 2.0], [3.0, 4.0]], action=[1, 2])
    with pytest.raises(ValueError, match="obs"):
        buf.extend(obs=[[1.0, 2.0], [3.0]], action=[1, 2])


@pytest.mark.parametrize("ids, values, name", [([0, 1], [1.0, [2.0, 3.0]], "td_errors"),
                                                ([0, [1, 2]], [1.0, 2.0], "indices")])
def test_ragged_ids_or_td_errors_name_the_argument_and_change_nothing(ids, values, name):
    buf = filled(perx.Proportional(), capacity=4)
    before = buf.priorities(np.arange(4)).copy()
    with pytest.raises(ValueError, match=rf"{name}: expected a 1-D array of numbers, got a ragged sequence"):
        buf.update_priorities(ids, values)
    np.testing.assert_array_equal(buf.priorities(np.arange(4)), before)


@pytest.mark.parametrize("values", [[True, False], np.array([True, True])])
def test_bool_td_errors_are_refused(values):
    buf = filled(perx.Proportional(), capacity=4)
    with pytest.raises(TypeError, match=r"td_errors.*bool"):
        buf.update_priorities([0, 1], values)
    with pytest.raises(TypeError, match=r"priorities.*bool"):
        buf.set_priorities([0, 1], values)


def test_torch_tensors_with_grad_are_detached():
    torch = pytest.importorskip("torch")
    buf = filled(perx.Proportional(alpha=1.0, eps=0.0), capacity=4)
    td = torch.tensor([0.5, -2.0], requires_grad=True) * 2
    assert buf.update_priorities(torch.tensor([0, 1]), td) == 2
    assert buf.sampler.priorities(np.array([0, 1])).tolist() == [1.0, 4.0]
    assert buf.set_priorities(torch.tensor([2]), torch.tensor([3.0], requires_grad=True)) == 1
    buf.add(**{k: torch.as_tensor(v[0]) for k, v in transitions(1, start=4).items()})
    assert buf.next_index == 5


def test_the_pure_weight_function_is_exact_across_six_hundred_orders_of_magnitude():
    p = np.array([0.5, 1e-310])
    np.testing.assert_allclose(perx.importance_weights(p, 2, 1.0, min_probability=1e-310), [2e-310, 1.0], rtol=1e-9)
    np.testing.assert_allclose(perx.importance_weights(p, 2, 0.5, normalize="batch"), [np.sqrt(2e-310), 1.0],
                               rtol=1e-9)


# -- found by an independent review in the seventeenth pass of issue 14 (each failed before its fix) ----------------

@pytest.mark.parametrize("seed", [-1, 1.5, "abc", np.float64(2.0)])
def test_a_refused_seed_names_seed_and_leaves_the_sampler_unbound(seed):
    sampler = perx.Proportional(alpha=0.6)
    with pytest.raises(ValueError, match="seed"):
        perx.ReplayBuffer(10, sampler, seed=seed)
    assert sampler.capacity is None
    perx.ReplayBuffer(10, sampler, seed=0)  # the same sampler is still usable


def test_an_mt19937_state_with_its_position_out_of_range_is_refused(tmp_path):
    """numpy accepts any position into MT19937's 624-word key, and the next draw then reads out of bounds
    (the process crashed)."""
    buf = filled(perx.Uniform(), capacity=10)
    buf.sampler._rng = np.random.Generator(np.random.MT19937(3))
    path = tmp_path / "mt.npz"
    buf.save(path)
    assert perx.ReplayBuffer.load(path).sample(3).indices.shape == (3,)  # a genuine MT19937 state loads
    meta, arrays = members(path)
    meta["sampler"]["state"]["rng"]["state"]["pos"] = 2**31 - 1
    rewrite(path, meta, arrays)
    refused(path, "pos")


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_a_refused_sampler_state_leaves_a_live_sampler_as_it_was(name):
    """load_state_dict on a live sampler checks everything before it keeps anything, generator included: after
    a refused state the next samples are those of a twin that never saw it."""
    buf, twin = filled(SAMPLERS[name](), capacity=30), filled(SAMPLERS[name](), capacity=30)
    meta, arrays = buf.sampler.state_dict()
    meta, arrays = json.loads(json.dumps(meta)), {k: v.copy() for k, v in arrays.items()}
    meta["rng"] = json.loads(json.dumps(perx.Uniform(seed=99).state_dict()[0]["rng"]))  # a valid, other generator
    broken = False
    for key, arr in arrays.items():  # one array made invalid for its sampler
        if arr.dtype.kind == "f":
            arr[:] = -1.0
            broken = True
        elif key in ("pos", "state"):
            arr[:] = 10**6
            broken = True
    if not broken:
        pytest.skip("a sampler with no array to break")
    before = snapshot(buf)
    with pytest.raises(ValueError):
        buf.sampler.load_state_dict(meta, arrays, size=len(buf), next_id=buf.next_index)
    assert_same(before, snapshot(buf))
    for _ in range(3):
        a, b = buf.sample(4), twin.sample(4)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.weights, b.weights)


def test_every_priority_an_update_accepts_also_loads(tmp_path):
    """max_accepted_priority is exactly the largest priority the update accepts: it used to step only down from
    its estimate, so for about a third of alphas an update could store a priority one float above it, and the
    saved file was then refused by load."""
    rng = np.random.default_rng(0)
    for alpha in np.concatenate([[1.9290369775982903], rng.uniform(0.05, 3.0, 200)]):
        sampler = perx.Proportional(alpha=float(alpha), eps=0.0)
        buf = filled(sampler, capacity=8)
        limit = sampler.max_accepted_priority
        assert buf.set_priorities([3], [limit]) == 1
        if limit < np.finfo(np.float64).max:  # (else the next float is inf, refused as not finite)
            with pytest.raises(ValueError, match="largest accepted priority"):
                buf.set_priorities([4], [float(np.nextafter(limit, np.inf))])
    buf.save(tmp_path / "limit.npz")
    assert perx.ReplayBuffer.load(tmp_path / "limit.npz").priorities([3])[0] == limit


def test_an_overflowing_priority_is_refused_with_alpha_zero_too(tmp_path):
    """With alpha = 0 every mass is 1, so the mass test alone let |td_error| + eps = inf be stored (and the saved
    file was refused); priorities must be finite whatever alpha."""
    buf = filled(perx.Proportional(alpha=0.0, eps=1e308), capacity=4)
    before = snapshot(buf)
    with pytest.raises(ValueError, match=r"td_errors.*overflowed"):
        buf.update_priorities([0], [1e308])
    assert_same(before, snapshot(buf))
    assert np.isfinite(buf.sampler.max_accepted_priority)
    _, path = saved(tmp_path, perx.Proportional(alpha=0.0))
    meta, arrays = members(path)
    meta["sampler"]["state"]["max_priority"] = float("inf")
    rewrite(path, meta, arrays)
    refused(path, "max_priority")


def test_a_uint64_id_too_large_for_int64_is_reported_as_given():
    buf = filled(perx.Proportional(alpha=0.6), capacity=8)
    before = snapshot(buf)
    with pytest.raises(ValueError, match="indices: 9223372036854775828 "):
        buf.update_priorities(np.array([1, 2**63 + 20], np.uint64), [0.5, 0.5])
    assert_same(before, snapshot(buf))


def test_a_locked_buffer_can_be_copied_and_pickled_and_the_copy_locks_itself():
    """(a threading lock cannot be pickled: copy.deepcopy and pickle of a lock=True buffer raised TypeError)"""
    import copy
    import pickle

    buf = perx.ReplayBuffer(20, perx.Proportional(alpha=0.6), seed=0, lock=True)
    buf.extend(**transitions(30))
    for make in (copy.deepcopy, copy.copy, lambda b: pickle.loads(pickle.dumps(b))):
        clone = make(buf)
        # a copy shares nothing with the original: a shallow copy would share its rows and trees, not its lock
        assert clone.sampler is not buf.sampler and clone._storage is not buf._storage
        assert isinstance(clone.lock, type(buf.lock)) and clone.lock is not buf.lock
        assert clone.add.__wrapped__.__self__ is clone and clone.sample.__wrapped__.__self__ is clone
        a, b = buf.sample(6, beta=0.5), clone.sample(6, beta=0.5)
        np.testing.assert_array_equal(a.indices, b.indices)
        buf.update_priorities(a.indices, np.arange(6.0))
        clone.update_priorities(b.indices, np.arange(6.0))
        np.testing.assert_array_equal(buf.sample(6).indices, clone.sample(6).indices)
        assert not clone.lock._is_owned()  # the copy's own lock, free after its calls
