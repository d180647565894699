"""perx's TD3 update against the TD3 author's, on identical inputs (issue 41 item 1: the HalfCheetah gap).

    python benchmarks/td3_reference_diff.py --reference /path/to/sfujim/TD3/TD3.py --out results/td3_reference_diff.md

The reference is the TD3 author's ``TD3.py`` (github.com/sfujim/TD3, read from the path given; nothing of it is
copied here). Both agents start from the same weights (perx's, copied into the reference's layers), see the same
batches (each batch perx's buffer draws is handed to the reference through a stand-in replay buffer, reward and
``not_done`` = discount / gamma) and the same target-policy noise (the reference's ``torch.randn_like`` is
pointed at a generator seeded as perx's). Then they are updated side by side; after selected updates the table
gives the largest parameter difference relative to the parameter's scale, and both critics' and the actor's
outputs on a fixed probe batch. Agreement to float rounding (differences that start near 1e-7 and grow only
as rounding is amplified by training) means the two updates are the same algorithm; a difference from the first
update on names a cause. To tell the two apart, a twin of the reference starts from the reference's weights
each multiplied by (1 + 1e-7 z), z standard normal (a rounding-sized change), and is updated alongside: its
distance from the reference is how far rounding alone carries two identical algorithms apart.

The buffer holds --fill steps of uniformly random actions on HalfCheetah-v5 (perx's start steps, seed 0), so the
comparison covers the updates right after the random start, the ones a divergence of the algorithms would hit
first.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import platform
import sys
import types
from pathlib import Path

import numpy as np
import torch

from perx.agents import td3

CHECKPOINTS = (1, 2, 10, 100, 200, 300, 500, 1000, 2000, 3000)


def load_reference(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("reference_td3", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--reference: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_into(stacked_net, layers) -> None:
    """Run 0's weights of a perx StackedNet into nn.Linear layers (perx keeps weight [R, in, out])."""
    ours = [m for m in stacked_net.modules() if type(m).__name__ == "StackedLinear"]
    assert len(ours) == len(layers)
    with torch.no_grad():
        for mine, theirs in zip(ours, layers, strict=True):
            theirs.weight.copy_(mine._to_nn(mine.weight[0].detach()))
            theirs.bias.copy_(mine.bias[0].detach())


def differences(stacked_net, layers) -> float:
    """Largest |ours - theirs| over the layers' parameters, relative to the largest |theirs| of each tensor."""
    ours = [m for m in stacked_net.modules() if type(m).__name__ == "StackedLinear"]
    worst = 0.0
    with torch.no_grad():
        for mine, theirs in zip(ours, layers, strict=True):
            for a, b in ((mine._to_nn(mine.weight[0]), theirs.weight), (mine.bias[0], theirs.bias)):
                worst = max(worst, float((a - b).abs().max() / b.abs().max()))
    return worst


def plain_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """As :func:`differences`, between two nn modules of the same layout."""
    with torch.no_grad():
        return max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(a.parameters(), b.parameters(),
                                                                               strict=True))


class Handed:
    """A stand-in replay buffer for the reference: returns the batch perx's buffer drew last."""

    def __init__(self) -> None:
        self.batch: tuple | None = None

    def sample(self, batch_size: int) -> tuple:
        assert self.batch is not None and len(self.batch[0]) == batch_size
        return self.batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", type=Path, required=True, help="the TD3 author's TD3.py")
    parser.add_argument("--fill", type=int, default=5000, help="random-action steps in the buffer (default 5000)")
    parser.add_argument("--updates", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ref = load_reference(args.reference)

    cfg = td3.TD3Config(env_id="HalfCheetah-v5", variant="uniform", seed=args.seed, start_steps=args.fill + 1)
    runs = td3.Runs([cfg])
    runs.start()
    for _ in range(args.fill):
        runs.env_step(runs.act(runs.obs))
    buf = runs.buffers[0]
    obs_dim, act_dim = int(np.prod(runs.obs_shape)), runs.act_dim
    max_action = float(runs.high[0])
    assert np.allclose(runs.high, max_action) and np.allclose(runs.low, -max_action)

    # the reference's device is chosen at import (cuda if available): keep it on the CPU
    ref.device = torch.device("cpu")
    agent = ref.TD3(obs_dim, act_dim, max_action, discount=cfg.gamma, tau=cfg.tau,
                    policy_noise=cfg.policy_noise * max_action, noise_clip=cfg.noise_clip * max_action,
                    policy_freq=cfg.policy_freq)
    copy_into(runs.actor, [agent.actor.l1, agent.actor.l2, agent.actor.l3])
    copy_into(runs.q1, [agent.critic.l1, agent.critic.l2, agent.critic.l3])
    copy_into(runs.q2, [agent.critic.l4, agent.critic.l5, agent.critic.l6])
    agent.actor_target = copy.deepcopy(agent.actor)
    agent.critic_target = copy.deepcopy(agent.critic)
    agent.actor_optimizer = torch.optim.Adam(agent.actor.parameters(), lr=cfg.learning_rate)
    agent.critic_optimizer = torch.optim.Adam(agent.critic.parameters(), lr=cfg.learning_rate)

    twin = copy.deepcopy(agent)
    with torch.no_grad():
        z = torch.Generator().manual_seed(12345)
        for net in (twin.actor, twin.critic):
            for p in net.parameters():
                p.mul_(1 + 1e-7 * torch.randn(p.shape, generator=z))
    twin.actor_target = copy.deepcopy(twin.actor)
    twin.critic_target = copy.deepcopy(twin.critic)
    twin.actor_optimizer = torch.optim.Adam(twin.actor.parameters(), lr=cfg.learning_rate)
    twin.critic_optimizer = torch.optim.Adam(twin.critic.parameters(), lr=cfg.learning_rate)

    # the same target-policy noise: perx draws torch.randn(B, act_dim, generator=seed + 3) per update; the
    # reference and its twin each get a generator seeded alike
    generators = {id(a): torch.Generator().manual_seed(args.seed + 3) for a in (agent, twin)}
    current: list[torch.Generator] = []
    proxy = types.SimpleNamespace(**{name: getattr(torch, name) for name in dir(torch) if not name.startswith("__")})
    proxy.randn_like = lambda x: torch.randn(x.shape, generator=current[-1], dtype=x.dtype)
    ref.torch = proxy

    handed = Handed()
    draw = buf.sample

    def sample(batch_size, beta=1.0):
        batch = draw(batch_size, beta=beta)
        f = lambda key: torch.as_tensor(np.asarray(batch[key], np.float32))  # noqa: E731
        not_done = torch.as_tensor(np.asarray(batch["discount"], np.float64) / cfg.gamma, dtype=torch.float32)
        handed.batch = (f("obs"), f("action"), f("next_obs"), f("return")[:, None], not_done[:, None])
        return batch

    buf.sample = sample
    probe = draw(1024, beta=1.0)
    p_obs = torch.as_tensor(np.asarray(probe["obs"], np.float32))
    p_act = torch.as_tensor(np.asarray(probe["action"], np.float32))

    rows = []
    for u in range(1, args.updates + 1):
        runs.update()
        for a in (agent, twin):
            current.append(generators[id(a)])
            a.train(handed, cfg.batch_size)
        if u in CHECKPOINTS or u == args.updates:
            with torch.no_grad():
                sa = torch.cat([p_obs, p_act], -1)[None]
                q_ours = runs.q1(sa)[0, :, 0]
                q_theirs = agent.critic.Q1(p_obs, p_act)[:, 0]
                a_ours = runs.pi(runs.actor, p_obs[None])[0]
                a_theirs = agent.actor(p_obs)
            rows.append({
                "update": u,
                "actor": differences(runs.actor, [agent.actor.l1, agent.actor.l2, agent.actor.l3]),
                "q1": differences(runs.q1, [agent.critic.l1, agent.critic.l2, agent.critic.l3]),
                "q2": differences(runs.q2, [agent.critic.l4, agent.critic.l5, agent.critic.l6]),
                "q_probe": float((q_ours - q_theirs).abs().max()), "q_scale": float(q_theirs.abs().mean()),
                "a_probe": float((a_ours - a_theirs).abs().max()),
                "twin_actor": plain_difference(twin.actor, agent.actor),
                "twin_critic": plain_difference(twin.critic, agent.critic),
                "twin_q": float((twin.critic.Q1(p_obs, p_act)[:, 0] - q_theirs).abs().max()),
            })
            r = rows[-1]
            print(f"update {u}: params actor {r['actor']:.2e} q1 {r['q1']:.2e} q2 {r['q2']:.2e}; probe Q1 "
                  f"{r['q_probe']:.2e} (|Q| {r['q_scale']:.3g}), action {r['a_probe']:.2e}; twin: actor "
                  f"{r['twin_actor']:.2e} critic {r['twin_critic']:.2e} Q1 {r['twin_q']:.2e}", flush=True)
    text = render(args, rows)
    if args.out:
        args.out.write_text(text)
    print(text)


def render(args, rows) -> str:
    import gymnasium

    lines = ["# perx's TD3 update against the TD3 author's, on identical inputs", "",
             f"Command: `python benchmarks/td3_reference_diff.py {' '.join(sys.argv[1:])}`", "",
             f"Reference: the TD3 author's TD3.py (github.com/sfujim/TD3 at 34770cc). HalfCheetah-v5, seed "
             f"{args.seed}, {args.fill} random-action steps in the buffer; torch {torch.__version__}, gymnasium "
             f"{gymnasium.__version__}, Python {platform.python_version()}, one CPU thread. What is compared: "
             f"benchmarks/td3_reference_diff.py's docstring.", "",
             "perx against the reference, then the reference's twin (its weights changed by a relative 1e-7 at the "
             "start) against the reference. Parameters: the largest difference relative to the largest parameter of "
             "its tensor, over the network's tensors; probe: the largest difference of the first critic's Q on 1,024 "
             "stored (obs, action) pairs (beside it, the mean |Q|) and of the actor's actions.", "",
             "| update | perx: actor | perx: critic 1 | perx: critic 2 | perx: Q1 probe (mean abs Q) "
             "| perx: actor probe | twin: actor | twin: critics | twin: Q1 probe |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['update']} | {r['actor']:.1e} | {r['q1']:.1e} | {r['q2']:.1e} | {r['q_probe']:.1e} "
                     f"({r['q_scale']:.3g}) | {r['a_probe']:.1e} | {r['twin_actor']:.1e} | {r['twin_critic']:.1e} | "
                     f"{r['twin_q']:.1e} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
