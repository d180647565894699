"""Episodic buffers: n-step windows, next observations and frame stacks stored once, several streams.

Every check compares with a brute-force reference computed from the full list of steps, on random
layouts: several streams fed in random interleavings (a stream sometimes twice in one extend), episodes
that terminate or are truncated at random steps, wrap-around, and save/load.
"""

import numpy as np
import pytest

import perx
from perx.episodes import Episodes
from tests.conftest import SAMPLERS, assert_same, snapshot

OBS = 3  # observation vector: [stream, episode, step in episode] (+ 0.5 marks a final observation)


class World:
    """Streams of episodes; every step is a dict of fields plus its stream, kept in id order."""

    def __init__(self, rng, streams, frame_stack=None, padding="first"):
        self.rng = rng
        self.streams = streams
        self.k = frame_stack
        self.padding = padding
        self.episode = np.zeros(streams, int)
        self.t = np.zeros(streams, int)
        self.steps = []  # in id order

    def frame(self, e, episode, t):
        return np.array([e, episode, t], np.float32)

    def obs(self, e, episode, t):
        if not self.k:
            return self.frame(e, episode, t)
        frames = []
        for j in range(t - self.k + 1, t + 1):
            if j >= 0:
                frames.append(self.frame(e, episode, j))
            else:
                frames.append(np.zeros(OBS, np.float32) if self.padding == "zero" else self.frame(e, episode, 0))
        return np.stack(frames)

    def step(self, e):
        ep, t = self.episode[e], self.t[e]
        r = self.rng.random()
        term = r < 0.08
        trunc = not term and r < 0.14
        step = {"obs": self.obs(e, ep, t), "next_obs": self.obs(e, ep, t + 1), "action": np.int64(t),
                "reward": np.float32(self.rng.integers(-3, 4)), "terminated": term, "truncated": trunc,
                "stream": e}
        self.steps.append(step)
        if term or trunc:
            self.episode[e] += 1
            self.t[e] = 0
        else:
            self.t[e] += 1
        return step

    def window(self, i, n, gamma):
        """The reference n-step window of step i: (return, discount, steps, bootstrap next_obs)."""
        e = self.steps[i]["stream"]
        later = [j for j in range(i, len(self.steps)) if self.steps[j]["stream"] == e]
        g, d, k, j = 0.0, 1.0, 0, i
        for j in later:
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
    """Add ``total`` steps in random batches; each batch takes steps of random streams in time order.
    With ``rounds``, every stream takes one step per round (in a random order), as in a vector env."""
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
            stream = one.pop("stream")
            buf.add(stream=stream, **one)
        else:
            fields = {k: np.array([s[k] for s in batch]) for k in batch[0] if k != "stream"}
            buf.extend(stream=np.array([s["stream"] for s in batch]), **fields)


def check_all(buf, world, n, gamma):
    live = np.arange(max(0, buf.next_index - buf.capacity), buf.next_index)
    batch = buf.get(live)
    for row, i in enumerate(live.tolist()):
        g, d, k, nxt, term = world.window(i, n, gamma)
        assert batch["steps"][row] == k, (i, batch["steps"][row], k)
        assert batch["return"][row] == pytest.approx(g, abs=1e-9)
        assert batch["discount"][row] == pytest.approx(d, abs=1e-12)
        assert batch["terminated"][row] == term
        np.testing.assert_array_equal(batch["next_obs"][row], nxt)
        np.testing.assert_array_equal(batch["obs"][row], world.steps[i]["obs"])
        assert batch["action"][row] == world.steps[i]["action"]


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
@pytest.mark.parametrize("seed", range(3))
def test_windows_observations_and_stacks_match_brute_force(layout, streams, seed):
    rng = np.random.default_rng(seed)
    gamma = 0.9
    frames = layout.get("frame_stack")
    # rounds in a random order: consecutive steps of a stream are up to 2 * streams - 1 ids apart
    margin = {"frame_margin": (frames - 1) * 2 * streams} if frames else {}
    cfg = Episodes(gamma=gamma, streams=streams, **layout, **margin)
    capacity = int(rng.choice([7, 20, 64]))
    buf = perx.ReplayBuffer(capacity, perx.Uniform(), seed=seed, episodes=cfg)
    world = World(rng, streams, cfg.frame_stack, cfg.frame_padding)
    for total in (5, 30, 90, 200):  # partially filled, then wrapped around several times
        feed(buf, world, rng, total, rounds=bool(frames))
        check_all(buf, world, cfg.n_step, gamma)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
@pytest.mark.parametrize("name", ["uniform", "proportional"])
@pytest.mark.parametrize("streams", [1, 3])
def test_sampled_batches_carry_the_brute_force_windows(layout, name, streams):
    # sample() draws and copies the stored rows in one compiled call, then the window kernel overwrites the rows'
    # own next observations and end flags in that batch (stored mode) or adds the rebuilt ones: check that path
    # (check_all reads through get(), which copies the stored fields apart); batches of 1 to 40, with duplicates
    rng = np.random.default_rng(11)
    gamma = 0.9
    frames = layout.get("frame_stack")
    margin = {"frame_margin": (frames - 1) * 2 * streams} if frames else {}
    cfg = Episodes(gamma=gamma, streams=streams, **layout, **margin)
    buf = perx.ReplayBuffer(64, SAMPLERS[name](), seed=3, episodes=cfg)
    world = World(rng, streams, cfg.frame_stack, cfg.frame_padding)
    for total in (20, 150):
        feed(buf, world, rng, total, rounds=bool(frames))
        for b in (1, 7, 40):
            batch = buf.sample(b, beta=0.5)
            for row, i in enumerate(batch.indices.tolist()):
                g, d, k, nxt, term = world.window(i, cfg.n_step, gamma)
                assert batch["steps"][row] == k and batch["terminated"][row] == term
                assert batch["return"][row] == pytest.approx(g, abs=1e-9)
                assert batch["discount"][row] == pytest.approx(d, abs=1e-12)
                np.testing.assert_array_equal(batch["next_obs"][row], nxt)
                np.testing.assert_array_equal(batch["obs"][row], world.steps[i]["obs"])
                assert batch["action"][row] == world.steps[i]["action"]


def test_a_copied_episodic_buffer_remakes_its_gather_cache_and_samples_the_same():
    import copy
    import pickle

    rng = np.random.default_rng(2)
    buf = perx.ReplayBuffer(50, perx.Proportional(), seed=0, episodes=Episodes(n_step=3, streams=2))
    world = World(rng, 2)
    feed(buf, world, rng, 70)
    buf.sample(4)  # fills the store's cache of views into the storage
    assert buf._episodes._stored_args is not None
    for make in (lambda: pickle.loads(pickle.dumps(buf)), lambda: copy.deepcopy(buf)):
        twin = make()
        assert twin._episodes._stored_args is None  # views of the original's rows are not carried over
        a, b = buf.sample(9), twin.sample(9)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
        own = copy.deepcopy(world)
        feed(twin, own, rng, 90)  # the twin's new rows are read through its own views
        check_all(twin, own, 3, 0.99)


def test_a_store_carrying_the_gather_cache_of_an_earlier_perx_still_samples():
    # perx before 2975670 cached (next_obs field, its 2-D view) as _next_rows, and pickled it; with the field kept
    # apart from the rows (zero-size observations) the unpickled field is that tuple's first element (pickle's memo)
    import pickle

    buf = perx.ReplayBuffer(8, episodes=Episodes(n_step=2, check=False))
    for i in range(11):
        buf.add(obs=np.zeros(0, np.float32), next_obs=np.zeros(0, np.float32), reward=float(i), terminated=False,
                truncated=i % 4 == 3)
    want = buf.get(np.arange(3, 11))
    field = buf._storage.data["next_obs"]
    buf._episodes._next_rows = (field, field.reshape(len(field), -1))  # as the earlier perx left it
    twin = pickle.loads(pickle.dumps(buf))
    assert "_next_rows" not in twin._episodes.__dict__
    for b in (buf, twin):
        got = b.get(np.arange(3, 11))
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


@pytest.mark.parametrize("n_step", [1, 3])
def test_stacks_of_scalar_frames_are_rebuilt_like_any_stack(n_step):
    # observations of shape (k,): k frames of one number each, so a batch of stacks is [B, k], two-dimensional
    # like a batch of vectors, but it holds B * k frames
    k, gamma = 3, 0.5
    buf = perx.ReplayBuffer(64, perx.Proportional(), seed=0, episodes=Episodes(n_step=n_step, gamma=gamma,
                                                                                frame_stack=k))

    def stack(t):  # frames t-k+1 .. t of the one episode, "first" padding; frame value t + 1
        return np.array([max(j, 0) + 1 for j in range(t - k + 1, t + 1)], np.float32)

    for t in range(40):
        buf.add(obs=stack(t), next_obs=stack(t + 1), reward=float(t), terminated=False, truncated=False)
    for batch in (buf.get(np.arange(20, 40)), buf.sample(40)):
        for row, i in enumerate(batch.indices.tolist()):
            last = min(i + n_step - 1, 39)  # the window ends at the write head
            np.testing.assert_array_equal(batch["obs"][row], stack(i))
            np.testing.assert_array_equal(batch["next_obs"][row], stack(last + 1))
            assert batch["steps"][row] == last - i + 1
            assert batch["return"][row] == pytest.approx(sum(gamma ** (j - i) * j for j in range(i, last + 1)))


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
@pytest.mark.parametrize("name", ["uniform", "proportional", "rank", "greedy"])
def test_save_load_round_trips_an_episodic_buffer(layout, name, tmp_path):
    rng = np.random.default_rng(4)
    frames = layout.get("frame_stack")
    cfg = Episodes(gamma=0.8, streams=2, **layout, **({"frame_margin": 4 * frames} if frames else {}))
    buf = perx.ReplayBuffer(30, SAMPLERS[name](), seed=1, episodes=cfg)
    world = World(rng, 2, cfg.frame_stack, cfg.frame_padding)
    feed(buf, world, rng, 47, rounds=bool(frames))
    buf.save(tmp_path / "e.npz")
    twin = perx.ReplayBuffer.load(tmp_path / "e.npz")
    assert twin.episodes.config() == cfg.config()
    for _ in range(3):
        a, b = buf.sample(6), twin.sample(6)
        np.testing.assert_array_equal(a.indices, b.indices)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    feed(twin, world, rng, 80, rounds=bool(frames))  # the loaded buffer carries on
    check_all(twin, world, cfg.n_step, 0.8)


def test_every_sampler_works_with_episodes(make_sampler):
    rng = np.random.default_rng(0)
    buf = perx.ReplayBuffer(40, make_sampler(), seed=0, episodes=Episodes(n_step=3, streams=2, next_obs="shared"))
    world = World(rng, 2)
    feed(buf, world, rng, 60)
    batch = buf.sample(8, beta=0.5)
    assert batch["return"].shape == (8,) and batch["obs"].shape == (8, OBS)
    assert buf.update_priorities(batch.indices, rng.standard_normal(8)) == 8


@pytest.mark.parametrize("next_obs", ["stored", "shared"])
def test_a_step_that_does_not_continue_its_episode_is_refused(next_obs):
    rng = np.random.default_rng(0)
    buf = perx.ReplayBuffer(20, episodes=Episodes(n_step=2, streams=2, next_obs=next_obs))
    world = World(rng, 2)
    feed(buf, world, rng, 6)
    e = 0
    step = world.step(e)
    wrong = dict(step, obs=step["obs"] + 7)  # not the previous step's next_obs
    wrong.pop("stream")
    before = buf.next_index
    assert buf._episodes.head_open[e]  # (seed 0: stream 0's episode goes on)
    with pytest.raises(ValueError, match="continues an episode"):
        buf.add(stream=e, **wrong)
    assert buf.next_index == before
    with pytest.raises(ValueError, match="continues an episode"):  # the same inside one extend
        fields = {k: np.array([v, v]) for k, v in wrong.items()}
        fields["obs"][0] = step["obs"]
        buf.extend(stream=np.array([e, e]), **fields)
    assert buf.next_index == before
    with pytest.raises(ValueError, match="stream"):
        buf.add(stream=5, **wrong)
    with pytest.raises(ValueError, match="stream"):
        buf.add(**wrong)  # two streams: the stream must be given


@pytest.mark.parametrize("layout", [dict(next_obs="stored"), dict(next_obs="shared"), dict(frame_stack=1),
                                    dict(frame_stack=2), dict(frame_stack=3, frame_padding="zero")],
                         ids=["stored", "shared", "frames1", "frames2", "frames3-zero"])
def test_the_bogus_reset_step_of_next_step_autoreset_is_refused_only_with_stacks_of_two_frames_or_more(layout):
    """Gymnasium's default autoreset: the step after an episode ends only resets that sub-env (reward 0; obs the
    final observation, next_obs the reset one). Added by hand, it is refused where the buffer can tell: with stacks
    of k >= 2 frames its next stack (the reset stack) is not its stack shifted by one frame, unless the pair is
    itself a valid first step (a final stack that is the reset stack, or all zeros with zero padding). Without
    stacks it looks exactly like a legitimate first step of an episode (one whose reset observation is where the
    last episode ended: an episode continued after end_episodes, an environment with one observation, a time
    limit hit at the start state), so it is stored as one; only perx.gym.VectorRecorder, which knows the
    autoreset mode, can drop it (tests/test_gym.py)."""
    cfg = Episodes(n_step=3, gamma=0.5, **layout)
    k = cfg.frame_stack
    pad = 0.0 if cfg.frame_padding == "zero" else None

    def obs(*frames):  # the stack ending at the last of these frames of one episode (the frame itself if no stacks)
        if not k:
            return np.full(2, frames[-1], np.float32)
        frames = [pad if pad is not None else frames[0]] * k + list(frames)
        return np.stack([np.full(2, v, np.float32) for v in frames[-k:]])

    buf = perx.ReplayBuffer(20, episodes=cfg)
    buf.add(**_step(obs(5), obs(5, 6), r=1.0))
    buf.add(**_step(obs(5, 6), obs(5, 6, 9), r=1.0, term=True))  # the episode ends at frame 9
    bogus = _step(obs(5, 6, 9), obs(5))  # final -> reset, not a transition of the environment
    if k and k > 1:
        before = snapshot(buf)
        with pytest.raises(ValueError, match="shifted by one frame"):
            buf.add(**bogus)
        assert_same(before, snapshot(buf))
        # accepted where (final stack -> reset stack) is itself a valid first step: a final stack that is the
        # reset stack ("first" padding) or all zeros ("zero")
        z = 9 if pad is None else 0
        buf.add(**_step(obs(z), obs(z, z), term=True))
        ids = buf.add(**_step(obs(z, z), obs(9)))
    else:
        ids = buf.add(**bogus)
    batch = buf.get(ids)
    assert buf.predecessors(ids).tolist() == [-1] and batch["steps"].tolist() == [1]  # stored as a first step
    assert buf.get([1])["steps"].tolist() == [1]  # the ended episode's windows do not cross into it


def test_frame_stacks_store_each_frame_once():
    k, frame = 4, (84, 84)
    cfg = Episodes(n_step=3, frame_stack=k)
    buf = perx.ReplayBuffer(1000, episodes=cfg)
    stacked = perx.ReplayBuffer(1000)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (1001, *frame), dtype=np.uint8)
    obs = np.stack([frames[np.maximum(np.arange(t - k + 1, t + 1), 0)] for t in range(1001)])
    fields = dict(obs=obs[:-1], next_obs=obs[1:], action=np.zeros(1000, np.int64), reward=np.zeros(1000),
                  terminated=np.zeros(1000, bool), truncated=np.zeros(1000, bool))
    buf.extend(**fields)
    stacked.extend(**fields)
    # frames: 1 per step (plus the margin), against k per obs and k per next_obs stored in full
    assert buf.nbytes < stacked.nbytes / (2 * k) * 1.3
    batch = buf.sample(64)
    np.testing.assert_array_equal(batch["obs"], obs[batch.indices])


def test_wrong_padding_and_unshifted_stacks_are_refused():
    buf = perx.ReplayBuffer(10, episodes=Episodes(frame_stack=3, frame_padding="zero"))
    first = np.stack([np.full(2, 5.0)] * 3).astype(np.float32)  # padded with the first frame, not zeros
    nxt = np.stack([first[1], first[2], np.full(2, 6.0, np.float32)])
    with pytest.raises(ValueError, match="padded"):
        buf.add(obs=first, next_obs=nxt, reward=0.0, terminated=False, truncated=False)
    buf2 = perx.ReplayBuffer(10, episodes=Episodes(frame_stack=3))
    with pytest.raises(ValueError, match="shifted"):
        buf2.add(obs=first, next_obs=first + 1, reward=0.0, terminated=False, truncated=False)
    assert len(buf) == 0 and len(buf2) == 0


def test_a_stream_that_falls_behind_is_refused_with_frames():
    cfg = Episodes(frame_stack=2, streams=2)  # margin 2: consecutive steps of a stream <= 2 ids apart
    buf = perx.ReplayBuffer(10, episodes=cfg)
    world = World(np.random.default_rng(0), 2, 2)
    world.rng = np.random.default_rng(1)

    def add(e):
        s = dict(world.step(e))
        s.pop("stream")
        buf.add(stream=e, **s)

    add(0)
    add(1)
    add(1)
    add(1)  # stream 0's next step would be 3 ids after its previous one
    if buf._episodes.head_open[0]:
        with pytest.raises(ValueError, match="frame_margin"):
            add(0)


def test_bad_episode_configurations_are_refused():
    with pytest.raises(ValueError, match="n_step"):
        Episodes(n_step=0)
    with pytest.raises(ValueError, match="gamma"):
        Episodes(gamma=1.5)
    with pytest.raises(ValueError, match="next_obs"):
        Episodes(frame_stack=4, next_obs="stored")
    with pytest.raises(ValueError, match="frame_margin"):
        Episodes(frame_stack=4, streams=2, frame_margin=3)
    with pytest.raises(TypeError, match="episodes"):
        perx.ReplayBuffer(10, episodes={"n_step": 3})
    with pytest.raises(ValueError, match="stream"):
        perx.ReplayBuffer(10).add(obs=1.0, stream=0)


# -- found by an independent review (each reproduced first) --------------------------------------------

def _step(o, n, r=0.0, term=False, trunc=False):
    return {"obs": o, "next_obs": n, "reward": r, "terminated": term, "truncated": trunc}


@pytest.mark.parametrize("check", [True, False])
def test_next_obs_must_match_the_layout_of_obs(check):
    buf = perx.ReplayBuffer(10, perx.Proportional(), episodes=Episodes(next_obs="shared", check=check))
    with pytest.raises(TypeError, match="next_obs"):  # 300.0 would have been stored in uint8 as 44
        buf.add(**_step(np.array([1, 2], np.uint8), np.array([300.0, 0.5])))
    with pytest.raises(ValueError, match="next_obs"):  # (1,) would have broadcast into (3,)
        buf.add(**_step(np.zeros(3, np.float32), np.ones(1, np.float32)))
    assert len(buf) == 0 and buf.spec is None
    buf.add(**_step(np.zeros(3, np.float32), np.ones(3, np.float32)))
    assert buf.sample(1)["next_obs"].tolist() == [[1.0, 1.0, 1.0]]


@pytest.mark.parametrize(("fields", "error", "match"), [
    ({"reward": np.float16(1.0)}, TypeError, "reward"),
    ({"reward": 1 + 2j}, TypeError, "reward"),
    ({"reward": np.ones(1)}, TypeError, "reward"),
    ({"obs": np.zeros(2, np.float16), "next_obs": np.zeros(2, np.float16)}, TypeError, "float16"),
    ({"steps": 3}, ValueError, "steps"),
    ({"discount": 0.5}, ValueError, "discount"),
])
def test_fields_a_batch_could_not_be_computed_from_are_refused_at_add(fields, error, match):
    buf = perx.ReplayBuffer(10, episodes=Episodes(next_obs="shared"))
    step = _step(np.zeros(2, np.float32), np.ones(2, np.float32))
    step.update(fields)
    with pytest.raises(error, match=match):
        buf.add(**step)
    assert len(buf) == 0


def test_next_obs_is_required_even_without_checks():
    buf = perx.ReplayBuffer(10, episodes=Episodes(next_obs="stored", check=False))
    with pytest.raises(ValueError, match="next_obs"):
        buf.add(obs=np.zeros(2), reward=0.0, terminated=False, truncated=False)


def test_a_file_missing_a_needed_field_is_refused_at_load(tmp_path):
    from tests.test_hardening import members, rewrite

    buf = perx.ReplayBuffer(10, episodes=Episodes(n_step=2, next_obs="shared"))
    buf.add(**_step(np.zeros(2, np.float32), np.ones(2, np.float32)))
    path = tmp_path / "e.npz"
    buf.save(path)
    meta, arrays = members(path)
    del meta["spec"]["reward"], arrays["data/reward"]
    rewrite(path, meta, arrays)
    with pytest.raises(ValueError, match="reward"):
        perx.ReplayBuffer.load(path)


def test_every_frame_of_a_continuing_stack_is_checked():
    buf = perx.ReplayBuffer(10, episodes=Episodes(frame_stack=3))
    f = lambda v: np.full(2, v, np.float32)  # noqa: E731
    buf.add(**_step(np.stack([f(1), f(1), f(1)]), np.stack([f(1), f(1), f(2)])))
    with pytest.raises(ValueError, match="continues an episode"):  # older frame 9 is not the 1 stored
        buf.add(**_step(np.stack([f(9), f(1), f(2)]), np.stack([f(1), f(2), f(3)])))
    buf.add(**_step(np.stack([f(1), f(1), f(2)]), np.stack([f(1), f(2), f(3)])))
    assert len(buf) == 2


def test_observations_with_nan_can_be_continued():
    buf = perx.ReplayBuffer(10, episodes=Episodes(next_obs="shared"))
    o = np.array([np.nan, 1.0], np.float32)
    buf.add(**_step(o, o + 1))
    buf.add(**_step(o + 1, o + 2))
    assert len(buf) == 2


def test_a_failed_first_allocation_stores_nothing():
    buf = perx.ReplayBuffer(10**7, perx.Proportional(), episodes=Episodes(next_obs="shared"))
    big = np.zeros(10**7, np.uint8)
    with pytest.raises(MemoryError, match="capacity"):
        buf.add(**_step(big, big))
    assert len(buf) == 0 and buf.spec is None and buf._storage.spec is None
    buf2 = perx.ReplayBuffer(10, perx.Proportional(), episodes=Episodes(next_obs="shared"))
    buf2.add(**_step(np.zeros(2, np.float32), np.ones(2, np.float32)))  # the normal path still works
    assert len(buf2) == 1


def test_a_step_both_terminated_and_truncated_reports_both_and_does_not_bootstrap():
    buf = perx.ReplayBuffer(10, episodes=Episodes(n_step=3, gamma=0.5))
    buf.add(**_step(np.zeros(1), np.ones(1), r=1.0))
    buf.add(**_step(np.ones(1), np.full(1, 2.0), r=1.0, term=True, trunc=True))
    batch = buf.get([0, 1])
    assert batch["terminated"].tolist() == [True, True] and batch["truncated"].tolist() == [True, True]
    assert batch["discount"].tolist() == [0.0, 0.0] and batch["return"].tolist() == [1.5, 1.0]


@pytest.mark.parametrize("next_obs", ["stored", "shared"])
def test_end_episodes_cuts_an_abandoned_episode_as_a_truncation(next_obs):
    buf = perx.ReplayBuffer(10, episodes=Episodes(n_step=3, gamma=0.5, next_obs=next_obs))
    buf.add(**_step(np.zeros(1), np.ones(1), r=1.0))
    buf.add(**_step(np.ones(1), np.full(1, 2.0), r=1.0))
    assert buf.end_episodes() == 1
    buf.add(**_step(np.full(1, 7.0), np.full(1, 8.0), r=4.0))  # a new episode: anything may start it
    batch = buf.get([0, 1, 2])
    assert batch["steps"].tolist() == [2, 1, 1] and batch["truncated"].tolist() == [True, True, False]
    assert batch["next_obs"][:2, 0].tolist() == [2.0, 2.0]  # bootstrap from the abandoned episode's last obs
    assert batch["discount"].tolist() == [0.25, 0.5, 0.5]


def test_a_crafted_head_of_another_stream_is_refused(tmp_path):
    from tests.test_hardening import members, rewrite

    buf = perx.ReplayBuffer(10, episodes=Episodes(streams=2, next_obs="shared"))
    o = np.zeros((2, 2), np.float32)
    buf.extend(**{k: np.array([v, v]) for k, v in _step(o[0], o[0] + 1).items()}, stream=[0, 1])
    path = tmp_path / "e.npz"
    buf.save(path)
    meta, arrays = members(path)
    arrays["episodes/head"] = arrays["episodes/head"][::-1].copy()
    rewrite(path, meta, arrays)
    with pytest.raises(ValueError, match="head"):
        perx.ReplayBuffer.load(path)


@pytest.mark.parametrize("next_obs", ["shared", "stored"])
def test_one_step_adds_take_the_scalar_path_and_leave_the_same_state_as_the_batched_path(next_obs, monkeypatch):
    """EpisodeStore._prepare_one (single steps, no frame stacks) against the batched prepare: the same ids,
    the same stored state after every add, the same error (and nothing changed) for a broken episode."""

    def play(fast):
        monkeypatch.setattr(perx.episodes.EpisodeStore, "one_step_path", fast)
        rng = np.random.default_rng(11)
        buf = perx.ReplayBuffer(7, perx.Proportional(0.6), episodes=perx.Episodes(streams=3, n_step=2, gamma=0.9,
                                                                                    next_obs=next_obs), seed=3)
        last = {e: None for e in range(3)}
        trace = []
        for t in range(1500):
            e = int(rng.integers(3))
            obs = last[e] if last[e] is not None else rng.standard_normal(2).astype(np.float32)
            if last[e] is not None and rng.random() < 0.3:
                obs = obs + 1  # breaks the episode: refused, nothing stored
            nxt = rng.standard_normal(2).astype(np.float32)
            term, trunc = bool(rng.random() < 0.1), bool(rng.random() < 0.05)
            before = snapshot(buf)
            try:
                ids = buf.add(obs=obs, next_obs=nxt, action=t, reward=float(t), terminated=term, truncated=trunc,
                              stream=e)
            except ValueError as err:
                assert_same(before, snapshot(buf))
                trace.append(("error", str(err)))
                continue
            last[e] = None if term or trunc else nxt
            store = buf._episodes
            state = {k: v.copy() for k, v in vars(store).items() if isinstance(v, np.ndarray)}
            trace.append(("ok", np.asarray(ids).tolist(), snapshot(buf), state))
        assert len(buf) == 7
        batch = buf.get(np.arange(buf.next_index - 7, buf.next_index))
        trace.append(("batch", {k: np.asarray(batch[k]).copy() for k in batch.keys()}))
        return trace

    assert perx.episodes.EpisodeStore.one_step_path
    fast, batched = play(True), play(False)
    assert sum(step[0] == "error" for step in fast) > 3  # broken episodes were tried
    assert len(fast) == len(batched)
    for a, b in zip(fast, batched, strict=True):
        assert a[0] == b[0]
        if a[0] == "error":
            assert a[1] == b[1]
        elif a[0] == "ok":
            assert a[1] == b[1]
            assert_same(a[2], b[2])
            assert a[3].keys() == b[3].keys()
            for k in a[3]:
                np.testing.assert_array_equal(a[3][k], b[3][k], err_msg=k)
        else:
            assert a[1].keys() == b[1].keys()
            for k in a[1]:
                np.testing.assert_array_equal(a[1][k], b[1][k], err_msg=k)


@pytest.mark.parametrize("next_obs", ["shared", "stored"])
@pytest.mark.parametrize("rows", [1, 2])
def test_continuity_is_checked_against_the_stored_value_whatever_the_next_obs_dtype(next_obs, rows):
    """A next_obs in a narrower dtype than the store's (int8 into float32, a safe cast) must not round the stored
    observation it is compared with: 1.0 does not continue 1.5, and NaN continues NaN (single steps take the
    scalar path, two rows the batched one)."""
    buf = perx.ReplayBuffer(8, episodes=perx.Episodes(streams=2, next_obs=next_obs))
    streams = list(range(rows))

    def step(obs, nxt):
        buf.extend(obs=np.full((rows, 1), obs, np.float32), next_obs=np.full((rows, 1), nxt, nxt.dtype),
                   reward=np.zeros(rows), terminated=np.zeros(rows, bool), truncated=np.zeros(rows, bool),
                   stream=streams)

    step(0.0, np.float32(1.5))
    before = snapshot(buf)
    with pytest.raises(ValueError, match="continues an episode but its observation is not"):
        step(1.0, np.int8(2))  # stored 1.5, rounded to 1 by an int8 comparison array
    assert_same(before, snapshot(buf))
    buf.end_episodes()
    step(0.0, np.float32(np.nan))
    step(np.nan, np.int8(2))  # NaN continues NaN (an int8 comparison array would hold 0 or -128)


@pytest.mark.parametrize("spec", [False, True], ids=["inferred", "spec"])
@pytest.mark.parametrize("layout", [dict(next_obs="stored"), dict(next_obs="shared"), dict(frame_stack=2)],
                         ids=["stored", "shared", "frames"])
def test_an_episodic_buffer_saved_before_its_first_add_loads_and_then_works_as_a_fresh_one(layout, spec, tmp_path):
    """Before its first add a buffer without spec= has no fields yet (not even terminated/truncated), and a
    buffer with one has fields but no rows: either loads, and the loaded one then takes the same steps and
    draws the same batches as the buffer it was saved from."""
    cfg = Episodes(n_step=3, gamma=0.8, streams=2, **layout, **({"frame_margin": 4} if "frame_stack" in layout else {}))
    fields = None
    if spec:
        shape = (2, OBS) if cfg.frame_stack else (OBS,)
        fields = {"obs": (shape, np.float32), "next_obs": (shape, np.float32), "action": ((), np.int64),
                  "reward": ((), np.float32), "terminated": ((), np.bool_), "truncated": ((), np.bool_)}
    buf = perx.ReplayBuffer(20, perx.Proportional(), seed=3, episodes=cfg, spec=fields)
    buf.save(tmp_path / "e.npz")
    twin = perx.ReplayBuffer.load(tmp_path / "e.npz")
    assert len(twin) == 0 and twin.next_index == 0 and twin.episodes.config() == cfg.config()
    worlds = []
    for b in (buf, twin):  # the same steps in the same batches
        rng = np.random.default_rng(5)
        worlds.append(World(rng, 2, cfg.frame_stack, cfg.frame_padding))
        feed(b, worlds[-1], rng, 30, rounds=bool(cfg.frame_stack))
    check_all(twin, worlds[1], cfg.n_step, 0.8)
    a, b = buf.sample(6), twin.sample(6)
    np.testing.assert_array_equal(a.indices, b.indices)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def _crafted(tmp_path, buf, **changes):
    """Save ``buf``, then set the given members of the file (``episodes/...`` or ``data/...``, as arrays or as
    ``{index: value}``) and return its path."""
    from tests.test_hardening import members, rewrite

    path = tmp_path / "e.npz"
    buf.save(path)
    meta, arrays = members(path)
    for name, change in changes.items():
        name = name.replace("__", "/")
        if isinstance(change, dict):
            arrays[name] = arrays[name].copy()
            for index, value in change.items():
                arrays[name][index] = value
        else:
            arrays[name] = np.asarray(change, arrays[name].dtype)
    rewrite(path, meta, arrays)
    return path


def _two_streams_of_stacks():
    """Capacity 4, stacks of 2 frames, frame_margin 4, streams 0 and 1 adding in turn (ids 0, 2, ... 8 and 1, 3,
    ... 9), no episode ends: each id's frame follows id - 2, and the ring keeps the frames of ids 2 to 9."""
    buf = perx.ReplayBuffer(4, episodes=Episodes(frame_stack=2, streams=2, frame_margin=4))
    f = lambda e, t: np.full(2, 10 * e + t, np.float32)  # noqa: E731
    for t in range(5):
        buf.extend(obs=np.stack([np.stack([f(e, max(t - 1, 0)), f(e, t)]) for e in range(2)]),
                   next_obs=np.stack([np.stack([f(e, t), f(e, t + 1)]) for e in range(2)]),
                   reward=np.zeros(2), terminated=np.zeros(2, bool), truncated=np.zeros(2, bool), stream=[0, 1])
    return buf


@pytest.mark.parametrize("rpred, match", [  # rpred[i] is the frame predecessor of id i + 2
    ({6: 7, 7: 6}, "stored step's frame must follow"),  # ids 8 and 9 after the other stream's frames 7 and 6
    ({6: -1}, "stored step's frame must follow"),  # id 8 cut from id 6, though step 6 goes on into step 8
    ({4: 5}, "followed by at most one"),  # id 6, the oldest stored step of stream 0, after id 5, as id 7 is
    ({7: 8}, "newest step by none"),  # id 9 after id 8, stream 0's newest step
    ({5: 2}, "at most frame_margin"),  # id 7 after id 2, 5 ids back: further than adding allows
])
def test_crafted_frame_links_are_refused_at_load(tmp_path, rpred, match):
    """rpred (each frame's predecessor in the ring) must be what adding the steps wrote, as far as the rest of
    the file tells: for a stored step, the predecessor succ implies (an overwritten one only for its stream's
    oldest stored step); for every frame, an earlier frame within frame_margin // (k - 1) ids that no other
    frame and no stream's newest step follows. Stacks are walked through it: a crafted link would build them
    from another stream's frames."""
    buf = _two_streams_of_stacks()
    np.testing.assert_array_equal(perx.ReplayBuffer.load(_crafted(tmp_path, buf)).get([6, 7, 8, 9])["obs"],
                                  buf.get([6, 7, 8, 9])["obs"])  # as saved, it loads
    with pytest.raises(ValueError, match="rpred: a .*" + match):
        perx.ReplayBuffer.load(_crafted(tmp_path, buf, episodes__rpred=rpred))


def test_a_crafted_stream_head_must_be_its_newest_stored_step_and_open_only_after_a_step(tmp_path):
    """head (each stream's newest id, -1 before its first) and head_open (does its episode go on) are what the
    stored steps imply; an open head that was overwritten is a real state (a stream left behind), and loads."""
    buf = perx.ReplayBuffer(4, episodes=Episodes(n_step=3, streams=3, next_obs="shared"))
    o = lambda v: np.full(2, v, np.float32)  # noqa: E731
    buf.add(**_step(o(0), o(1)), stream=2)  # stream 2's step is overwritten below, its episode still open
    for t in range(4):
        buf.add(**_step(o(t), o(t + 1), trunc=t in (1, 3)), stream=0)  # ids 1..4; stream 1 never adds
    twin = perx.ReplayBuffer.load(_crafted(tmp_path, buf))
    assert twin._episodes.head.tolist() == [4, -1, 0] and twin._episodes.head_open.tolist() == [False, False, True]
    with pytest.raises(ValueError, match="head_open"):  # no step yet, but an episode going on
        perx.ReplayBuffer.load(_crafted(tmp_path, buf, episodes__head_open={1: True}))
    with pytest.raises(ValueError, match="head"):  # an older step of stream 0 than its newest, 4
        perx.ReplayBuffer.load(_crafted(tmp_path, buf, episodes__head={0: 3}))
    with pytest.raises(ValueError, match="head"):  # a stream with no stored step cannot have a stored head
        perx.ReplayBuffer.load(_crafted(tmp_path, buf, episodes__head={1: 3}))


@pytest.mark.parametrize("next_obs", ["stored", "shared"])
def test_crafted_successor_links_that_skip_a_step_or_share_a_successor_are_refused_at_load(tmp_path, next_obs):
    """succ links a step that goes on to the next stored step of its stream: a link that skips one (the skipped
    step made to end its episode, so that the flags agree) or two steps followed by the same one are refused."""
    buf = perx.ReplayBuffer(8, episodes=Episodes(n_step=3, streams=2, next_obs=next_obs))
    o = lambda v: np.full(2, v, np.float32)  # noqa: E731
    for t in range(4):
        buf.add(**_step(o(t), o(t + 1)), stream=0)
    buf.add(**_step(o(0), o(1)), stream=1)
    assert buf._episodes.succ[:5].tolist() == [1, 2, 3, -2, -2]
    perx.ReplayBuffer.load(_crafted(tmp_path, buf))  # as saved, it loads
    with pytest.raises(ValueError, match="succ"):  # step 0 skips step 1: both are followed by step 2
        perx.ReplayBuffer.load(_crafted(tmp_path, buf, episodes__succ={0: 2}))
    with pytest.raises(ValueError, match="succ"):  # step 0 skips steps 1 and 2: steps 0 and 2 followed by 3
        perx.ReplayBuffer.load(_crafted(tmp_path, buf, episodes__succ={0: 3}))
    if next_obs == "stored":  # (shared: the ended step would also need a final observation in the file)
        with pytest.raises(ValueError, match="succ"):
            perx.ReplayBuffer.load(_crafted(tmp_path, buf, episodes__succ={0: 2, 1: -1}, data__truncated={1: True}))
