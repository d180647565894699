"""Circular storage of named fields: layouts, dtypes, batch writes, wrap-around."""

import numpy as np
import pytest

import perx
from perx.storage import Storage
from tests.conftest import transitions


def test_first_add_fixes_fields_shapes_and_dtypes():
    buf = perx.ReplayBuffer(5)
    buf.add(obs=np.zeros((2, 3), np.uint8), action=1, reward=0.5, terminated=True, truncated=False)
    spec = buf.spec
    assert spec["obs"] == perx.FieldSpec((2, 3), np.dtype(np.uint8))
    assert spec["action"].dtype == np.int64 and spec["reward"].dtype == np.float64
    assert spec["terminated"].dtype == np.bool_ and spec["truncated"].dtype == np.bool_
    assert "done" not in spec  # terminated and truncated are never merged


def test_explicit_spec_preallocates_and_casts_safely():
    spec = {"obs": ((84, 84), np.uint8), "action": ((), np.int32), "reward": ((), np.float32),
            "terminated": ((), bool), "truncated": ((), bool)}
    buf = perx.ReplayBuffer(3, spec=spec)
    assert buf._storage.data["obs"].shape == (3, 84, 84)
    buf.add(obs=np.ones((84, 84), np.uint8), action=2, reward=1.0, terminated=False, truncated=True)
    batch = buf.sample(2)
    assert batch["obs"].dtype == np.uint8 and batch["reward"].dtype == np.float32
    assert batch["truncated"].tolist() == [True, True] and batch["terminated"].tolist() == [False, False]


def test_extend_writes_rows_in_order_and_wraps_around():
    buf = perx.ReplayBuffer(5)
    buf.extend(**transitions(3))
    ids = buf.extend(**transitions(4, start=3))  # ids 3..6 -> slots 3, 4, 0, 1
    assert ids.tolist() == [3, 4, 5, 6]
    assert buf._storage.data["obs"][:, 0].tolist() == [5, 6, 2, 3, 4]
    assert len(buf) == 5 and buf.next_index == 7


def test_oversized_extend_keeps_the_last_capacity_rows():
    buf = perx.ReplayBuffer(4, perx.Proportional())
    ids = buf.extend(**transitions(10))
    assert ids.tolist() == list(range(10))
    assert sorted(buf._storage.data["obs"][:, 0].tolist()) == [6, 7, 8, 9]
    assert buf.update_priorities(ids, np.ones(10)) == 4  # ids 0..5 are stale at once
    batch = buf.sample(50)
    assert set(batch.indices.tolist()) <= {6, 7, 8, 9}


def test_single_adds_and_batch_adds_store_the_same_rows():
    a, b = perx.ReplayBuffer(6), perx.ReplayBuffer(6)
    data = transitions(9)
    for i in range(9):
        a.add(**{k: v[i] for k, v in data.items()})
    b.extend(**data)
    for key in data:
        np.testing.assert_array_equal(a._storage.data[key], b._storage.data[key])


def test_empty_extend_is_a_no_op():
    buf = perx.ReplayBuffer(4)
    buf.extend(**transitions(2))
    empty = {k: v[:0] for k, v in transitions(2).items()}
    assert buf.extend(**empty).tolist() == []
    assert len(buf) == 2


def test_extend_without_batch_axis_is_refused():
    buf = perx.ReplayBuffer(4)
    with pytest.raises(ValueError, match="leading batch axis"):
        buf.extend(obs=1.0, action=2)
    assert len(buf) == 0 and buf.spec is None


def test_unstorable_dtype_is_refused():
    buf = perx.ReplayBuffer(4)
    with pytest.raises(TypeError, match="note"):
        buf.add(obs=np.zeros(2), note="hello")
    assert buf.spec is None


def test_bad_spec_is_refused():
    with pytest.raises(TypeError, match="spec"):
        perx.ReplayBuffer(4, spec={"obs": "float32"})
    with pytest.raises(TypeError, match="spec"):
        perx.ReplayBuffer(4, spec=[("obs", (3,), np.float32)])


def test_a_cast_error_on_an_inferred_field_says_where_the_dtype_came_from():
    buf = perx.ReplayBuffer(4)
    buf.add(obs=np.zeros(2, np.float32), action=1)  # action inferred as int64
    with pytest.raises(TypeError, match=r"inferred from the first add.*spec=\{'action'"):
        buf.add(obs=np.zeros(2, np.float32), action=0.5)
    explicit = perx.ReplayBuffer(4, spec={"obs": ((2,), np.float32), "action": ((), np.int64)})
    with pytest.raises(TypeError) as info:
        explicit.add(obs=np.zeros(2, np.float32), action=0.5)
    assert "inferred" not in str(info.value)


def test_fields_are_aligned_views_into_one_row_per_transition():
    spec = {"obs": ((3,), np.float32), "flag": ((), np.bool_), "action": ((), np.int64), "reward": ((), np.float32),
            "img": ((2, 2), np.uint8), "pair": ((2,), np.float64)}
    st = Storage(10, spec)
    # 8-byte multiples first (action 8, pair 16), then by item size: obs 12 (float32), reward 4, img 4, flag 1
    assert st.rows.shape == (10, 48) and st.rows.dtype == np.uint8
    for name, arr in st.data.items():
        assert arr.base is not None and np.shares_memory(arr, st.rows), name
        assert arr.flags.aligned and arr.shape == (10, *spec[name][0]), name
    st.data["obs"][4] = [1.5, -2.0, 3.0]
    st.data["flag"][4] = True
    row = st.rows[4]
    off = st._layout.offset
    assert row[off["obs"] : off["obs"] + 12].view(np.float32).tolist() == [1.5, -2.0, 3.0]
    assert row[off["flag"]] == 1
    assert st.rows.shape[1] % 8 == 0 and off["action"] % 8 == 0 and off["pair"] % 8 == 0


def test_gathered_fields_are_contiguous_copies():
    st = Storage(5, {"obs": ((2,), np.float32), "done": ((), np.bool_)})
    arrays, rows, _ = st.prepare({"obs": np.arange(10, dtype=np.float32).reshape(5, 2), "done": np.ones(5, bool)},
                                 batched=True)
    st.write(arrays, rows, None, batched=True)
    out = st.gather(np.array([3, 3, 0]))
    assert out["obs"].flags.c_contiguous and out["obs"].tolist() == [[6, 7], [6, 7], [0, 1]]
    out["obs"][:] = -1  # a copy: the storage is untouched
    assert st.data["obs"][3].tolist() == [6, 7]


def test_a_zero_byte_field_is_kept_apart_from_the_rows():
    st = Storage(4, {"x": ((2,), np.float32), "empty": ((0,), np.float32)})
    assert st.rows.shape == (4, 8) and "empty" not in st._layout.offset
    arrays, rows, _ = st.prepare({"x": np.ones((3, 2)), "empty": np.zeros((3, 0))}, batched=True)
    st.write(arrays, rows, None, batched=True)
    out = st.gather(np.array([0, 2]))
    assert out["empty"].shape == (2, 0) and out["x"].tolist() == [[1, 1], [1, 1]]


def test_a_field_view_is_loaded_in_chunks_of_rows(tmp_path, monkeypatch):
    import perx._format

    monkeypatch.setattr(perx._format, "_CHUNK", 40)  # 5 rows of obs (8 bytes) per chunk: many chunks
    buf = perx.ReplayBuffer(23, seed=0)
    buf.extend(obs=np.arange(46, dtype=np.float32).reshape(23, 2), action=np.arange(23), flag=np.arange(23) % 3 == 0)
    buf.save(tmp_path / "b.perx")
    twin = perx.ReplayBuffer.load(tmp_path / "b.perx")
    np.testing.assert_array_equal(twin._storage.rows, buf._storage.rows)


@pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
def test_a_copied_buffer_samples_its_own_new_rows(copier):
    import copy
    import pickle

    buf = perx.ReplayBuffer(100, perx.Uniform(), seed=0)
    buf.extend(obs=np.zeros((100, 3), np.float32), flag=np.zeros(100, bool))
    twin = copy.deepcopy(buf) if copier == "deepcopy" else pickle.loads(pickle.dumps(buf))
    twin.extend(obs=np.ones((100, 3), np.float32), flag=np.ones(100, bool))
    for b in (15, 16, 64):  # the numpy path and the compiled gather see the same rows
        batch = twin.sample(b)
        assert (batch["obs"] == 1.0).all() and batch["flag"].all()
    assert (buf.sample(64)["obs"] == 0.0).all()  # the original is untouched
    assert np.shares_memory(twin._storage.data["obs"], twin._storage.rows)


def test_fields_aligned_beyond_8_bytes_or_not_named_by_strings_are_kept_apart():
    st = Storage(40, {"x": ((3,), np.longdouble), "y": ((), np.float32)})
    assert "x" not in st._layout.offset and st.data["x"].flags.aligned
    arrays, rows, _ = st.prepare({"x": np.ones((40, 3), np.longdouble), "y": np.arange(40.0)}, batched=True)
    st.write(arrays, rows, None, batched=True)
    out = st.gather(np.arange(20, dtype=np.int64))
    assert out["x"].dtype == np.longdouble and out["y"].tolist() == list(range(20))
    odd = Storage(40, {1: ((), np.float32), "z": ((), np.int64)})
    assert odd.gather(np.arange(20, dtype=np.int64))[1].shape == (20,)


def _rich(n, rng):
    return {"obs": rng.standard_normal((n, 3)).astype(np.float32), "img": rng.integers(0, 255, (n, 2, 3), np.uint8),
            "action": rng.integers(0, 9, n), "code": rng.integers(0, 60000, n).astype(np.uint16),
            "reward": rng.standard_normal(n), "done": rng.random(n) < 0.3}


@pytest.mark.parametrize("make", [lambda: perx.Proportional(alpha=0.6), lambda: perx.Uniform(),
                                  lambda: perx.Proportional(alpha=0.5, stratified=False, normalize="batch"),
                                  lambda: perx.Greedy(), lambda: perx.RankBased(alpha=0.7),
                                  lambda: perx.RankBased(alpha=0.6, segments=8, normalize="batch", sort_every=50)])
def test_one_call_sample_and_gather_returns_what_sampling_then_gathering_returns(make):
    # the fused path (sampler.sample_gather) against the two-step path on a twin with the fusion switched off
    rng = np.random.default_rng(4)
    data = _rich(500, rng)
    fused, plain = perx.ReplayBuffer(300, make(), seed=3), perx.ReplayBuffer(300, make(), seed=3)
    plain.sampler.fuses_gather = False
    for buf in (fused, plain):
        buf.extend(**data)
        buf.update_priorities(np.arange(200, 500), np.random.default_rng(1).standard_normal(300))
    for b in (1, 5, 16, 64, 300 if isinstance(fused.sampler, perx.Greedy) else 301):  # Greedy: b <= stored
        x, y = fused.sample(b, beta=0.4), plain.sample(b, beta=0.4)
        np.testing.assert_array_equal(x.indices, y.indices)
        np.testing.assert_array_equal(x.probabilities, y.probabilities)
        np.testing.assert_array_equal(x.weights, y.weights)
        assert list(x.keys()) == list(y.keys()) == list(data)
        for key in data:
            assert x[key].dtype == y[key].dtype and x[key].flags.c_contiguous, key
            np.testing.assert_array_equal(x[key], y[key])
            np.testing.assert_array_equal(x[key], data[key][x.indices], err_msg=key)


def test_a_field_may_use_the_names_a_sampled_batch_keeps_its_ids_under():
    buf = perx.ReplayBuffer(50, perx.Proportional(), seed=0)
    buf.extend(**{"__perx_ids": np.arange(50) * 10, "x": np.ones((50, 2))})
    names = buf._storage._layout.extras
    assert "__perx_ids" not in names
    batch = buf.sample(40)
    np.testing.assert_array_equal(batch["__perx_ids"], batch.indices * 10)


def test_field_names_that_need_quoting_come_back_from_the_one_call_sample_unchanged():
    # the batch's name -> array dict is built by a function written out for the layout's names (repr-quoted)
    names = ["it's", 'say "hi"', "back\\slash", "two\nlines", "ünïcode", "{}", "a': 0, 'b"]
    rng = np.random.default_rng(0)
    data = {n: rng.standard_normal((40, k + 1)).astype(np.float32) for k, n in enumerate(names)}
    fused, plain = (perx.ReplayBuffer(40, perx.Proportional(), seed=1) for _ in range(2))
    plain.sampler.fuses_gather = False
    for buf in (fused, plain):
        buf.extend(**data)
    x, y = fused.sample(16), plain.sample(16)
    assert list(x.data) == list(y.data) == names
    for n in names:
        np.testing.assert_array_equal(x[n], data[n][x.indices])
        np.testing.assert_array_equal(x[n], y[n])


def test_a_field_named_by_a_str_subclass_with_its_own_repr_comes_back_under_its_name():
    class Name(str):
        def __repr__(self):
            return "0: print('no')"

    buf = perx.ReplayBuffer(20, perx.Proportional(), seed=0)
    buf.extend(**{Name("obs"): np.arange(20.0), "r": np.ones(20)})
    batch = buf.sample(8)
    assert list(batch.data) == ["obs", "r"]
    np.testing.assert_array_equal(batch["obs"], batch.indices.astype(float))


def test_batch_records_are_cached_for_at_most_64_batch_sizes():
    buf = perx.ReplayBuffer(100, perx.Uniform(), seed=0)
    buf.extend(x=np.arange(100.0))
    for b in range(1, 101):
        np.testing.assert_array_equal(buf.sample(b)["x"].shape, (b,))
    assert 0 < len(buf._storage._layout.records) <= 64


def test_extend_stores_multi_element_fields_from_strided_and_cast_sources():
    rng = np.random.default_rng(0)
    wide = rng.standard_normal((20, 6)).astype(np.float32)
    st = Storage(8, {"obs": ((3,), np.float32), "pair": ((2,), np.float64), "k": ((), np.int64)})
    # obs: every other column of a wider array (not contiguous); pair: float32 cast into float64; k: int32
    arrays, rows, _ = st.prepare({"obs": wide[:5, ::2], "pair": wide[:5, :2], "k": np.arange(5, dtype=np.int32)},
                                 batched=True)
    st.write(arrays, rows, None, batched=True)
    np.testing.assert_array_equal(st.data["obs"][:5], wide[:5, ::2])
    np.testing.assert_array_equal(st.data["pair"][:5], wide[:5, :2].astype(np.float64))
    assert st.data["k"][:5].tolist() == [0, 1, 2, 3, 4]
    contiguous = np.ascontiguousarray(wide[5:12, 1:4])
    arrays, rows, _ = st.prepare({"obs": contiguous, "pair": np.ones((7, 2)), "k": np.arange(7)}, batched=True)
    ids, slots = st.write(arrays, rows, None, batched=True)  # ids 5..11: wraps to slots 5, 6, 7, 0, 1, 2, 3
    assert ids.tolist() == list(range(5, 12)) and slots.tolist() == [5, 6, 7, 0, 1, 2, 3]
    np.testing.assert_array_equal(st.data["obs"][slots], contiguous)
    assert st.data["k"][4] == 4  # untouched


def test_a_batch_too_large_for_one_record_is_gathered_field_by_field(monkeypatch):
    import perx.storage

    rng = np.random.default_rng(2)
    data = _rich(200, rng)
    big, small = (perx.ReplayBuffer(200, perx.Proportional(), seed=1) for _ in range(2))
    big.extend(**data)
    small.extend(**data)
    monkeypatch.setattr(perx.storage, "_KERNEL_GATHER_MAX_BYTES", 64 * 100)  # records of about 100 rows at most
    assert big._storage.batch_bytes(500) is None and big._storage.batch_bytes(20) is not None
    x = big.sample(500, beta=0.5)
    monkeypatch.undo()
    y = small.sample(500, beta=0.5)
    np.testing.assert_array_equal(x.indices, y.indices)
    np.testing.assert_array_equal(x.weights, y.weights)
    for key in data:
        np.testing.assert_array_equal(x[key], y[key])
    assert big._storage.gather(x.indices % 200)["obs"].shape == (500, 3)


@pytest.mark.parametrize("make", [lambda: perx.Proportional(alpha=0.6), lambda: perx.Uniform(), lambda: perx.LAP(),
                                  lambda: perx.Greedy(), lambda: perx.RankBased()])
def test_sample_out_refills_a_batch_in_place_with_what_a_new_sample_would_hold(make):
    rng = np.random.default_rng(5)
    data = _rich(400, rng)
    reuse, fresh = perx.ReplayBuffer(300, make(), seed=9), perx.ReplayBuffer(300, make(), seed=9)
    for buf in (reuse, fresh):
        buf.extend(**data)
    batch = reuse.sample(64, beta=0.3)
    fresh.sample(64, beta=0.3)
    obs, ids = batch["obs"], batch.indices
    for step in range(5):
        for buf in (reuse, fresh):
            buf.update_priorities(np.arange(100, 400), np.random.default_rng(step).standard_normal(300))
        again = reuse.sample(64, beta=0.6, out=batch)
        new = fresh.sample(64, beta=0.6)
        assert again is batch and again["obs"] is obs and again.indices is ids  # the same arrays, refilled
        np.testing.assert_array_equal(again.indices, new.indices)
        np.testing.assert_array_equal(again.weights, new.weights)
        np.testing.assert_array_equal(again.probabilities, new.probabilities)
        for key in data:
            np.testing.assert_array_equal(again[key], new[key])


@pytest.mark.parametrize("refilled", [False, True])  # True: the batch takes sample(out=)'s shortest path
def test_an_out_batch_this_call_cannot_refill_is_refused_and_nothing_changes(refilled):
    rng = np.random.default_rng(6)
    data = _rich(100, rng)
    buf, twin = perx.ReplayBuffer(100, perx.Proportional(), seed=2), perx.ReplayBuffer(100, perx.Proportional(), seed=2)
    rank = perx.ReplayBuffer(100, perx.RankBased(), seed=2)
    for b in (buf, twin, rank):
        b.extend(**data)
    mine, theirs, ranked = buf.sample(8), twin.sample(8), rank.sample(8)
    twin2 = perx.ReplayBuffer(100, perx.Proportional(), seed=2)
    twin2.extend(**data)
    twin2.sample(8)
    if refilled:
        buf.sample(8, out=mine)
        twin2.sample(8)
    before = mine["obs"].copy()
    for out, kwargs, match in [(theirs, {}, "this buffer"), (ranked, {}, "this buffer"), ({"obs": 1}, {}, "Batch"),
                               (buf.get([1, 2]), {}, "this buffer"), (mine, {"batch_size": 9}, "holds 8"),
                               (mine, {"replace": False}, "replacement"), (mine, {"beta": 1.5}, "beta")]:
        args = {"batch_size": 8, **kwargs}
        with pytest.raises(ValueError, match=match):
            buf.sample(args.pop("batch_size"), out=out, **args)
    np.testing.assert_array_equal(mine["obs"], before)
    # the refused calls drew nothing: the next draws are the twin's
    np.testing.assert_array_equal(buf.sample(8, out=mine).indices, twin2.sample(8).indices)


def test_a_sampler_subclass_that_redefines_sample_is_not_bypassed_by_the_fused_path():
    calls = []

    class Logged(perx.Proportional):
        def sample(self, batch_size, beta, size, next_id):
            calls.append(batch_size)
            return super().sample(batch_size, beta, size, next_id)

    buf = perx.ReplayBuffer(50, Logged(), seed=0)
    buf.extend(x=np.arange(50.0))
    batch = buf.sample(7)
    assert calls == [7] and not Logged.fuses_gather and perx.Proportional.fuses_gather
    np.testing.assert_array_equal(batch["x"], batch.indices.astype(float))
    with pytest.raises(ValueError, match="out"):
        buf.sample(7, out=batch)


def test_out_is_refilled_to_its_own_size_and_arrays_whatever_was_rebound():
    buf = perx.ReplayBuffer(100, perx.Proportional(), spec={"x": ((4,), np.float32)}, seed=0)
    twin = perx.ReplayBuffer(100, perx.Proportional(), spec={"x": ((4,), np.float32)}, seed=0)
    for b in (buf, twin):
        b.extend(x=np.arange(400, dtype=np.float32).reshape(100, 4))
    batch = buf.sample(16)
    twin.sample(16)
    indices, x = batch.indices, batch["x"]
    batch.indices = np.zeros(4096, np.int64)  # a longer array: refilling must not write past the batch's memory
    with pytest.raises(ValueError, match="out: holds 16"):
        buf.sample(4096, out=batch)
    np.testing.assert_array_equal(buf.sample(16).indices, twin.sample(16).indices)  # the refusal drew nothing
    batch.weights = batch.weights.astype(np.float32)
    batch.data["x"] = batch["x"] * 2.0  # e.g. normalised in place of the sampled field
    again = buf.sample(16, out=batch)
    fresh = twin.sample(16)
    assert again.indices is indices and again["x"] is x and again.weights.dtype == np.float64
    np.testing.assert_array_equal(again.indices, fresh.indices)
    np.testing.assert_array_equal(again["x"], fresh["x"])
    np.testing.assert_array_equal(again.weights, fresh.weights)
    assert buf.sample(np.int64(16), out=again) is again  # an integer of any type, as sample() takes


@pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
def test_a_copied_batch_is_not_refillable(copier):
    import copy
    import pickle

    buf = perx.ReplayBuffer(50, perx.Proportional(), seed=0)
    buf.extend(x=np.arange(50.0))
    batch = buf.sample(8)
    buf2, batch2 = copy.deepcopy((buf, batch)) if copier == "deepcopy" else pickle.loads(pickle.dumps((buf, batch)))
    np.testing.assert_array_equal(batch2.indices, batch.indices)
    with pytest.raises(ValueError, match="out"):
        buf2.sample(8, out=batch2)
    with pytest.raises(ValueError, match="out"):
        buf2.sample(8, out=batch)  # the copy has its own layout: the original's batches are not its own
    assert buf.sample(8, out=batch) is batch


def test_a_sample_from_a_mixin_or_set_on_the_instance_is_not_bypassed():
    calls = []

    class Logging:
        def sample(self, batch_size, beta, size, next_id):
            calls.append(batch_size)
            return super().sample(batch_size, beta, size, next_id)

    class Mixed(Logging, perx.Proportional):
        pass

    assert not Mixed.fuses_gather
    buf = perx.ReplayBuffer(30, Mixed(), seed=0)
    buf.extend(x=np.arange(30.0))
    buf.sample(5)
    plain = perx.ReplayBuffer(30, perx.Uniform(), seed=0)
    plain.extend(x=np.arange(30.0))
    wrapped = plain.sampler.sample
    plain.sampler.sample = lambda *args: (calls.append(-1), wrapped(*args))[1]
    assert not plain.sampler.fuses_gather and perx.Uniform().fuses_gather  # set on that instance only
    batch = plain.sample(4)
    assert calls == [5, -1]
    np.testing.assert_array_equal(batch["x"], batch.indices.astype(float))


# -- the fast paths of add and extend (values that need no conversion) ----------------------------------------

_SCALAR_DTYPES = [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16, np.float32, np.float64]
_CANDIDATES = [
    True, 0, -1, 300, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**70, 0.5, 65504.0, 65520.0, 3.4028235e38,
    3.4028236e38, 1e39, -1e39, 1e300, float("nan"), float("inf"), -float("inf"),
    np.bool_(True), np.int8(-5), np.int64(300), np.int64(-1), np.uint8(200), np.uint64(2**64 - 1),
    np.float16(1.5), np.float32(1e38), np.float32(np.inf), np.float64(1e39), np.float64(np.nan),
    np.float64(-3.4028235e38), np.complex64(1), np.str_("a"), "a", None,
    np.array(7, np.int64), np.array(2.5, np.float32), np.array([1.0], np.float32), np.array(True),
]


def _general(buf):
    """The same buffer with the fast paths switched off: add and extend go through prepare + write."""
    buf._storage._one = None
    return buf


def _outcome(method, **fields):
    """("ok", ids as a list) or (the exception's type name, its message)."""
    try:
        return ("ok", method(**fields).tolist())
    except Exception as err:
        return (type(err).__name__, str(err))


@pytest.mark.parametrize("dtype", _SCALAR_DTYPES)
def test_a_single_add_stores_or_refuses_each_value_as_the_general_path_does(dtype):
    spec = {"x": ((), dtype), "v": ((3,), np.float32), "m": ((2, 2), np.int16)}
    fast = perx.ReplayBuffer(4, perx.Proportional(), spec=spec, seed=0)
    slow = _general(perx.ReplayBuffer(4, perx.Proportional(), spec=spec, seed=0))
    probe = perx.ReplayBuffer(4, spec=spec)
    v, m = np.arange(3, dtype=np.float32), np.arange(4, dtype=np.int16).reshape(2, 2)
    taken = 0
    for value in _CANDIDATES:
        got = [_outcome(b.add, x=value, v=v, m=m) for b in (fast, slow)]
        assert got[0] == got[1], (value, got)
        np.testing.assert_array_equal(fast._storage.rows, slow._storage.rows)
        taken += probe._storage.write_one({"x": value, "v": v, "m": m}) is not None
    assert fast._storage.next_id == slow._storage.next_id
    assert taken >= 3  # the value types the field takes as they are went the fast way


@pytest.mark.parametrize("value", [
    np.arange(3, dtype=np.float32), np.arange(3, dtype=np.float64), np.arange(3, dtype=np.int64),
    np.arange(6, dtype=np.float32)[::2], np.arange(2, dtype=np.float32), np.full(3, 1e39), [1, 2, 3], 1.0,
    np.arange(3, dtype=np.float32).reshape(1, 3), np.ma.masked_array(np.zeros(3, np.float32)),
])
def test_a_single_add_of_an_array_field_matches_the_general_path(value):
    spec = {"v": ((3,), np.float32), "r": ((), np.float32)}
    fast = perx.ReplayBuffer(4, spec=spec)
    slow = _general(perx.ReplayBuffer(4, spec=spec))
    got = [_outcome(b.add, v=value, r=1.0) for b in (fast, slow)]
    assert got[0] == got[1]
    np.testing.assert_array_equal(fast._storage.rows, slow._storage.rows)


def test_a_single_add_with_missing_or_extra_fields_is_refused_as_before():
    spec = {"a": ((), np.float32), "b": ((), np.int64)}
    fast, slow = perx.ReplayBuffer(4, spec=spec), _general(perx.ReplayBuffer(4, spec=spec))
    for fields in ({"a": 1.0}, {"a": 1.0, "c": 2}, {"a": 1.0, "b": 2, "c": 3}, {}):
        got = [_outcome(b.add, **fields) for b in (fast, slow)]
        assert got[0][0] == "ValueError" and got[0] == got[1]
    assert len(fast) == 0


def test_common_single_adds_and_batches_skip_the_general_checks(monkeypatch):
    buf = perx.ReplayBuffer(8, perx.Proportional(), spec={"o": ((2,), np.float32), "a": ((), np.int64),
                                                           "r": ((), np.float32), "d": ((), np.bool_)})
    called = []
    real = Storage.prepare
    monkeypatch.setattr(Storage, "_infer_spec", lambda *a, **k: called.append("infer"))

    def spy(self, fields, *, batched):
        out = real(self, fields, batched=batched)
        if self._one is None or out[0] is not fields:
            called.append(batched)
        return out

    monkeypatch.setattr(Storage, "prepare", spy)
    o = np.zeros(2, np.float32)
    buf.add(o=o, a=3, r=0.5, d=False)  # Python scalars that fit
    buf.add(o=o, a=np.int64(3), r=np.float32(0.5), d=np.bool_(True))  # numpy scalars of the fields' types
    buf.add(o=o, a=np.int32(3), r=np.float64(0.5), d=True)  # safe and in-range narrowing casts
    buf.extend(o=np.zeros((3, 2), np.float32), a=np.arange(3), r=np.ones(3, np.float32), d=np.zeros(3, bool))
    assert called == [] and len(buf) == 6
    buf.extend(o=np.zeros((3, 2)), a=np.arange(3), r=np.ones(3), d=np.zeros(3, bool))  # float64: cast checks
    assert called == [True]


def test_the_fast_paths_survive_a_copy_and_a_buffer_without_a_spec_yet():
    import copy
    import pickle

    empty = perx.ReplayBuffer(4)
    for twin in (copy.deepcopy(empty), pickle.loads(pickle.dumps(empty))):
        twin.add(x=1.0, y=np.zeros(2))
        assert twin._storage._one is not None
    full = perx.ReplayBuffer(4, spec={"x": ((), np.float64)})
    full.add(x=1.0)
    twin = pickle.loads(pickle.dumps(full))
    twin.add(x=2.0)
    assert twin._storage.data["x"][:2].tolist() == [1.0, 2.0] and full._storage.data["x"][1] == 0.0


@pytest.mark.parametrize("rows", [1, 3, 7, 12])
def test_an_exact_batch_is_stored_as_the_general_path_stores_it(rows):
    spec = {"o": ((2, 3), np.float32), "a": ((), np.int64), "d": ((), np.bool_), "k": ((1,), np.uint8)}
    rng = np.random.default_rng(rows)
    fast, slow = perx.ReplayBuffer(5, spec=spec), _general(perx.ReplayBuffer(5, spec=spec))
    for _ in range(3):  # wrap-around and, for 7 and 12 rows, batches larger than the buffer
        batch = {"o": rng.standard_normal((rows, 2, 3), dtype=np.float32), "a": rng.integers(0, 9, rows),
                 "d": rng.random(rows) < 0.5, "k": rng.integers(0, 255, (rows, 1), dtype=np.uint8)}
        np.testing.assert_array_equal(fast.extend(**batch), slow.extend(**batch))
        np.testing.assert_array_equal(fast._storage.rows, slow._storage.rows)
    for other in ({"a": np.arange(rows + 1)}, {"o": batch["o"].tolist()}, {"a": batch["a"].tolist()},
                  {"d": np.ma.masked_array(batch["d"])}, {"o": batch["o"][:, :1]}):
        mixed = {**batch, **other}
        assert _outcome(fast.extend, **mixed) == _outcome(slow.extend, **mixed)
        np.testing.assert_array_equal(fast._storage.rows, slow._storage.rows)


def _same_sampler(a, b):
    """Every array a sampler holds (its trees and heaps included, not only its saved state) is the same."""
    arrays = {k: v for k, v in vars(a).items() if isinstance(v, np.ndarray)}
    assert arrays.keys() == {k for k, v in vars(b).items() if isinstance(v, np.ndarray)}
    for k, v in arrays.items():
        np.testing.assert_array_equal(v, vars(b)[k], err_msg=k)
    if hasattr(a, "max_tree"):
        np.testing.assert_array_equal(a.max_tree.nodes, b.max_tree.nodes)


@pytest.mark.parametrize("make", [lambda: perx.Proportional(alpha=0.6),
                                  lambda: perx.Proportional(alpha=0.6, max_priority="buffer"),
                                  lambda: perx.RankBased(alpha=0.7), lambda: perx.RankBased(alpha=0.7, exact=True),
                                  lambda: perx.Greedy(), lambda: perx.Uniform()])
def test_an_extend_of_exact_arrays_leaves_storage_and_sampler_as_the_general_path_does(make):
    spec = {"o": ((2, 3), np.float32), "v": ((4,), np.float32), "a": ((), np.int64), "k": ((1,), np.uint8)}
    rng = np.random.default_rng(5)
    fast = perx.ReplayBuffer(11, make(), spec=spec, seed=0)
    slow = _general(perx.ReplayBuffer(11, make(), spec=spec, seed=0))
    wide = rng.standard_normal((40, 8), dtype=np.float32)
    for step, rows in enumerate([3, 4, 1, 5, 2, 11, 14, 6, 3]):  # wrap-arounds and oversized batches included
        batch = {"o": rng.standard_normal((rows, 2, 3), dtype=np.float32),
                 # strided rows and, every other step, a last axis with gaps (general path for that batch)
                 "v": wide[: 2 * rows : 2, :4] if step % 2 else wide[:rows, ::2],
                 "a": rng.integers(0, 9, rows), "k": rng.integers(0, 255, (rows, 1), dtype=np.uint8)}
        np.testing.assert_array_equal(fast.extend(**batch), slow.extend(**batch))
        np.testing.assert_array_equal(fast._storage.rows, slow._storage.rows)
        _same_sampler(fast.sampler, slow.sampler)
        ids = fast.sample(3, beta=0.5).indices
        np.testing.assert_array_equal(ids, slow.sample(3, beta=0.5).indices)
        td = rng.random(3) * step
        fast.update_priorities(ids, td)
        slow.update_priorities(ids, td)
    assert fast._storage.next_id == slow._storage.next_id == 49


def test_an_extend_the_fast_path_takes_writes_once_and_hands_the_sampler_a_range(monkeypatch):
    buf = perx.ReplayBuffer(8, perx.Proportional(), spec={"o": ((3,), np.float32), "a": ((), np.int64)})
    written = []
    real = Storage.write
    monkeypatch.setattr(Storage, "write", lambda self, *a, **k: written.append(1) or real(self, *a, **k))
    ranges = []
    real_range = perx.Proportional.on_add_range
    monkeypatch.setattr(perx.Proportional, "on_add_range",
                        lambda self, first, ids: ranges.append((first, ids.tolist())) or real_range(self, first, ids))
    o, a = np.zeros((3, 3), np.float32), np.arange(3)
    assert buf.extend(o=o, a=a).tolist() == [0, 1, 2] and buf.extend(o=o, a=a).tolist() == [3, 4, 5]
    assert written == [] and ranges == [(0, [0, 1, 2]), (3, [3, 4, 5])]
    assert buf.extend(o=o, a=a).tolist() == [6, 7, 8]  # wraps round: the general path
    assert written == [1] and len(ranges) == 2
