"""TD3 with perx replay: variants, priorities from two critics, PAL, resuming."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

import perx  # noqa: E402
import perx.torch as pt  # noqa: E402
from perx.agents import td3  # noqa: E402
from perx.agents.td3 import TD3Config  # noqa: E402

SMALL = dict(env_id="Pendulum-v1", total_steps=300, start_steps=100, eval_every=150, eval_episodes=1,
             capacity=1000, batch_size=32, hidden=32)


def test_every_variant_runs_a_few_hundred_steps_on_pendulum():
    configs = [TD3Config(variant=v, seed=i, **SMALL) for i, v in enumerate(td3.VARIANTS)]
    rows = td3.train(configs)
    for run in rows:
        assert [r["step"] for r in run] == [150, 300] and np.isfinite(run[-1]["loss"])


def filled(variant):
    runs = td3.Runs([TD3Config(variant=variant, **SMALL)])
    runs.start()
    for _ in range(120):
        runs.env_step(runs.act(runs.obs))
    return runs


@pytest.mark.parametrize("variant", ["per", "lap"])
def test_priority_is_the_larger_critic_error_for_exactly_the_sampled_ids(variant):
    runs = filled(variant)
    buf = runs.buffers[0]
    seen = {}
    sample, update = buf.sample, buf.update_priorities

    def rec_sample(*a, **k):
        seen["batch"] = sample(*a, **k)
        return seen["batch"]

    def rec_update(ids, td):
        seen["ids"], seen["td"] = np.asarray(ids).copy(), np.asarray(td).copy()
        return update(ids, td)

    buf.sample, buf.update_priorities = rec_sample, rec_update
    before = {k: {n: v.clone() for n, v in net.state_dict().items()} for k, net in runs.nets.items()}
    noise_state = runs.noise[0].get_state()
    runs.update()
    batch = seen["batch"]
    np.testing.assert_array_equal(seen["ids"], batch.indices)
    # recompute both critics' TD errors with the networks and the noise generator as they were
    for k, net in runs.nets.items():
        net.load_state_dict(before[k])
    runs.noise[0].set_state(noise_state)
    c = runs.cfg
    with torch.no_grad():
        obs, nxt, act = runs.stack([batch], "obs"), runs.stack([batch], "next_obs"), runs.stack([batch], "action")
        noise = torch.randn(c.batch_size, runs.act_dim, generator=runs.noise[0])[None]
        noise = (noise * c.policy_noise).clamp(-c.noise_clip, c.noise_clip) * runs.scale
        a2 = (runs.pi(runs.actor_t, nxt) + noise).clamp(-2.0, 2.0)
        sa2 = torch.cat([nxt, a2], dim=-1)
        y = runs.stack([batch], "return") + runs.stack([batch], "discount") * torch.min(
            runs.q1_t(sa2), runs.q2_t(sa2)).squeeze(-1)
        sa = torch.cat([obs, act], dim=-1)
        d1, d2 = runs.q1(sa).squeeze(-1) - y, runs.q2(sa).squeeze(-1) - y
    np.testing.assert_allclose(seen["td"], torch.max(d1.abs(), d2.abs())[0].numpy(), rtol=1e-5, atol=1e-6)


def test_pal_samples_uniformly_and_its_loss_is_perx_torch_pal():
    runs = filled("pal")
    assert isinstance(runs.buffers[0].sampler, perx.Uniform)
    delta = torch.tensor([[0.3, -2.0, 5.0, 0.0]])
    got = td3.critic_loss(delta, torch.ones_like(delta), torch.tensor([2]), torch.tensor([1.0]), torch.tensor([0.4]))
    assert got.item() == pytest.approx(pt.pal(delta[0], alpha=0.4, kappa=1.0).item(), rel=1e-6)
    mse = td3.critic_loss(delta, torch.full_like(delta, 0.5), torch.tensor([0]), torch.tensor([1.0]),
                          torch.tensor([0.0]))
    assert mse.item() == pytest.approx((0.5 * delta**2).mean().item(), rel=1e-6)  # IS-weighted MSE


def test_resuming_td3_continues_exactly(tmp_path):
    configs = [TD3Config(variant="per", seed=0, **SMALL), TD3Config(variant="lap", seed=1, **SMALL)]
    full, resumed = [], []
    td3.train(configs, [tmp_path / "f0", tmp_path / "f1"], on_update=lambda s, losses: full.append((s, losses.copy())))
    dirs = [tmp_path / "c0", tmp_path / "c1"]
    td3.train(configs, dirs, stop_after=150)
    td3.train(configs, dirs, on_update=lambda s, losses: resumed.append((s, losses.copy())))
    after = [x for x in full if x[0] > 150]
    assert len(after) == len(resumed) > 0
    for (s1, l1), (s2, l2) in zip(after, resumed, strict=True):
        assert s1 == s2
        np.testing.assert_array_equal(l1, l2)


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Pendulum-v1"])
def test_a_saved_environment_continues_exactly(env_id):
    """MuJoCo environments pickle only their constructor arguments: the simulator state and the random
    generator are saved apart (found by review: a resumed Hopper restarted from its initial pose)."""
    pytest.importorskip("mujoco") if env_id.startswith("Hopper") else None
    from perx.agents.envs import make_env
    from perx.agents.runner import env_state, restore_env

    env = make_env(env_id)
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        env.step(env.action_space.sample() * 0 + rng.uniform(-1, 1, env.action_space.shape).astype(np.float32))
    twin = restore_env(env_state(env))
    for _ in range(60):
        a = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
        o1, r1, t1, u1, _ = env.step(a)
        o2, r2, t2, u2, _ = twin.step(a)
        np.testing.assert_array_equal(o1, o2)
        assert (r1, t1, u1) == (r2, t2, u2)
        if t1 or u1:
            np.testing.assert_array_equal(env.reset()[0], twin.reset()[0])  # the generators agree too


def test_resuming_td3_on_mujoco_continues_exactly(tmp_path):
    pytest.importorskip("mujoco")
    small = dict(SMALL, env_id="Hopper-v5", total_steps=80, start_steps=40, eval_every=40, eval_max_steps=50)
    cfg = TD3Config(variant="per", **small)
    full, resumed = [], []
    td3.train(cfg, [tmp_path / "f"], on_update=lambda s, losses: full.append((s, losses.copy())))
    td3.train(cfg, [tmp_path / "c"], stop_after=40)
    td3.train(cfg, [tmp_path / "c"], on_update=lambda s, losses: resumed.append((s, losses.copy())))
    after = [x for x in full if x[0] > 40]
    assert len(after) == len(resumed) > 0
    for (s1, l1), (s2, l2) in zip(after, resumed, strict=True):
        assert s1 == s2
        np.testing.assert_array_equal(l1, l2)


def test_pal_uses_one_lambda_for_both_critics():
    d1, d2 = torch.tensor([[0.5, 4.0]]), torch.tensor([[2.0, 1.0]])
    top = torch.max(d1.abs(), d2.abs())
    lam = top.clamp(min=1.0).pow(0.4).mean()
    got = td3.critic_loss(d1, torch.ones_like(d1), torch.tensor([2]), torch.tensor([1.0]), torch.tensor([0.4]), top)
    assert got.item() == pytest.approx((pt.pal(d1[0], 0.4, 1.0, lam=lam)).item(), rel=1e-6)


def test_preset_004_samples_as_its_code_and_perx_keeps_the_committed_studys_setting():
    per = td3.make_sampler(TD3Config(variant="per", preset="004")).config()
    assert (per["alpha"], per["eps"], per["normalize"], per["stratified"]) == (0.6, 1e-10, "batch", False)
    assert td3.make_sampler(TD3Config(variant="lap", preset="004")).config()["stratified"] is False
    # the default preset is what results/mujoco ran: weights over the buffer-wide largest, stratified draws
    committed = td3.make_sampler(TD3Config(variant="per")).config()
    assert (committed["normalize"], committed["stratified"]) == ("buffer", True)
    assert td3.make_sampler(TD3Config(variant="lap")).config() == perx.LAP(alpha=0.4, kappa=1.0).config()


@pytest.mark.parametrize(("preset", "beta_steps", "step", "expected"), [
    ("004", None, 100_000, 0.415),  # 004's code: 0.4 + 2e-7 per update, 75k updates after 25k random steps
    ("004", None, 3_025_000, 1.0),
    ("perx", None, 62_500, 0.7),  # the whole run: halfway between 25k and 100k
    ("perx", 150_000, 100_000, 0.7),  # an explicit horizon wins over the preset's
])
def test_beta_reaches_one_over_the_presets_horizon(preset, beta_steps, step, expected):
    cfg = TD3Config(variant="per", preset=preset, beta_steps=beta_steps, env_id="Pendulum-v1", total_steps=100_000,
                    start_steps=25_000)
    runs = td3.Runs([cfg])
    runs.step = step
    assert runs.beta(0) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("field", "value"), [("preset", "003"), ("beta_steps", 0), ("beta_steps", True)])
def test_bad_preset_or_beta_horizon_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=field):
        TD3Config(**{field: value})


class _Counting:
    """A buffer passed in: the default perx buffer behind a proxy that counts the agent's calls."""

    def __init__(self, inner):
        self.inner, self.calls = inner, {"extend": 0, "sample": 0, "update_priorities": 0}

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in self.calls:
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


def test_a_buffer_passed_in_takes_every_store_sample_and_update_and_trains_identically():
    cfg = TD3Config(variant="per", seed=3, **SMALL)
    reference = td3.train(cfg)
    inner = perx.ReplayBuffer(cfg.capacity, td3.make_sampler(cfg), seed=cfg.seed,
                              episodes=perx.Episodes(n_step=1, gamma=cfg.gamma, next_obs="shared"))
    proxy = _Counting(inner)
    rows = td3.train(cfg, buffers=[proxy])
    def learned(run):  # everything but the clock, nan (no episode finished yet) as None
        return [{k: (None if v != v else v) for k, v in row.items() if k != "steps_per_second"} for row in run]

    assert learned(rows[0]) == learned(reference[0])  # same losses and returns, bit for bit
    updates = cfg.total_steps - cfg.start_steps + 1  # one per step from step start_steps on
    assert proxy.calls == {"extend": cfg.total_steps, "sample": updates, "update_priorities": updates}


def test_buffers_passed_in_are_refused_with_checkpoints_or_in_the_wrong_number(tmp_path):
    cfg = TD3Config(variant="uniform", **SMALL)
    with pytest.raises(ValueError, match="buffers"):
        td3.train(cfg, [tmp_path], buffers=[object()])
    with pytest.raises(ValueError, match="buffers: one per run, got 2 for 1"):
        td3.Runs([cfg], buffers=[object(), object()])
