"""Dict fields (Gymnasium Dict observations, SB3's MultiInputPolicy) against a brute-force model.

The model is plain Python: a dict of id -> the transition as given (dict fields as dicts of numpy values), and for
episodes the full list of steps in id order, from which n-step windows are computed by walking the list. Checked:
add, extend (single steps, batches, batches larger than the capacity, values that need a cast), sample (each row
looked up by ``batch.indices``), get, save/load (the loaded buffer draws the same batches and carries on), n-step
returns, discounts, next observations stored once, frame stacks of every key, wrap-around and episode ends; and
that every refusal names the field and the key and leaves the buffer exactly as it was.
"""

import copy
import pickle

import numpy as np
import pytest

import perx
from perx.episodes import Episodes
from tests.conftest import SAMPLERS, assert_same, snapshot
from tests.test_hardening import members, rewrite

#: the keys of the dict observation: different shapes, dtypes and alignments
KEYS = {"pos": ((3,), np.float32), "cell": ((2, 2), np.uint8), "t": ((), np.int64), "flag": ((), np.bool_)}


# -- the state a refusal must leave untouched ----------------------------------------------------------------

def state(buf):
    s = snapshot(buf)
    s["spec"] = repr(buf.spec)
    s["dicts"] = (dict(buf._dicts), dict(buf._owner), buf._packed, buf._layout, type(buf._episodes), buf._open,
                  sorted(vars(buf)))
    store = buf._episodes
    s["store"] = {} if store is None else {k: v.copy() for k, v in vars(store).items() if isinstance(v, np.ndarray)}
    return s


def assert_state(a, b):
    assert_same(a, b)
    assert a["spec"] == b["spec"] and a["dicts"] == b["dicts"]
    assert a["store"].keys() == b["store"].keys()
    for k in a["store"]:
        np.testing.assert_array_equal(a["store"][k], b["store"][k], err_msg=k)


def assert_rows_equal(batch, rows, expected):
    """Row r of ``batch`` is ``expected[r]`` (a transition of the model: dict fields as dicts)."""
    for r, want in zip(rows, expected, strict=True):
        for name, value in want.items():
            got = batch[name]
            if isinstance(value, dict):
                assert isinstance(got, dict) and list(got) == list(value), name
                for key, v in value.items():
                    np.testing.assert_array_equal(got[key][r], v, err_msg=f"{name}.{key}")
                    assert batch[f"{name}.{key}"] is got[key]  # the stored name gives the same array
            else:
                np.testing.assert_array_equal(got[r], value, err_msg=name)


# -- independent transitions --------------------------------------------------------------------------------

def transition(rng, i, *, loose=False):
    """Transition number i; ``loose``: Python scalars and float64 where the fields are narrower (cast on add)."""
    def obs(t):
        o = {"pos": np.array([t, rng.standard_normal(), -t], np.float32),
             "cell": rng.integers(0, 256, (2, 2), np.uint8), "t": np.int64(t), "flag": np.bool_(t % 3 == 0)}
        if loose:
            o = {"pos": o["pos"].astype(np.float64), "cell": o["cell"].tolist(), "t": int(t), "flag": bool(t % 3 == 0)}
        return o

    return {"obs": obs(i), "action": np.int64(i % 5), "next_obs": obs(i + 1),
            "goal": {"x": np.float64(i / 7), "y": np.array([i, -i], np.int16)}}


def stacked(steps):
    """extend's arguments from a list of transitions: arrays with a leading batch axis, dict fields key by key."""
    out = {}
    for name, value in steps[0].items():
        if isinstance(value, dict):
            out[name] = {k: np.array([s[name][k] for s in steps]) for k in value}
        else:
            out[name] = np.array([s[name] for s in steps])
    return out


def exact(step):
    """The transition as stored: every value in its field's dtype (what the model compares with)."""
    def cast(v, dtype):
        return np.asarray(v).astype(dtype)

    o = lambda d: {k: cast(d[k], KEYS[k][1]) for k in KEYS}  # noqa: E731
    return {"obs": o(step["obs"]), "action": step["action"], "next_obs": o(step["next_obs"]), "goal": step["goal"]}


@pytest.mark.parametrize("name", ["uniform", "proportional", "rank", "greedy"])
@pytest.mark.parametrize("seed", range(3))
def test_independent_transitions_match_the_model(name, seed, tmp_path):
    rng = np.random.default_rng(seed)
    capacity = int(rng.choice([5, 13]))
    buf = perx.ReplayBuffer(capacity, SAMPLERS[name](), seed=seed)
    model = {}  # id -> transition as stored
    nxt = 0
    out = None
    for _ in range(120):
        r = rng.random()
        if r < 0.3 or nxt == 0:
            step = transition(rng, nxt, loose=rng.random() < 0.3)
            ids = buf.add(**step)
            assert ids.tolist() == [nxt]
            model[nxt] = exact(step)
            nxt += 1
        elif r < 0.55:
            n = int(rng.integers(0, capacity + 4))  # sometimes empty, sometimes more than the capacity
            steps = [transition(rng, nxt + j) for j in range(n)]
            if n == 0:
                empty = {k: ({key: x[:0] for key, x in v.items()} if isinstance(v, dict) else v[:0])
                         for k, v in stacked([transition(rng, 0)]).items()}
                assert buf.extend(**empty).tolist() == []
                continue
            ids = buf.extend(**stacked(steps))
            assert ids.tolist() == list(range(nxt, nxt + n))
            model.update((nxt + j, exact(s)) for j, s in enumerate(steps))
            nxt += n
        elif r < 0.8:
            b = int(rng.integers(1, 9))
            if name == "greedy":  # (distinct transitions: at most as many as stored)
                b = min(b, len(buf))
            if name == "proportional" and rng.random() < 0.5:
                out = buf.sample(b, 0.5, out=out) if out is not None and len(out) == b else buf.sample(b, 0.5)
                batch = out
            else:
                batch = buf.sample(b, 0.5, replace=not (name in ("uniform", "greedy") and b <= len(buf)))
            assert_rows_equal(batch, range(b), [model[i] for i in batch.indices.tolist()])
            if name != "uniform":
                buf.update_priorities(batch.indices, rng.standard_normal(b))
        elif r < 0.9:
            path = tmp_path / "d.npz"
            buf.save(path)
            twin = perx.ReplayBuffer.load(path)
            b = min(6, len(buf))
            x, y = buf.sample(b), twin.sample(b)
            np.testing.assert_array_equal(x.indices, y.indices)
            assert_rows_equal(y, range(b), [model[i] for i in y.indices.tolist()])
            buf, out = twin, None  # the loaded buffer carries on
        else:
            before = state(buf)
            bad = transition(rng, nxt)
            bad["obs"]["pos"] = np.zeros(4, np.float32)
            with pytest.raises(ValueError, match=r"obs\.pos"):
                buf.add(**bad)
            assert_state(before, state(buf))
        live = [i for i in model if i >= nxt - capacity]
        assert_rows_equal(buf.get(live), range(len(live)), [model[i] for i in live])
    assert nxt > 2 * capacity  # wrapped around


def test_an_empty_extend_fixes_nothing():
    buf = perx.ReplayBuffer(4)
    empty = {"obs": {"a": np.zeros((0, 2))}, "action": np.zeros(0, np.int64)}
    assert buf.extend(**empty).tolist() == []
    assert buf.spec is None and not buf._dicts
    buf.add(obs=np.zeros(2), action=1)  # the field may still be plain
    assert buf.spec["obs"].shape == (2,)


# -- episodes -----------------------------------------------------------------------------------------------

class DictWorld:
    """Streams of episodes with dict observations: each key holds [stream, episode, step] in its own shape and
    dtype (stacks of k frames of every key with frame_stack), and every step a dict field ``goal`` besides."""

    def __init__(self, rng, streams, frame_stack=None, padding="first"):
        self.rng = rng
        self.streams = streams
        self.k = frame_stack
        self.padding = padding
        self.episode = np.zeros(streams, int)
        self.t = np.zeros(streams, int)
        self.steps = []

    @staticmethod
    def frame(e, episode, t):
        return {"pos": np.array([e, episode, t], np.float32), "cell": np.array([[e, episode], [t % 256, 7]], np.uint8),
                "t": np.int64(t), "flag": np.bool_(t % 2 == 0)}

    def obs(self, e, episode, t):
        if not self.k:
            return self.frame(e, episode, t)
        frames = []
        for j in range(t - self.k + 1, t + 1):
            if j >= 0:
                frames.append(self.frame(e, episode, j))
            elif self.padding == "zero":
                frames.append({k: np.zeros_like(v) for k, v in self.frame(e, episode, 0).items()})
            else:
                frames.append(self.frame(e, episode, 0))
        return {k: np.stack([f[k] for f in frames]) for k in KEYS}

    def step(self, e):
        ep, t = self.episode[e], self.t[e]
        r = self.rng.random()
        term = r < 0.08
        trunc = not term and r < 0.14
        step = {"obs": self.obs(e, ep, t), "next_obs": self.obs(e, ep, t + 1), "action": np.int64(t),
                "reward": np.float32(self.rng.integers(-3, 4)), "terminated": term, "truncated": trunc,
                "goal": {"g": np.float32(100 * e + ep)}, "stream": e}
        self.steps.append(step)
        if term or trunc:
            self.episode[e] += 1
            self.t[e] = 0
        else:
            self.t[e] += 1
        return step

    def window(self, i, n, gamma):
        """The brute-force n-step window of step i: (return, discount, steps, bootstrap next_obs, terminated)."""
        e = self.steps[i]["stream"]
        g, d, k, j = 0.0, 1.0, 0, i
        for j in (j for j in range(i, len(self.steps)) if self.steps[j]["stream"] == e):
            s = self.steps[j]
            g += d * float(s["reward"])
            d *= gamma
            k += 1
            if s["terminated"]:
                d = 0.0
                break
            if s["truncated"] or k == n:
                break
        return g, d, k, self.steps[j]["next_obs"], bool(self.steps[j]["terminated"])


def feed(buf, world, rng, total, rounds=False):
    pending = []
    while len(world.steps) < total:
        if rounds:
            if not pending:
                pending = rng.permutation(world.streams).tolist()
            size = int(rng.integers(1, len(pending) + 1))
            streams, pending = pending[:size], pending[size:]
        else:
            size = int(rng.integers(1, 2 * world.streams + 1))
            streams = rng.integers(0, world.streams, size)
        batch = [world.step(int(e)) for e in streams]
        if size == 1 and rng.random() < 0.5:
            one = dict(batch[0])
            buf.add(stream=one.pop("stream"), **one)
        else:
            fields = stacked([{k: v for k, v in s.items() if k != "stream"} for s in batch])
            buf.extend(stream=np.array([s["stream"] for s in batch]), **fields)


def check_windows(buf, world, n, gamma, ids=None):
    """The windows of ``ids`` (default: every stored step) against the brute-force ones."""
    if ids is None:
        ids = np.arange(max(0, buf.next_index - buf.capacity), buf.next_index)
    batch = buf.get(ids)
    for row, i in enumerate(np.asarray(ids).tolist()):
        g, d, k, nxt, term = world.window(i, n, gamma)
        assert batch["steps"][row] == k, (i, batch["steps"][row], k)
        assert batch["return"][row] == pytest.approx(g, abs=1e-9)
        assert batch["discount"][row] == pytest.approx(d, abs=1e-12)
        assert batch["terminated"][row] == term
        step = world.steps[i]
        expected = {"obs": step["obs"], "next_obs": nxt, "action": step["action"], "goal": step["goal"]}
        assert_rows_equal(batch, [row], [expected])
    for key, (shape, dtype) in KEYS.items():  # every key in its own shape and dtype, stacked alike
        frames = (world.k,) if world.k else ()
        assert batch["obs"][key].shape == (len(ids), *frames, *shape) and batch["obs"][key].dtype == dtype
        assert batch["next_obs"][key].flags.c_contiguous


LAYOUTS = [
    dict(n_step=1, next_obs="stored"),
    dict(n_step=3, next_obs="stored"),
    dict(n_step=1, next_obs="shared"),
    dict(n_step=4, next_obs="shared"),
    dict(n_step=3, frame_stack=4),
    dict(n_step=1, frame_stack=2, frame_padding="zero"),
    dict(n_step=5, frame_stack=3, frame_padding="zero"),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("seed", range(2))
def test_episode_windows_observations_and_stacks_match_brute_force(layout, streams, seed, tmp_path):
    rng = np.random.default_rng(seed)
    gamma = 0.9
    frames = layout.get("frame_stack")
    margin = {"frame_margin": (frames - 1) * 2 * streams} if frames else {}
    cfg = Episodes(gamma=gamma, streams=streams, **layout, **margin)
    capacity = int(rng.choice([7, 20]))
    buf = perx.ReplayBuffer(capacity, perx.Proportional(), seed=seed, episodes=cfg)
    world = DictWorld(rng, streams, cfg.frame_stack, cfg.frame_padding)
    for total in (5, 30, 90, 160):  # partially filled, then wrapped around several times
        feed(buf, world, rng, total, rounds=bool(frames))
        check_windows(buf, world, cfg.n_step, gamma)
        batch = buf.sample(8, 0.5)  # sampled rows, looked up by their ids
        check_windows(buf, world, cfg.n_step, gamma, ids=batch.indices)
        buf.update_priorities(batch.indices, rng.standard_normal(8))
        if total == 30:
            buf.save(tmp_path / "e.npz")
            twin = perx.ReplayBuffer.load(tmp_path / "e.npz")
            assert twin.episodes.config() == cfg.config() and repr(twin.spec) == repr(buf.spec)
            a, b = buf.sample(6), twin.sample(6)
            np.testing.assert_array_equal(a.indices, b.indices)
            for key in ("return", "discount", "steps"):
                np.testing.assert_array_equal(a[key], b[key])
            check_windows(twin, world, cfg.n_step, gamma, ids=b.indices)
            buf = twin  # the loaded buffer carries on


def test_dict_and_plain_observations_give_the_same_windows():
    """The same steps, once with dict observations and once with the key "pos" alone as a plain array."""
    rng = np.random.default_rng(3)
    cfg = dict(n_step=3, gamma=0.7, streams=2, next_obs="shared")
    nested, plain = perx.ReplayBuffer(16, episodes=Episodes(**cfg)), perx.ReplayBuffer(16, episodes=Episodes(**cfg))
    world = DictWorld(rng, 2)
    feed(nested, world, rng, 50)
    for s in world.steps:
        plain.add(obs=s["obs"]["pos"], next_obs=s["next_obs"]["pos"], action=s["action"], reward=s["reward"],
                  terminated=s["terminated"], truncated=s["truncated"], goal=s["goal"]["g"], stream=s["stream"])
    ids = np.arange(nested.next_index - 16, nested.next_index)
    assert plain.next_index == nested.next_index == len(world.steps)
    a, b = nested.get(ids), plain.get(ids)
    for key in ("return", "discount", "steps", "terminated", "truncated", "action", "reward"):
        np.testing.assert_array_equal(a[key], b[key])
    np.testing.assert_array_equal(a["next_obs"]["pos"], b["next_obs"])
    np.testing.assert_array_equal(a["obs"]["pos"], b["obs"])


def test_end_episodes_cuts_a_dict_episode_and_it_bootstraps_from_its_last_observation():
    buf = perx.ReplayBuffer(10, episodes=Episodes(n_step=3, gamma=0.5, next_obs="shared"))
    o = lambda v: {"a": np.full(2, v, np.float32), "b": np.int8(v)}  # noqa: E731
    buf.add(obs=o(0), next_obs=o(1), reward=1.0, terminated=False, truncated=False)
    buf.add(obs=o(1), next_obs=o(2), reward=1.0, terminated=False, truncated=False)
    assert buf.end_episodes() == 1
    buf.add(obs=o(7), next_obs=o(8), reward=4.0, terminated=False, truncated=False)  # a new episode
    batch = buf.get([0, 1, 2])
    assert batch["steps"].tolist() == [2, 1, 1] and batch["truncated"].tolist() == [True, True, False]
    assert batch["next_obs"]["b"].tolist() == [2, 2, 8] and batch["discount"].tolist() == [0.25, 0.5, 0.5]


def test_frame_stacks_of_dict_observations_store_each_frame_of_each_key_once():
    k = 4
    buf = perx.ReplayBuffer(500, episodes=Episodes(n_step=3, frame_stack=k))
    stored = perx.ReplayBuffer(500)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (501, 84, 84), dtype=np.uint8)
    state = rng.standard_normal((501, 3)).astype(np.float32)
    hist = np.maximum(np.arange(501)[:, None] + np.arange(-k + 1, 1), 0)  # the k frames of each stack
    obs = {"pixels": pixels[hist], "state": state[hist]}  # every key stacked alike, each in its own shape
    fields = dict(obs={key: v[:-1] for key, v in obs.items()}, next_obs={key: v[1:] for key, v in obs.items()},
                  action=np.zeros(500, np.int64), reward=np.zeros(500), terminated=np.zeros(500, bool),
                  truncated=np.zeros(500, bool))
    buf.extend(**fields)
    stored.extend(**fields)
    assert buf.nbytes < stored.nbytes / (2 * k) * 1.3  # one frame per step, against 2k in the stored stacks
    batch = buf.sample(64)
    for key in obs:
        np.testing.assert_array_equal(batch["obs"][key], obs[key][batch.indices])
        np.testing.assert_array_equal(batch["next_obs"][key], obs[key][np.minimum(batch.indices + 3, 500)])


def test_a_key_of_dtype_float16_is_stored_once_though_a_plain_float16_observation_is_not():
    """Packed observations are copied as words, so the compiled gather's dtypes do not limit the keys."""
    buf = perx.ReplayBuffer(4, episodes=Episodes(next_obs="shared"))
    o = lambda v: {"h": np.full(2, v, np.float16), "c": np.complex64(v)}  # noqa: E731
    for t in range(6):
        buf.add(obs=o(t), next_obs=o(t + 1), reward=0.0, terminated=False, truncated=False)
    batch = buf.get([2, 5])
    assert batch["obs"]["h"].dtype == np.float16 and batch["next_obs"]["h"][:, 0].tolist() == [3.0, 6.0]
    assert batch["obs"]["c"].tolist() == [2, 5]


# -- refusals -------------------------------------------------------------------------------------------------

def _ep_step(o, n, **extra):
    return {"obs": o, "next_obs": n, "reward": 0.0, "terminated": False, "truncated": False, **extra}


def _frame(v, k=None):
    f = {"pos": np.full(3, v, np.float32), "cell": np.full((2, 2), v, np.uint8), "t": np.int64(v), "flag": np.bool_(v)}
    if k is None:
        return f
    return {key: np.stack([x] * k) for key, x in f.items()}


def _replace(step, name, key, value):
    out = copy.deepcopy(step)
    if key is None:
        out[name] = value
    else:
        out[name][key] = value
    return out


def _drop(step, name, key):
    out = copy.deepcopy(step)
    del out[name][key]
    return out


REFUSED = [  # (name, change, error, match): every message names the field and the key
    ("missing key", lambda s: _drop(s, "obs", "t"), ValueError, r"obs: .*missing keys \['t'\]"),
    ("extra key", lambda s: _replace(s, "obs", "z", np.zeros(1)), ValueError, r"obs: .*unexpected keys \['z'\]"),
    ("shape", lambda s: _replace(s, "obs", "pos", np.zeros(4, np.float32)), ValueError, r"obs\.pos: expected shape"),
    ("unsafe cast", lambda s: _replace(s, "obs", "t", 1.5), TypeError, r"obs\.t: cannot cast"),
    ("does not fit", lambda s: _replace(s, "obs", "cell", np.full(np.shape(s["obs"]["cell"]), 300)), ValueError,
     r"obs\.cell: the value .*300.* does not fit"),
    ("dict for a plain field", lambda s: _replace(s, "action", None, {"a": 1}), TypeError, r"action: got a dict"),
    ("array for a dict field", lambda s: _replace(s, "next_obs", None, np.zeros(3)), TypeError,
     r"next_obs: is a dict field with the keys \['pos', 'cell', 't', 'flag'\]"),
    ("nested dict", lambda s: _replace(s, "obs", "pos", {"x": 1.0}), TypeError, r"obs\.pos: nested dicts"),
    ("stored name given", lambda s: {**s, "obs.pos": np.zeros(3)}, ValueError,
     r"obs\.pos: (given twice|is key 'pos' of the dict field obs)"),
    ("key of a dict field", lambda s: _replace(s, "goal", None, {"g": np.float32(0), "h": 1}), ValueError,
     r"goal: .*unexpected keys \['h'\]"),
]


@pytest.mark.parametrize("layout", [None, dict(next_obs="stored"), dict(next_obs="shared"), dict(frame_stack=2)],
                         ids=["plain", "stored", "shared", "frames"])
@pytest.mark.parametrize(("what", "change", "error", "match"), REFUSED, ids=[r[0] for r in REFUSED])
def test_bad_dict_input_is_refused_naming_field_and_key_and_changes_nothing(layout, what, change, error, match):
    cfg = Episodes(n_step=2, **layout) if layout is not None else None
    k = cfg.frame_stack if cfg is not None else None
    buf = perx.ReplayBuffer(6, perx.Proportional(), episodes=cfg, seed=0)
    step = lambda v: _ep_step(_frame(v, k), _frame(v, k) if k else _frame(v + 1), action=1,  # noqa: E731
                              goal={"g": np.float32(v)})
    buf.add(**step(0))
    good = step(0 if k else 1)
    for single in (True, False):
        before = state(buf)
        bad = change(good)
        with pytest.raises(error, match=match):
            if single:
                buf.add(**bad)
            else:  # the same inside an extend of two rows
                rows = lambda x: x if isinstance(x, dict) else np.stack([x, x])  # noqa: E731
                two = {n: ({key: rows(x) for key, x in v.items()} if isinstance(v, dict) else np.array([v, v]))
                       for n, v in bad.items()}
                buf.extend(**two)
        assert_state(before, state(buf))
    assert buf.add(**good).tolist() == [1]  # and the buffer goes on


def test_keys_with_different_numbers_of_rows_are_refused_in_extend():
    buf = perx.ReplayBuffer(6, episodes=Episodes(next_obs="shared"))
    buf.add(**_ep_step(_frame(0), _frame(1)))
    before = state(buf)
    two = {n: ({key: np.stack([x, x]) for key, x in v.items()} if isinstance(v, dict) else np.array([v, v]))
           for n, v in _ep_step(_frame(1), _frame(2)).items()}
    two["next_obs"]["cell"] = two["next_obs"]["cell"][:1]
    with pytest.raises(ValueError, match=r"next_obs\.cell: has 1 rows"):
        buf.extend(**two)
    assert_state(before, state(buf))


@pytest.mark.parametrize("layout", [dict(next_obs="stored"), dict(next_obs="shared")], ids=["stored", "shared"])
def test_a_step_that_does_not_continue_in_one_key_is_refused_naming_the_key(layout):
    buf = perx.ReplayBuffer(6, episodes=Episodes(n_step=2, **layout))
    buf.add(**_ep_step(_frame(0), _frame(1)))
    before = state(buf)
    o = _frame(1)
    o["cell"] = o["cell"] + 1  # every other key continues
    for rows in (1, 2):
        with pytest.raises(ValueError, match=r"continues an episode but its observation \(key 'cell'\)"):
            if rows == 1:
                buf.add(**_ep_step(o, _frame(2)))
            else:  # the second row continues the first, which continues the stored step in every key but one
                steps = [_ep_step(o, _frame(2)), _ep_step(_frame(2), _frame(3))]
                buf.extend(**stacked(steps))
        assert_state(before, state(buf))
    o = _frame(1)
    o["pos"][1] = np.nan  # NaN continues NaN, key by key
    buf.add(**_ep_step(_frame(1), o))
    buf.add(**_ep_step(o, _frame(2)))
    assert len(buf) == 3


def test_stacks_are_checked_key_by_key():
    buf = perx.ReplayBuffer(6, episodes=Episodes(frame_stack=3))
    first = _frame(5, 3)
    nxt = {key: np.concatenate([v[1:], _frame(6)[key][None]]) for key, v in first.items()}
    bad = copy.deepcopy(nxt)
    bad["t"][0] = 9  # not first shifted by one frame in this key only
    with pytest.raises(ValueError, match=r"shifted by one frame.*\(key 't'\)"):
        buf.add(**_ep_step(first, bad))
    pad = copy.deepcopy(first)
    pad["flag"][0] = False  # the first stack of an episode must be padded with its first frame, in every key
    with pytest.raises(ValueError, match=r"row 0 starts an episode but its stack \(key 'flag'\) is not padded"):
        buf.add(**_ep_step(pad, nxt))
    assert buf.spec is None and len(buf) == 0
    buf.add(**_ep_step(first, nxt))
    assert len(buf) == 1


FIRST_ADD = [  # refused by the first add of a fresh buffer, which then fixes nothing
    ("empty dict", None, lambda s: {**s, "obs": {}}, ValueError, r"obs: an empty dict"),
    ("key not a string", None, lambda s: {**s, "obs": {1: np.zeros(2)}}, TypeError, "non-empty strings"),
    ("next_obs plain", "shared", lambda s: {**s, "next_obs": np.zeros(3)}, TypeError, r"next_obs: obs is a dict"),
    ("obs plain", "stored", lambda s: {**s, "obs": np.zeros(3)}, TypeError, r"obs: next_obs is a dict"),
    ("other keys", "shared", lambda s: _drop(s, "next_obs", "flag"), ValueError,
     r"next_obs: .*missing keys \['flag'\]"),
    ("reward as a dict", "shared", lambda s: {**s, "reward": {"r": 1.0}}, TypeError, "reward"),
    ("a key not stacked", "frames",
     lambda s: _replace(_replace(s, "obs", "t", np.int64(1)), "next_obs", "t", np.int64(1)), ValueError,
     r"obs\.t: frame_stack=2 needs every key's observations of shape \(2, ...\)"),
    ("long double", "shared", lambda s: _replace(_replace(s, "obs", "q", np.longdouble(1)), "next_obs", "q",
                                                 np.longdouble(1)), TypeError, r"obs\.q: observations of dtype"),
    ("object", None, lambda s: _replace(s, "obs", "pos", "text"), TypeError, r"obs\.pos: cannot store dtype"),
]


@pytest.mark.parametrize(("what", "mode", "change", "error", "match"), FIRST_ADD, ids=[r[0] for r in FIRST_ADD])
def test_a_refused_first_add_fixes_nothing(what, mode, change, error, match):
    if what == "long double" and np.dtype(np.longdouble).alignment <= 8:
        pytest.skip("long double is a plain double here")
    cfg = {None: None, "shared": Episodes(next_obs="shared"), "stored": Episodes(next_obs="stored"),
           "frames": Episodes(frame_stack=2)}[mode]
    k = 2 if mode == "frames" else None
    buf = perx.ReplayBuffer(6, episodes=cfg)
    before = state(buf)
    step = _ep_step(_frame(0, k), _frame(0, k) if k else _frame(1))
    with pytest.raises(error, match=match):
        buf.add(**change(step))
    assert_state(before, state(buf))
    assert buf.spec is None
    buf.add(**step)
    assert len(buf) == 1 and set(buf.spec["obs"]) == set(KEYS)


@pytest.mark.parametrize(("spec", "episodes", "error", "match"), [
    ({"obs": {"a": ((2,), np.float32)}, "obs.a": ((2,), np.float32)}, None, ValueError, r"'obs\.a' names both"),
    ({"obs": {"a": ((2,), np.float32)}, "obs.a": ((2,), np.float32)}, "stored", ValueError, r"'obs\.a'"),
    ({"x": {"b.c": ((), np.int8)}, "x.b": {"c": ((), np.int8)}}, None, ValueError, r"'x\.b\.c' names both"),
    ({"obs": {"a": ((2,), np.float32)}, "next_obs": ((2,), np.float32)}, "shared", TypeError, "next_obs must be one"),
    ({"obs": {"a": ((2,), np.float32)}, "next_obs": {"a": ((3,), np.float32)}}, "shared", ValueError,
     "next_obs must have"),
    ({"obs": {"a": ((2,), np.float32)}}, "shared", ValueError, "give both"),
    ({"reward": {"r": ((), np.float32)}}, "shared", TypeError, "reward"),
    ({"return": {"r": ((), np.float32)}}, "stored", TypeError, "return"),
    ({"obs": {"a": (3, "bogus")}}, None, TypeError, r"spec\['obs\.a'\]"),
    ({"obs": {"a": ((2,), np.float32)}, "next_obs": {"a": ((2,), np.float32)}}, "frames", ValueError,
     r"obs\.a: frame_stack"),
])
def test_bad_nested_specs_are_refused(spec, episodes, error, match):
    cfg = {None: None, "shared": Episodes(next_obs="shared"), "stored": Episodes(next_obs="stored"),
           "frames": Episodes(frame_stack=4)}[episodes]
    with pytest.raises(error, match=match):
        perx.ReplayBuffer(4, spec=spec, episodes=cfg)


# -- spec=, save and load -------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", [None, dict(next_obs="stored"), dict(next_obs="shared"), dict(frame_stack=2)],
                         ids=["plain", "stored", "shared", "frames"])
def test_a_nested_spec_fixes_the_layout_and_a_buffer_saved_before_its_first_add_loads(layout, tmp_path):
    cfg = Episodes(n_step=2, gamma=0.5, **layout) if layout is not None else None
    k = cfg.frame_stack if cfg is not None else None
    keys = {key: (((k,) if k else ()) + shape, dtype) for key, (shape, dtype) in KEYS.items()}
    spec = {"obs": keys, "next_obs": keys, "reward": ((), np.float32), "terminated": ((), bool),
            "truncated": ((), bool), "goal": {"g": ((), np.float32)}}
    buf = perx.ReplayBuffer(5, perx.Proportional(), seed=0, spec=spec, episodes=cfg)
    assert {key: (f.shape, f.dtype) for key, f in buf.spec["obs"].items()} == \
        {key: (s, np.dtype(d)) for key, (s, d) in keys.items()}
    buf.save(tmp_path / "s.npz")
    twin = perx.ReplayBuffer.load(tmp_path / "s.npz")
    assert repr(twin.spec) == repr(buf.spec) and len(twin) == 0
    for b in (buf, twin):
        for t in range(7):
            b.add(**_ep_step(_frame(t % 2, k) if k else _frame(t), _frame(t % 2, k) if k else _frame(t + 1),
                             reward=1.0, goal={"g": float(t)}, terminated=bool(k)))  # (stacks: one-step episodes)
        with pytest.raises(TypeError, match="cannot cast"):  # the spec's dtypes hold: float into int64
            b.add(**_replace(_ep_step(_frame(0, k) if k else _frame(7), _frame(0, k) if k else _frame(8),
                                      goal={"g": 0.0}), "obs", "t", np.full(k, 0.5) if k else 0.5))
    a, b = buf.sample(4), twin.sample(4)
    np.testing.assert_array_equal(a.indices, b.indices)
    for key in KEYS:
        np.testing.assert_array_equal(a["obs"][key], b["obs"][key])
        np.testing.assert_array_equal(a["next_obs"][key], b["next_obs"][key])
    np.testing.assert_array_equal(a["goal"]["g"], b["goal"]["g"])


def _episodic_dict_buffer(layout):
    rng = np.random.default_rng(1)
    frames = layout.get("frame_stack")
    cfg = Episodes(n_step=3, gamma=0.8, streams=2, **layout, **({"frame_margin": 4 * frames} if frames else {}))
    buf = perx.ReplayBuffer(12, perx.Proportional(), seed=2, episodes=cfg)
    world = DictWorld(rng, 2, cfg.frame_stack, cfg.frame_padding)
    feed(buf, world, rng, 29, rounds=bool(frames))
    return buf


def test_plain_buffers_are_still_saved_in_format_version_2_and_dict_buffers_in_3(tmp_path):
    plain = perx.ReplayBuffer(4)
    plain.add(obs=np.zeros(2), action=1)
    plain.save(tmp_path / "p.npz")
    meta, _ = members(tmp_path / "p.npz")
    assert meta["version"] == 2 and "dict_fields" not in meta
    _episodic_dict_buffer(dict(next_obs="shared")).save(tmp_path / "d.npz")
    meta, arrays = members(tmp_path / "d.npz")
    assert meta["version"] == 3
    assert meta["dict_fields"]["obs"] == [[k, list(s), np.dtype(d).str] for k, (s, d) in KEYS.items()]
    assert meta["dict_fields"]["goal"] == [["g", [], "<f4"]] and "data/goal.g" in arrays


def _saved_dict_file(tmp_path, layout):
    buf = _episodic_dict_buffer(layout)
    path = tmp_path / "d.npz"
    buf.save(path)
    return path, members(path)


@pytest.mark.parametrize("layout", [dict(next_obs="stored"), dict(next_obs="shared"), dict(frame_stack=2)],
                         ids=["stored", "shared", "frames"])
@pytest.mark.parametrize("craft", [
    "dtype of a key", "shape of a key", "key renamed", "keys of next_obs", "no dict_fields", "dict_fields in v2",
    "packed unit", "a flattened key missing", "nested field gone", "not a list"])
def test_crafted_dict_metadata_is_refused_at_load(tmp_path, layout, craft):
    path, (meta, arrays) = _saved_dict_file(tmp_path, layout)
    d = meta["dict_fields"]
    if craft == "dtype of a key":
        d["obs"][0][2] = "<f8"
        d["next_obs"][0][2] = "<f8"
    elif craft == "shape of a key":  # (one within the packed unit's words would read as crafted data does)
        d["obs"][0][1] = [30]
        d["next_obs"][0][1] = [30]
        d["goal"][0][1] = [2]
    elif craft == "key renamed":
        d["goal"][0][0] = "h"
    elif craft == "keys of next_obs":
        d["next_obs"] = d["next_obs"][:-1]
    elif craft == "no dict_fields":
        del meta["dict_fields"]
    elif craft == "dict_fields in v2":
        meta["version"] = 2
    elif craft == "packed unit":
        if layout.get("next_obs") == "stored":
            meta["spec"]["obs"][0] = [meta["spec"]["obs"][0][0] + 1]
        else:
            meta["episodes"]["obs_spec"][0][-1] += 1
    elif craft == "a flattened key missing":
        del meta["spec"]["goal.g"], arrays["data/goal.g"]
    elif craft == "nested field gone":
        del d["goal"]
    else:
        d["obs"] = "pos"
    rewrite(path, meta, arrays)
    if craft == "nested field gone":  # then goal.g is a plain field with a dotted name: a different buffer
        twin = perx.ReplayBuffer.load(path)
        assert "goal.g" in twin.spec and "goal" not in twin.get([20])
        return
    with pytest.raises(ValueError) as info:
        perx.ReplayBuffer.load(path)
    assert str(path) in str(info.value)


def test_damaged_dict_buffer_files_load_identically_or_raise_value_error(tmp_path):
    rng = np.random.default_rng(0)
    originals = []
    for layout in (dict(next_obs="stored"), dict(next_obs="shared"), dict(frame_stack=2)):
        buf = _episodic_dict_buffer(layout)
        path = tmp_path / f"{len(originals)}.npz"
        buf.save(path)
        originals.append((buf, perx.ReplayBuffer.load(path), path.read_bytes()))
    plain = perx.ReplayBuffer(8, perx.RankBased(), seed=0)
    for i in range(11):
        plain.add(**transition(rng, i))
    plain.save(tmp_path / "plain.npz")
    originals.append((plain, perx.ReplayBuffer.load(tmp_path / "plain.npz"), (tmp_path / "plain.npz").read_bytes()))
    refused = 0
    target = tmp_path / "fuzzed.npz"
    for _ in range(160):
        buf, clean, raw = originals[int(rng.integers(len(originals)))]
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
            refused += 1
            continue
        assert_state(state(clean), state(twin))  # a change that loads must have changed nothing
        live = np.arange(max(0, buf.next_index - buf.capacity), buf.next_index)
        x, y = buf.get(live), twin.get(live)
        for key in x:
            if isinstance(x[key], dict):
                for sub in x[key]:
                    np.testing.assert_array_equal(x[key][sub], y[key][sub])
            else:
                np.testing.assert_array_equal(x[key], y[key])
    assert refused > 100


# -- batches, copies, threads, cost ---------------------------------------------------------------------------

def test_a_batch_gives_dict_fields_as_dicts_and_by_their_stored_names():
    buf = perx.ReplayBuffer(8, perx.Proportional(), seed=0)
    rng = np.random.default_rng(0)
    buf.extend(**stacked([transition(rng, i) for i in range(8)]))
    batch = buf.sample(32)  # fused draw and copy
    assert list(batch) == ["obs", "action", "next_obs", "goal"]
    assert set(batch["obs"]) == set(KEYS) and batch["obs.pos"] is batch["obs"]["pos"] and "obs.pos" in batch
    with pytest.raises(KeyError):
        batch["obs.nope"]
    assert "obs: {pos: float32[32, 3], cell: uint8[32, 2, 2]" in repr(batch)
    refilled = buf.sample(32, out=batch)
    assert refilled is batch
    np.testing.assert_array_equal(batch["obs"]["t"], batch.indices)
    np.testing.assert_array_equal(batch["next_obs"]["t"], batch.indices + 1)
    np.testing.assert_array_equal(batch["goal"]["y"][:, 0], batch.indices)


def test_torch_tensors_of_a_dict_batch():
    torch = pytest.importorskip("torch")
    from perx.torch import as_tensors

    buf = perx.ReplayBuffer(8, episodes=Episodes(n_step=2, next_obs="shared"))
    buf.add(**_ep_step(_frame(0), _frame(1)))
    t = as_tensors(buf.sample(4))
    assert t["obs"]["pos"].dtype == torch.float32 and t["next_obs"]["cell"].dtype == torch.uint8
    assert t["return"].shape == (4,) and t["indices"].dtype == torch.int64


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda b: pickle.loads(pickle.dumps(b))], ids=["deepcopy", "pickle"])
def test_a_locked_dict_buffer_copies_and_locks_itself(copier):
    buf = perx.ReplayBuffer(6, episodes=Episodes(n_step=1, next_obs="shared"), lock=True)
    buf.add(**_ep_step(_frame(0), _frame(1)))
    twin = copier(buf)
    assert twin.lock is not buf.lock and twin.lock is not None
    twin.add(**_ep_step(_frame(1), _frame(2)))  # the copy continues the episode; the original is unchanged
    assert len(twin) == 2 and len(buf) == 1
    assert twin.get([0, 1])["next_obs"]["t"].tolist() == [1, 2]
    assert twin.add.__wrapped__ == twin._add_nested and twin.sample.__wrapped__ == twin._sample_nested
    with pytest.raises(ValueError, match="continues an episode"):
        buf.add(**_ep_step(_frame(5), _frame(6)))


@pytest.mark.parametrize("cfg", [None, Episodes(n_step=3), Episodes(next_obs="shared")],
                         ids=["plain", "stored", "shared"])
def test_a_buffer_without_dict_fields_keeps_its_methods_unwrapped(cfg):
    """The cost of dict fields for a buffer without them: none. After its first add it has no instance attribute
    that shadows a method, so add, extend, sample and get are the class's own (only the first add of a buffer
    without spec= looks for dicts)."""
    buf = perx.ReplayBuffer(6, episodes=cfg)
    assert "_write" in vars(buf)  # the layout is open until the first add
    buf.add(**_ep_step(np.zeros(2, np.float32), np.ones(2, np.float32)))
    assert not {"_write", "add", "extend", "sample", "get"} & set(vars(buf))
    fixed = perx.ReplayBuffer(6, spec={"obs": ((2,), np.float32), "action": ((), np.int64)})
    assert not {"_write", "add", "extend", "sample", "get"} & set(vars(fixed))
