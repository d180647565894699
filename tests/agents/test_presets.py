"""DQNConfig presets resolve to the published settings, and the defaults do not let PER collapse."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from perx.agents import dqn  # noqa: E402
from perx.agents.dqn import DQNConfig  # noqa: E402


def rows(preset):
    return {v: DQNConfig(preset=preset, variant=v).settings() for v in dqn.VARIANTS}


def test_preset_minatar_is_young_and_tian_2019():
    # MinAtar's examples/dqn.py as published with the paper: centered RMSprop (alpha 0.95, eps 0.01), step
    # size 2.5e-4, batch 32, replay 100k, one update per frame, target copy every 1000 updates, replay start
    # 5000, epsilon 1 -> 0.1 over the first 100k frames, gamma 0.99
    c = DQNConfig(preset="minatar")
    assert (c.optimizer, c.optimizer_eps, c.learning_rate, c.batch_size, c.capacity, c.train_frequency,
            c.target_update, c.learning_starts, c.eps_start, c.eps_end, c.eps_decay_steps, c.gamma) == (
        "rmsprop", 0.01, 2.5e-4, 32, 100_000, 1, 1000, 5000, 1.0, 0.1, 100_000, 0.99)
    opt = dqn.Runs([DQNConfig(preset="minatar", env_id="CartPole-v1")]).optimizer
    assert (opt.alpha, opt.centered, opt.eps) == (0.95, True, 0.01)
    # the variants as perx ran its MinAtar study: 000 for per and rank, 004's floor and kappa
    r = rows("minatar")
    assert r["per"] | {} == {**r["per"], "alpha": 0.6, "beta0": 0.4, "lr_scale": 0.25, "normalize": "buffer",
                              "priority_eps": 1e-10}
    assert (r["rank"]["alpha"], r["rank"]["beta0"], r["rank"]["lr_scale"]) == (0.7, 0.5, 0.25)


def test_preset_000_is_schaul_2016():
    c = DQNConfig(preset="000", total_steps=300_000)
    # Sec. 4: a 10^6 sliding window, one minibatch of 32 per 4 new transitions, TD errors clipped to [-1, 1];
    # Table 3: alpha 0.6 / beta 0.4 -> 1 (proportional), 0.7 / 0.5 -> 1 (rank), eta_baseline / 4 with
    # eta_baseline = 0.00025 (Table 2), beta reaching 1 at the end of training; Sec. 3.4: max_i w_i = 1 over
    # the memory
    assert (c.capacity, c.batch_size, c.train_frequency, c.learning_rate, c.beta_steps) == (
        1_000_000, 32, 4, 2.5e-4, 300_000)
    r = rows("000")
    assert {k: r["per"][k] for k in ("alpha", "beta0", "lr_scale", "normalize", "priority_clip")} == {
        "alpha": 0.6, "beta0": 0.4, "lr_scale": 0.25, "normalize": "buffer", "priority_clip": 1.0}
    assert {k: r["rank"][k] for k in ("alpha", "beta0", "lr_scale", "normalize", "priority_clip")} == {
        "alpha": 0.7, "beta0": 0.5, "lr_scale": 0.25, "normalize": "buffer", "priority_clip": 1.0}
    assert r["uniform"]["lr_scale"] == 1.0


def test_preset_004_is_fujimoto_2020_table_7():
    c = DQNConfig(preset="004")
    # Table 7 (and the paper's code for the 1e6 memory and beta's 50M-step horizon): RMSprop centered, alpha
    # 0.95, eps 1e-5, lr 6.25e-5, batch 32, gamma 0.99, target every 8k iterations, 20k random steps, epsilon
    # 1 -> 0.01 over 250k iterations (1M steps at one iteration per 4 steps), evaluation epsilon 0.001,
    # training every 4 steps; D.2: evaluations every 50k steps
    assert (c.optimizer, c.optimizer_eps, c.learning_rate, c.batch_size, c.gamma, c.target_update,
            c.learning_starts, c.eps_start, c.eps_end, c.eps_decay_steps, c.eval_epsilon, c.train_frequency,
            c.eval_every, c.capacity, c.beta_steps) == (
        "rmsprop", 1e-5, 6.25e-5, 32, 0.99, 8000, 20_000, 1.0, 0.01, 1_000_000, 0.001, 4, 50_000, 1_000_000,
        50_000_000)
    r = rows("004")
    # PER alpha 0.6, beta 0.4, added priority 1e-10; LAP & PAL alpha 0.6 with kappa 0.01 (eq. 29-31); one step
    # size for every variant; IS weights normalised within the batch (the paper's code)
    assert {k: r["per"][k] for k in ("alpha", "beta0", "priority_eps", "lr_scale", "normalize")} == {
        "alpha": 0.6, "beta0": 0.4, "priority_eps": 1e-10, "lr_scale": 1.0, "normalize": "batch"}
    for v in ("lap", "pal"):
        assert (r[v]["alpha"], r[v]["kappa"], r[v]["lr_scale"]) == (0.6, 0.01, 1.0)
    assert {s["lr_scale"] for s in r.values()} == {1.0}


def test_default_preset_gives_every_variant_one_step_size_and_batch_normalised_weights():
    c = DQNConfig()
    assert c.preset == "perx" and (c.optimizer, c.optimizer_eps, c.train_frequency) == ("rmsprop", 1e-5, 4)
    r = rows("perx")
    assert {s["lr_scale"] for s in r.values()} == {1.0}
    assert all(r[v]["normalize"] == "batch" for v in ("per", "rank", "hybrid"))


def test_fields_given_override_the_preset_and_config_json_records_the_resolved_values(tmp_path):
    c = DQNConfig(preset="004", learning_rate=1e-4, optimizer="adam", env_id="CartPole-v1", total_steps=10,
                  eval_every=10, learning_starts=5, eval_episodes=1, capacity=100)
    assert (c.learning_rate, c.optimizer, c.optimizer_eps, c.target_update) == (1e-4, "adam", 1e-8, 8000)
    dqn.train(c, [tmp_path / "run"])
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["config"]["preset"] == "004" and saved["config"]["learning_rate"] == 1e-4
    assert saved["config"]["beta_steps"] == 50_000_000 and saved["settings"]["priority_eps"] == 1e-10
    assert None not in [saved["config"][f] for f in dqn.PRESET_FIELDS]
    for key in ("cpu", "numba_target", "isa_level", "torch_cpu_capability"):
        assert key in saved["machine"]
    assert {"numba", "torch", "numpy", "llvmlite"} <= set(saved["versions"])


def test_unknown_preset_and_optimizer_are_refused_naming_the_value():
    with pytest.raises(ValueError, match=r"preset: .*'nature'"):
        DQNConfig(preset="nature")
    with pytest.raises(ValueError, match=r"optimizer: .*'sgd'"):
        DQNConfig(optimizer="sgd")


def test_priority_clip_bounds_the_priority_written():
    runs = dqn.Runs([DQNConfig(env_id="CartPole-v1", variant="per", priority_clip=0.5, total_steps=300,
                               learning_starts=100, capacity=1000, batch_size=16)])
    runs.start()
    for _ in range(120):
        runs.obs, *_ = runs.recorder.step(runs.act(runs.obs, 1.0))
        runs.step += 1
    buf = runs.buffers[0]
    written = []
    update = buf.update_priorities

    def record(ids, td):
        written.append(np.asarray(td).copy())
        return update(ids, td)

    buf.update_priorities = record
    for _ in range(5):
        runs.update()
    # CartPole's first TD errors are about -1 (reward 1, Q near 0): the clip bounds what is written at 0.5
    assert len(written) == 5 and max(np.abs(td).max() for td in written) == 0.5


def update_size_ratios(preset: str, **extra) -> dict[str, float]:
    """Each variant's mean RMS parameter change over the last 100 of 300 updates, relative to uniform's, in a
    1,500-step MinAtar Breakout run (seed 0, all variants in one lockstep group)."""
    steps, starts = 1500, 300
    configs = [DQNConfig(env_id="MinAtar/Breakout-v0", variant=v, seed=0, preset=preset, total_steps=steps,
                         learning_starts=starts, capacity=2000, eval_every=steps, **extra) for v in dqn.VARIANTS]
    from perx.agents.runner import flush_denormals

    torch.set_num_threads(1)
    sizes = []
    with flush_denormals():
        runs = dqn.Runs(configs)
        runs.start()
        while runs.step < steps:
            runs.env_step(runs.act(runs.obs, runs.epsilon()))
            if runs.step >= starts and runs.step % configs[0].train_frequency == 0:
                before = [p.detach().clone() for p in runs.q.parameters()]
                runs.update()
                square = sum(((p.detach() - b) ** 2).reshape(runs.R, -1).sum(1)
                             for p, b in zip(runs.q.parameters(), before, strict=True))
                sizes.append((square / sum(b[0].numel() for b in before)).sqrt().numpy())
    mean = np.mean(sizes[-100:], axis=0)
    return dict(zip(dqn.VARIANTS, (mean / mean[0]).tolist(), strict=True))


@pytest.mark.slow
def test_the_defaults_keep_every_variants_updates_within_4x_of_uniforms():
    pytest.importorskip("minatar")
    # the collapse of issue 36: with MinAtar's RMSprop eps 0.01, buffer-normalised IS weights over 1e-10
    # priorities and eta/4, PER's updates were 0.000-0.001 of uniform's at 500k steps. Measured here at the
    # defaults: per 0.86, rank 1.0, lap 0.56, pal 0.56, hybrid 1.07; a factor of 4 leaves room for
    # other machines' rounding and still fails the old settings (below)
    ratios = update_size_ratios("perx")
    assert all(0.25 < r < 4 for r in ratios.values()), ratios
    # the guard can fail: the old defaults (preset minatar with K = 4) already collapse in this short run
    # (measured: per 0.006, lap 0.12, pal 0.13)
    old = update_size_ratios("minatar", train_frequency=4)
    assert all(old[v] < 0.25 for v in ("per", "lap", "pal")), old


def test_buffer_size_is_a_deprecated_alias_of_capacity_and_old_records_still_load():
    import dataclasses

    from perx.agents.runner import same_config
    from perx.agents.td3 import TD3Config

    with pytest.warns(DeprecationWarning, match="buffer_size: renamed capacity"):
        cfg = DQNConfig(buffer_size=5000)
    assert cfg.capacity == 5000 and "buffer_size" not in dataclasses.asdict(cfg)
    with pytest.warns(DeprecationWarning):
        assert TD3Config(buffer_size=7).capacity == 7
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="buffer_size: the old name of capacity"):
        DQNConfig(capacity=10, buffer_size=20)
    record = dataclasses.asdict(cfg)
    record["buffer_size"] = record.pop("capacity")  # a config.json written before the rename
    assert dqn.config_from_record(record) == cfg and same_config(record, cfg)
