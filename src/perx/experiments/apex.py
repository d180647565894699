"""``perx apex``: Ape-X Double DQN on a local Ray instance or an existing cluster (:mod:`perx.distributed.apex`).

Each run writes ``<out>/<env>/apex-<variant>/seed=<n>/`` with ``--out`` defaulting to ``runs/apex`` (git ignores it).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

#: Where ``perx apex`` writes unless ``--out`` says otherwise: a folder git ignores, so no run (nor an interrupted
#: one) touches a committed file.
DEFAULT_OUT = "runs/apex"


def build_parser(prog: str = "perx apex") -> argparse.ArgumentParser:
    from perx.distributed.apex import ApexConfig  # needs ray: imported only when the command runs

    d = ApexConfig()
    parser = argparse.ArgumentParser(prog=prog, description="Ape-X Double DQN on Ray: N actors with local "
                                     "priorities, K replay shards sampled as one buffer, one learner.")
    parser.add_argument("--env", default=d.env_id, help="CartPole-v1 or a MinAtar game (MinAtar/Breakout-v0)")
    parser.add_argument("--variant", default=d.variant, choices=["uniform", "per", "lap"])
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--steps", type=int, default=None, help=f"environment steps over all actors ({d.total_steps})")
    parser.add_argument("--actors", type=int, default=d.num_actors)
    parser.add_argument("--shards", type=int, default=d.num_shards)
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        help="a shard checkpoints after this many added transitions (0: never; default 10,000, or "
                             "with --kill-shard-at K, K / (2 x shards), so that shard 0 has checkpointed about twice "
                             "before the drill kills it)")
    parser.add_argument("--shard-checkpoints", default=None, metavar="FOLDER_OR_URL",
                        help="where shards checkpoint: a folder, or an fsspec URL every node reaches (s3://bucket/run; "
                             "for a cluster without a shared file system); default: <run folder>/shards")
    parser.add_argument("--address", default=None,
                        help="join an existing Ray cluster (e.g. 'auto' or 'ray://head:10001'); default: start a "
                             "local one")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray instance (default: all)")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="output folder, env/variant/seed=N below it (default: %(default)s, which git ignores)")
    parser.add_argument("--kill-shard-at", type=int, default=None,
                        help="fault drill: kill shard 0 at this step (after its first checkpoint); Ray restarts it "
                             "from that checkpoint; config.json's drills and shard_restarts say what was lost")
    parser.add_argument("--kill-actor-at", type=int, default=None,
                        help="fault drill: kill actor 0 at this step; Ray restarts it and it rejoins")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in the output folder from its last checkpoint (after its driver died); "
                             "give the same settings (--steps may grow)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="any ApexConfig field")
    return parser


def checkpoint_every(args: argparse.Namespace, out: Path) -> int:
    """``--checkpoint-every``, else the interval a resumed run was started with (so that ``--resume`` needs only
    the settings that define the run, not a repeated ``--kill-shard-at``), else 10,000, or K / (2 x shards) with
    ``--kill-shard-at K``."""
    if args.checkpoint_every is not None:
        return args.checkpoint_every
    if args.resume and (out / "config.json").exists():
        return json.loads((out / "config.json").read_text())["config"]["checkpoint_every"]
    if args.kill_shard_at is None:
        return 10_000
    # max(1, shards): a bad --shards is refused by ApexConfig, naming it, not by a ZeroDivisionError here
    return max(1, args.kill_shard_at // (2 * max(1, args.shards)))


def main(argv: list[str] | None = None, prog: str = "perx apex") -> int:
    from perx.distributed.apex import ApexConfig
    from perx.experiments.study import parse_overrides, run_dir

    args = build_parser(prog).parse_args(argv)
    extra = parse_overrides(args.set, ApexConfig)
    if args.steps is not None:
        extra["total_steps"] = args.steps
    if args.shard_checkpoints is not None:
        extra["shard_checkpoints"] = args.shard_checkpoints
    out = run_dir(Path(args.out), args.env, f"apex-{args.variant}", args.seed)
    cfg = ApexConfig(env_id=args.env, variant=args.variant, seed=args.seed, num_actors=args.actors,
                     num_shards=args.shards, checkpoint_every=checkpoint_every(args, out), **extra)

    import ray

    from perx.distributed.apex import train

    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    if args.address:
        ray.init(address=args.address, log_to_driver=False)
    else:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    t = time.time()
    try:
        rows = train(cfg, out, progress=not args.no_progress, kill_shard_at=args.kill_shard_at,
                     kill_actor_at=args.kill_actor_at, resume=args.resume)
    finally:
        ray.shutdown()
    last = rows[-1]
    print(f"apex {cfg.env_id} {cfg.variant}: final evaluation return {last['eval_return']:.1f} at step "
          f"{last['step']:,} ({last['updates']:,} learner updates, {time.time() - t:.0f} s; "
          f"shard restarts {last['shard_restarts']}, actor restarts {last['actor_restarts']}); wrote {out}")
    return 0
