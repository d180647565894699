"""Run-time overhead of prioritized replay in TD3 (004 Appendix B, Table 3), ``perx bench-td3``.

The same TD3 (Table 6: two 256-256 critics, a 256-256 actor, batch 256, one update per step), the same
environment and number of steps; only the buffer and what the variant needs from it change: perx uniform
(the reference), perx PER / LAP / PAL, and where they install, cpprb's and Tianshou's prioritized buffers
swapped in for PER. Each configuration is timed in interleaved rounds (after a random warm-up that fills
the buffer); the table gives the median step time and the % increase over uniform, beside the paper's
GPU figures (+13.7% for its own PER, +75.2% Dopamine, +229.4% OpenAI baselines).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np


class PerxBuffer:
    def __init__(self, sampler, capacity, seed):
        import perx

        self.buf = perx.ReplayBuffer(capacity, sampler, seed=seed)

    def add(self, obs, act, rew, nxt, term):
        self.buf.add(obs=obs, action=act, reward=rew, next_obs=nxt, not_done=not term)

    def sample(self, b, beta):
        batch = self.buf.sample(b, beta=beta)
        return batch["obs"], batch["action"], batch["reward"], batch["next_obs"], batch["not_done"], \
            batch.weights, batch.indices

    def update(self, idx, prio):
        self.buf.update_priorities(idx, prio)


class CpprbBuffer:
    def __init__(self, obs_dim, act_dim, capacity):
        import cpprb

        env = {"obs": {"shape": obs_dim}, "act": {"shape": act_dim}, "rew": {}, "next_obs": {"shape": obs_dim},
               "not_done": {}}
        self.buf = cpprb.PrioritizedReplayBuffer(capacity, env, alpha=0.6, eps=1e-10)

    def add(self, obs, act, rew, nxt, term):
        self.buf.add(obs=obs, act=act, rew=rew, next_obs=nxt, not_done=float(not term))

    def sample(self, b, beta):
        s = self.buf.sample(b, beta=beta)
        return s["obs"], s["act"], s["rew"][:, 0], s["next_obs"], s["not_done"][:, 0], s["weights"], s["indexes"]

    def update(self, idx, prio):
        self.buf.update_priorities(idx, prio + 1e-10)


class TianshouBuffer:
    def __init__(self, capacity):
        from tianshou.data import Batch, PrioritizedReplayBuffer

        self.Batch = Batch
        self.buf = PrioritizedReplayBuffer(capacity, alpha=0.6, beta=0.4)

    def add(self, obs, act, rew, nxt, term):
        self.buf.add(self.Batch(obs=obs, act=act, rew=rew, obs_next=nxt, terminated=term, truncated=False, info={}))

    def sample(self, b, beta):
        self.buf.set_beta(beta)
        batch, idx = self.buf.sample(b)
        return batch.obs, batch.act, batch.rew, batch.obs_next, 1.0 - batch.terminated, batch.weight, idx

    def update(self, idx, prio):
        self.buf.update_weight(idx, prio)


def make_buffer(name: str, obs_dim: int, act_dim: int, capacity: int, seed: int):
    import perx

    if name == "uniform":
        return PerxBuffer(perx.Uniform(), capacity, seed)
    if name == "perx per":
        return PerxBuffer(perx.Proportional(alpha=0.6, eps=1e-10, normalize="buffer"), capacity, seed)
    if name == "perx lap":
        return PerxBuffer(perx.LAP(alpha=0.4, kappa=1.0), capacity, seed)
    if name == "perx pal":
        return PerxBuffer(perx.Uniform(), capacity, seed)
    if name == "cpprb per":
        return CpprbBuffer(obs_dim, act_dim, capacity)
    if name == "tianshou per":
        return TianshouBuffer(capacity)
    raise ValueError(name)


class TD3:
    """Table 6's TD3 (one run), the loss and priority of each variant (004 Sec. 6, D.1)."""

    def __init__(self, obs_dim, act_dim, max_action, seed, device="cpu"):
        import torch
        from torch import nn

        torch.manual_seed(seed)

        def mlp(i, o, tanh=False):
            layers = [nn.Linear(i, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, o)]
            return nn.Sequential(*layers, *([nn.Tanh()] if tanh else [])).to(device)

        self.torch, self.device = torch, device
        self.actor, self.q1, self.q2 = mlp(obs_dim, act_dim, True), mlp(obs_dim + act_dim, 1), mlp(obs_dim + act_dim, 1)
        self.actor_t, self.q1_t, self.q2_t = (mlp(obs_dim, act_dim, True), mlp(obs_dim + act_dim, 1),
                                              mlp(obs_dim + act_dim, 1))
        for a, b in ((self.actor, self.actor_t), (self.q1, self.q1_t), (self.q2, self.q2_t)):
            b.load_state_dict(a.state_dict())
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=3e-4)
        self.critic_opt = torch.optim.Adam(list(self.q1.parameters()) + list(self.q2.parameters()), lr=3e-4)
        self.max_action = max_action
        self.updates = 0

    def act(self, obs):
        with self.torch.no_grad():
            x = self.torch.as_tensor(obs, dtype=self.torch.float32, device=self.device)
            return self.max_action * self.actor(x).cpu().numpy()

    def train(self, buf, variant, beta):
        torch = self.torch
        import perx.torch as pt

        obs, act, rew, nxt, not_done, w, idx = buf.sample(256, beta)
        f = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32, device=self.device)  # noqa: E731
        obs, act, rew, nxt, not_done, w = map(f, (obs, act, rew, nxt, not_done, w))
        with torch.no_grad():
            noise = (torch.randn_like(act) * 0.2 * self.max_action).clamp(-0.5 * self.max_action,
                                                                          0.5 * self.max_action)
            a2 = (self.max_action * self.actor_t(nxt) + noise).clamp(-self.max_action, self.max_action)
            sa2 = torch.cat([nxt, a2], 1)
            y = rew + 0.99 * not_done * torch.min(self.q1_t(sa2), self.q2_t(sa2)).squeeze(1)
        sa = torch.cat([obs, act], 1)
        d1, d2 = self.q1(sa).squeeze(1) - y, self.q2(sa).squeeze(1) - y
        if variant == "perx lap":
            loss = pt.huber(d1, 1.0) + pt.huber(d2, 1.0)
        elif variant == "perx pal":
            loss = pt.pal(d1, 0.4, 1.0) + pt.pal(d2, 0.4, 1.0)
        elif variant == "uniform":
            loss = (d1 * d1).mean() + (d2 * d2).mean()
        else:  # a PER: IS-weighted MSE
            loss = (w * d1 * d1).mean() + (w * d2 * d2).mean()
        self.critic_opt.zero_grad()
        loss.backward()
        self.critic_opt.step()
        if variant not in ("uniform", "perx pal"):
            buf.update(idx, torch.max(d1.abs(), d2.abs()).detach().cpu().numpy())
        self.updates += 1
        if self.updates % 2 == 0:
            actor_loss = -self.q1(torch.cat([obs, self.max_action * self.actor(obs)], 1)).mean()
            self.actor_opt.zero_grad()
            actor_loss.backward()
            self.actor_opt.step()
            with torch.no_grad():
                for a, b in ((self.actor, self.actor_t), (self.q1, self.q1_t), (self.q2, self.q2_t)):
                    for p, q in zip(a.parameters(), b.parameters(), strict=True):
                        q.lerp_(p, 0.005)


def time_variant(name: str, env_id: str, warmup: int, steps: int, seed: int) -> float:
    """Seconds per environment step (act + store + one update), after ``warmup`` random steps."""
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)
    env = gym.make(env_id)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    max_action = float(env.action_space.high[0])
    agent = TD3(obs_dim, act_dim, max_action, seed)
    buf = make_buffer(name, obs_dim, act_dim, warmup + steps + 1, seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    start = None
    for t in range(warmup + steps):
        if t == warmup:
            start = time.perf_counter()
        if t < warmup:
            a = rng.uniform(-max_action, max_action, act_dim).astype(np.float32)
        else:
            a = np.clip(agent.act(obs) + rng.normal(0, 0.1 * max_action, act_dim), -max_action, max_action)
            a = a.astype(np.float32)
        nxt, r, term, trunc, _ = env.step(a)
        buf.add(obs.astype(np.float32), a, float(r), nxt.astype(np.float32), bool(term))
        obs = nxt if not (term or trunc) else env.reset()[0]
        if t >= warmup:
            agent.train(buf, name, 0.4 + 0.6 * (t - warmup) / steps)
    return (time.perf_counter() - start) / steps


NAMES = ("uniform", "perx per", "perx lap", "perx pal", "cpprb per", "tianshou per")


def run(env_id: str = "Hopper-v5", warmup: int = 2000, steps: int = 2000, rounds: int = 3, log=print) -> dict:
    times: dict[str, list[float]] = {n: [] for n in NAMES}
    skipped = {}
    for r in range(rounds):
        for name in NAMES:  # interleaved rounds
            if name in skipped:
                continue
            try:
                times[name].append(time_variant(name, env_id, warmup, steps, seed=r))
                log(f"round {r}: {name} {1e3 * times[name][-1]:.2f} ms per step")
            except ImportError as err:
                skipped[name] = f"not installed ({err.name})"
    return {"times": {k: v for k, v in times.items() if v}, "skipped": skipped, "env": env_id, "warmup": warmup,
            "steps": steps, "rounds": rounds}


def table(result: dict, command: str) -> str:
    med = {k: statistics.median(v) for k, v in result["times"].items()}
    ref = med["uniform"]
    lines = ["# TD3 run time with each replay buffer (004 Appendix B, Table 3)", "", f"Command: `{command}`", "",
             f"{result['env']}, TD3 of 004 Table 6 (one update per step, batch 256, 256-256 networks, one torch "
             f"thread), {result['steps']:,} steps timed after {result['warmup']:,} random ones, median of "
             f"{result['rounds']} interleaved rounds, this 2-core CPU machine; only the buffer (and the variant's "
             f"loss/priority) changes.", "",
             "| buffer | ms per step | run time vs uniform | rounds (ms) |", "|---|---|---|---|"]
    for name, m in med.items():
        rounds = ", ".join(f"{1e3 * x:.2f}" for x in result["times"][name])
        lines.append(f"| {name} | {1e3 * m:.2f} | {100 * (m / ref - 1):+.1f}% | {rounds} |")
    lines += ["", "004 Table 3 (TD3 on a GPU, the same comparison): the paper's own PER +13.7%, Dopamine's PER +75.2%, "
              "OpenAI baselines' PER +229.4% run time over uniform."]
    if result["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in result["skipped"].items())]
    return "\n".join(lines) + "\n"


#: Where ``perx bench-td3`` writes its table unless ``--out`` says otherwise: a folder git ignores, so a run never
#: replaces the committed results/td3_overhead.md (``--out results/td3_overhead.md`` does).
DEFAULT_OUT = "runs/td3_overhead.md"


def build_parser(prog: str = "perx bench-td3") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="write the markdown table to this file too (default: %(default)s, which git ignores)")
    return parser


def main(argv: list[str] | None = None, prog: str = "perx bench-td3") -> int:
    args = build_parser(prog).parse_args(argv)
    result = run(args.env, args.warmup, args.steps, args.rounds)
    text = table(result, " ".join([prog, *(argv if argv is not None else sys.argv[1:])]))
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python benchmarks/bench_td3_overhead.py"))
