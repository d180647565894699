"""Sharded prioritized replay on Ray actors: K ordinary :class:`perx.ReplayBuffer` shards sampled as one.

Exact global sampling (Ape-X's central replay, Horgan et al. 2018, split over K processes). Shard k holds
masses m_i (p_i^alpha for ``perx.Proportional``/``perx.LAP``, 1 for ``perx.Uniform``) summing to M_k. A
batch of B draws is split between the shards in proportion q_k = M_k / M (M = sum_k M_k): stratified over
the global mass (one point in each of B equal ranges of [0, M), as in 000 App. B.2.1) when the sampler is
stratified, else multinomial. Shard k then draws its n_k transitions with its own sampler, P(i | k) =
m_i / M_k, so each draw's probability is

    P(i) = q_k * m_i / M_k = m_i / M                    (000 eq. 1 over the union)

and the IS weights use the union's N and minimum: w_i = (N P(i))^-beta / max_j (N P(j))^-beta =
(P(i) / P_min)^-beta with P_min = min_k q_k * min_k(m) / M_k (000 Sec. 3.4). ``batch.probabilities`` and
``batch.weights`` are computed from the q_k actually used and the masses each shard reports as it samples,
so they are exact for the distribution the batch was drawn from; that distribution is the union's P(i)
whenever the totals used for q_k are current (always for :meth:`ShardedReplay.sample`, which reads them
first, when no one writes concurrently; one round old for :meth:`ShardedReplay.sample_async`).

New transitions added without TD errors or priorities get their own shard's maximal priority, not the
union's that one buffer would give them (000 Alg. 1 line 6): ``Proportional(max_priority="historical")``
(the default) the largest priority that shard has ever assigned, ``"buffer"`` the largest that shard
holds now, both starting at max(1, eps, min_priority). So such a transition's P(i) = max_k^alpha / M
depends on the shard it lands in, larger in a shard that has seen larger TD errors. Ape-X actors send
TD errors with every transition (``perx apex`` does), so they are unaffected; a writer that wants the
single-buffer rule passes the union's largest priority as ``priorities`` itself.

Ids are global: ``local_id << 20 | incarnation << 10 | shard`` (int64, up to 1024 shards), so an update
finds its shard, and the shard's own buffer skips stale ids after wrap-around exactly as one buffer does.
A shard that is restarted restores its last checkpoint (``perx.ReplayBuffer.save``/``load``, atomic) and
starts a new incarnation: ids it issued after that checkpoint were lost with the process and will be
issued again to new transitions, so updates that carry them are skipped as stale (counted as such).

Rank-based sampling is not offered: its P(i) depends on i's rank among all N priorities of the union, so
the shards would need a global order statistic (every shard's count of priorities above each of its own,
i.e. a distributed merge of K sorted priority lists per update, or a shared approximate quantile sketch
to place the union's B segment boundaries; see docs/distributed.md).
"""

from __future__ import annotations

import copy
import json
import numbers
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray

from perx import Batch, Proportional, ReplayBuffer, Sampler, Uniform
from perx.distributed.rate import RateLimiter
from perx.distributed.store import CheckpointStore
from perx.samplers.base import check_sampler
from perx.validation import (
    as_index_array,
    as_value_array,
    check_batch_size,
    check_capacity,
    check_positive_int,
    check_real,
    short,
)

SHARD_BITS = 10
INCARNATION_BITS = 10
MAX_SHARDS = 1 << SHARD_BITS
_SHARD_MASK = MAX_SHARDS - 1
_INC_MASK = (1 << INCARNATION_BITS) - 1
_LOCAL_SHIFT = SHARD_BITS + INCARNATION_BITS


def encode_ids(local: np.ndarray, incarnation: int, shard: int) -> np.ndarray:
    """Global ids of a shard's local ids (int64 [n])."""
    return (local << _LOCAL_SHIFT) | ((incarnation & _INC_MASK) << SHARD_BITS) | shard


def decode_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(local ids, incarnations mod 1024, shards) of global ids (int64 [n] each)."""
    return ids >> _LOCAL_SHIFT, (ids >> SHARD_BITS) & _INC_MASK, ids & _SHARD_MASK


# Argument checks are the core's (perx.validation, perx.samplers.base): the same errors as one ReplayBuffer gives.
# What is kept here is only what a sharded replay must check differently, each with its reason.

def _values(values: object, name: str, length: int) -> np.ndarray:
    """float64 [length] (the core's ``as_value_array``: TypeError for bools, strings and objects, ValueError for
    the wrong length), finite, and >= 0 when ``name`` is ``"priorities"`` (ValueError naming ``name``).

    Differs from the core in checking every value up front: one buffer checks them as it applies an update, but
    here a shard must refuse a batch before storing it, and the learner an update before sending any shard its
    part (the shards apply their parts independently, so a value refused by one would leave the others applied).
    """
    arr = as_value_array(values, name, length=length)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: expected finite numbers, got {short(values)}")
    if name == "priorities" and (arr < 0).any():
        raise ValueError(f"priorities: must be >= 0, got {short(values)}")
    return arr


def _check_seed(seed: object) -> int | None:
    """None or an int >= 0 (ValueError naming ``seed``). Narrower than the core's seeds (anything
    ``np.random.default_rng`` takes, Generators included): the learner's split and every shard's seed are spawned
    from this one by ``np.random.SeedSequence(seed)``, which takes entropy, not a Generator."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
        raise ValueError(f"seed: None or an int >= 0, got {short(seed)}")
    return None if seed is None else int(seed)


def _check_shard_sampler(sampler: object) -> Sampler:
    """An unbound ``perx.Uniform`` or ``perx.Proportional`` (LAP is one); None gives ``perx.Uniform()``.

    Beyond the core's check (TypeError for anything that is not a perx sampler), two refusals of a sampler the core
    takes (ValueError naming ``sampler``): one whose P(i) is not mass_i / sum (the shards are combined by their
    mass totals), and one already bound to a buffer (every shard binds a copy, in its own process: the core's
    refusal would come from there, after the actors started)."""
    if sampler is None:
        return Uniform()
    check_sampler(sampler)
    if type(sampler) not in (Uniform, Proportional):
        raise ValueError(
            f"sampler: ShardedReplay combines shards by their mass totals, which needs P(i) = mass_i / sum: "
            f"perx.Uniform, perx.Proportional or perx.LAP; got {short(sampler)} (rank-based sampling would need "
            f"a global rank of every priority across shards, see docs/distributed.md)")
    if sampler.capacity is not None:
        raise ValueError(f"sampler: pass an unbound sampler (a prototype copied into every shard), got {sampler!r} "
                         f"which already belongs to a buffer")
    return sampler


def _check_placement(strategy: object, memory: object, resources: object) -> dict[str, Any]:
    """Ray actor options placing the shards (ValueError/TypeError naming the argument)."""
    if isinstance(strategy, str):
        if strategy not in ("SPREAD", "DEFAULT"):
            raise ValueError(f"scheduling_strategy: 'SPREAD', 'DEFAULT' or a Ray scheduling strategy object, "
                             f"got {strategy!r}")
    elif strategy is None or type(strategy).__module__.split(".")[0] != "ray":
        raise TypeError(f"scheduling_strategy: 'SPREAD', 'DEFAULT' or a Ray scheduling strategy object, "
                        f"got {short(strategy)}")
    if isinstance(memory, bool) or not isinstance(memory, numbers.Integral) or memory < 0:
        raise ValueError(f"memory: bytes per shard, an int >= 0, got {short(memory)}")
    options: dict[str, Any] = {"scheduling_strategy": strategy}
    if memory:
        options["memory"] = int(memory)
    if resources is not None:
        if not isinstance(resources, Mapping) or not all(
                isinstance(k, str) and isinstance(v, numbers.Real) and not isinstance(v, bool) and v > 0
                for k, v in resources.items()):
            raise ValueError(f"resources: a dict of resource name -> amount > 0, got {short(resources)}")
        if {"CPU", "GPU", "memory"} & set(resources):
            raise ValueError(f"resources: custom resources only (num_cpus and memory have their own arguments), "
                             f"got {short(resources)}")
        options["resources"] = dict(resources)
    return options


def _check_capacity(capacity: object, num_shards: int) -> int:
    """The core's capacity check, and at least one transition per shard (ValueError naming ``capacity``)."""
    capacity = check_capacity(capacity)
    if capacity < num_shards:
        raise ValueError(f"capacity: at least num_shards ({num_shards}), got {capacity!r}")
    return capacity


class Shard:
    """One replay shard: an ordinary :class:`perx.ReplayBuffer`, global ids, and checkpoints.

    Runs inside a Ray actor (:class:`ShardedReplay` creates them), or in-process for tests. Every reply
    carries :meth:`stats`, so the learner always knows the shard's latest totals without asking.

    Args:
        index: this shard's number k in [0, num_shards).
        capacity: transitions kept by this shard (the oldest overwritten first).
        sampler: an unbound sampler; this shard uses a copy.
        seed: seed of the shard's sampler.
        checkpoint_dir: folder of ``shard-<k>.perx`` (the buffer's checkpoint); None: no checkpoints, and a
            restarted shard starts empty.
        checkpoint_every: save after every this many added transitions (0: only on :meth:`checkpoint`).
        resume: start from the files in ``checkpoint_dir`` (a new job continuing an old one); they must
            hold the capacity and sampler asked for (ValueError naming the difference otherwise).
        job: a token naming the job (``ShardedReplay`` draws one). A shard that finds its own job's
            ``shard-<k>.json`` was restarted by Ray: it restores its checkpoint in a new incarnation.
        meta_dir: where ``shard-<k>.json`` (incarnations) lives: ``checkpoint_dir``, else a folder under the
            node's temporary directory, so a shard knows it restarted even without checkpoints.
    """

    def __init__(self, index: int, capacity: int, sampler: Sampler, *, seed: int | None = None,
                 checkpoint_dir: str | None = None, checkpoint_every: int = 0, resume: bool = False,
                 job: str = "", meta_dir: str | None = None) -> None:
        self.index = int(index)
        self.checkpoint_every = int(checkpoint_every)
        self.job = job
        self.incarnation = 0
        #: Drawn by every construction (a Ray restart is one): the learner tells a restarted shard by it, as
        #: incarnations cannot order processes (one restarted where its file is not draws a random one)
        self.instance = os.urandom(8).hex()
        #: Whether the incarnation was drawn at random (then the number of restarts it spans is unknown).
        self.incarnation_drawn = False
        #: [incarnation, next local id of the checkpoint it restored] for every restore, oldest first
        self.restores: list[list[int]] = []
        #: where the checkpoint and the incarnation record live (a local folder or an fsspec URL)
        self._store = None if checkpoint_dir is None else CheckpointStore(checkpoint_dir)
        self._meta = self._store if self._store is not None else (
            None if meta_dir is None else CheckpointStore(meta_dir))
        self._file, self._meta_file = f"shard-{self.index}.perx", f"shard-{self.index}.json"
        meta = None
        if self._meta is not None and self._meta.exists(self._meta_file):
            meta = self._meta.read_json(self._meta_file)
            if job and meta.get("job") == job:
                pass  # restarted by Ray: the configuration of the last reset() wins over the arguments (below)
            elif resume:
                _check_resumable(meta, self.index, self._meta.location, capacity, sampler)
            else:
                meta = None  # another job's files: start fresh
        buf = None
        if meta is not None:
            self.incarnation = int(meta["incarnation"]) + 1
            self.restores = [list(map(int, r)) for r in meta["restores"]][-_INC_MASK:]
            if "capacity" in meta:  # the configuration of the last reset() wins over the arguments
                capacity = int(meta["capacity"])
                sampler = Sampler.registry[meta["sampler"]](**meta["config"])
                seed = meta.get("seed")
            if self._store is not None and self._store.exists(self._file):
                buf = self._store.load_buffer(self._file)  # the checkpoint holds its own capacity and sampler
            self.restores.append([self.incarnation, 0 if buf is None else buf.next_index])
        else:
            if self._store is not None and not resume:
                self._store.remove(self._file)  # a fresh job: an old checkpoint must not be restored later by mistake
            if _restarted():
                # restarted where its incarnation file is not (another node, no shared folder): an
                # incarnation no earlier id can carry, with restore point 0, makes every old id stale
                self.incarnation = int.from_bytes(os.urandom(2), "little") % _INC_MASK + 1
                self.incarnation_drawn = True
                self.restores = [[self.incarnation, 0]]
        self.restored_from = None if buf is None else self._store.name(self._file)
        if buf is None:
            buf = ReplayBuffer(capacity, copy.deepcopy(sampler), seed=seed)
        self.buffer = buf
        self._max_accepted = _max_accepted(buf)
        self._config = {"capacity": buf.capacity, "sampler": buf.sampler.name, "config": buf.sampler.config(),
                        "seed": seed}
        self._since_checkpoint = 0
        self.checkpoints = 0
        #: Bumped by every change, so the learner can order replies that arrive out of order.
        self.version = 0
        self.started = time.time()
        #: The Ray node this shard runs on (None outside Ray): actors prefer to push to shards on their node.
        self.node = _node_id()
        self._write_meta()

    def _write_meta(self) -> None:
        if self._meta is None:
            return
        meta = {"job": self.job, "incarnation": self.incarnation, "restores": self.restores, **self._config}
        self._meta.write_json(self._meta_file, meta)

    # -- facts ---------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """size, next local id, mass totals (sum, min), incarnation, the last restore point, the version and
        the instance token (which order replies), and the largest priority an update may set
        (``max_accepted_priority``, inf unless Proportional/LAP)."""
        buf = self.buffer
        total, smallest = buf.mass_totals()
        return {"shard": self.index, "size": len(buf), "next_id": buf.next_index, "total": total, "min": smallest,
                "incarnation": self.incarnation, "restored_next_id": self.restores[-1][1] if self.restores else None,
                "checkpoints": self.checkpoints, "version": self.version, "instance": self.instance,
                "incarnation_drawn": self.incarnation_drawn, "max_accepted_priority": self._max_accepted,
                "node": self.node}

    # -- writing -------------------------------------------------------------------------------------
    def add(self, data: Mapping[str, np.ndarray], td_errors: np.ndarray | None = None,
            priorities: np.ndarray | None = None, *, return_ids: bool = False) -> dict[str, Any]:
        """Store a batch of transitions (axis 0), at maximal priority or at the priorities of their TD
        errors (computed by the actor, as in Ape-X) or raw priorities. Returns the stats (and the new
        global ids under ``"ids"`` with ``return_ids``)."""
        if td_errors is not None and priorities is not None:
            raise ValueError("td_errors, priorities: give one or neither")
        buf = self.buffer
        values = td_errors if td_errors is not None else priorities
        if values is not None:
            # validate before storing, so a bad value leaves the shard as it was
            n = len(next(iter(data.values())))
            values = _values(values, "td_errors" if td_errors is not None else "priorities", n)
            sampler = buf.sampler
            if isinstance(sampler, Proportional) and len(values):
                p = values if priorities is not None else sampler.priority(values)
                if not p.max() <= sampler.max_accepted_priority:
                    raise ValueError(f"{'priorities' if priorities is not None else 'td_errors'}: priority "
                                     f"{float(p.max())!r} exceeds the largest accepted, "
                                     f"{sampler.max_accepted_priority!r}")
        ids = buf.extend(**data)
        if values is not None and not isinstance(buf.sampler, Uniform):
            if td_errors is not None:
                buf.update_priorities(ids, values)
            else:
                buf.set_priorities(ids, values)
        self._since_checkpoint += len(ids)
        self.version += 1
        if self.checkpoint_every and self._since_checkpoint >= self.checkpoint_every:
            self.checkpoint()
        out = self.stats()
        if return_ids:
            out["ids"] = encode_ids(ids, self.incarnation, self.index)
        return out

    def checkpoint(self) -> str | None:
        """Save the buffer atomically to ``shard-<k>.perx``; returns its path or URL (None without a folder)."""
        if self._store is None:
            return None
        self._store.save_buffer(self._file, self.buffer)
        self._since_checkpoint = 0
        self.checkpoints += 1
        return self._store.name(self._file)

    # -- sampling and priorities -----------------------------------------------------------------------
    def sample(self, n: int) -> tuple[dict[str, np.ndarray] | None, np.ndarray, np.ndarray, dict[str, Any]]:
        """n draws from this shard's sampler: (fields, global ids, P(i | shard), stats); n may be 0."""
        if n == 0 or not self.buffer.mass_totals()[0] > 0.0:  # empty, or every priority 0
            return None, np.empty(0, np.int64), np.empty(0), self.stats()
        batch = self.buffer.sample(n, beta=0.0)  # the learner computes the global IS weights
        return batch.data, encode_ids(batch.indices, self.incarnation, self.index), batch.probabilities, self.stats()

    def update(self, ids: np.ndarray, values: np.ndarray, raw: bool = False) -> tuple[int, int, dict[str, Any]]:
        """Apply TD errors (or raw priorities) of this shard's global ids; returns (applied, skipped, stats).

        Skipped: ids overwritten since they were sampled (the buffer's stale check), and ids of an older
        incarnation at or beyond the checkpoint it was restored from (they now name other transitions).
        """
        ids = as_index_array(ids, "indices")
        values = _values(values, "priorities" if raw else "td_errors", len(ids))
        local, inc, shard = decode_ids(ids)
        if (shard != self.index).any():
            raise ValueError(f"indices: id {int(ids[shard != self.index][0])} belongs to shard "
                             f"{int(shard[shard != self.index][0])}, not {self.index}")
        keep = self._valid_incarnation(local, inc)
        local, values = local[keep], values[keep]
        applied = self.buffer.set_priorities(local, values) if raw else self.buffer.update_priorities(local, values)
        self.version += 1
        return applied, len(ids) - applied, self.stats()

    def _valid_incarnation(self, local: np.ndarray, inc: np.ndarray) -> np.ndarray:
        keep = inc == (self.incarnation & _INC_MASK)
        for e in np.unique(inc[~keep]):
            # the latest incarnation numbered e (mod 1024) before this one issued these ids; they still
            # name the same transitions if they are older than every restore point since then
            full = self.incarnation - ((self.incarnation - int(e)) & _INC_MASK)
            limit = min([r for i, r in self.restores if i > full], default=0) if full >= 0 else 0
            mask = inc == e
            keep[mask] = local[mask] < limit
        return keep

    def reset(self, capacity: int, sampler: Sampler, seed: int | None = None) -> dict[str, Any]:
        """Start over with an empty buffer (same actor): a new incarnation whose restore point is 0, so
        every id issued before is stale; the checkpoint file is removed."""
        buf = ReplayBuffer(capacity, copy.deepcopy(sampler), seed=seed)
        self.buffer = buf
        self._max_accepted = _max_accepted(buf)
        self._config = {"capacity": capacity, "sampler": sampler.name, "config": sampler.config(), "seed": seed}
        self.incarnation += 1
        self.restores.append([self.incarnation, 0])
        self.restored_from = None
        self._since_checkpoint = 0
        self.version += 1
        if self._store is not None:
            self._store.remove(self._file)
        self._write_meta()
        return self.stats()

    def ping(self) -> int:
        return self.index


def _check_resumable(meta: dict[str, Any], index: int, folder: str, capacity: int, sampler: Sampler) -> None:
    """ValueError naming the argument unless shard ``index``'s incarnation file (``meta``, from a job being
    resumed) holds the capacity and sampler asked for: a shard resumes with the file's configuration (and
    its checkpoint's), so a learner splitting and weighing with other arguments would disagree with it."""
    if "capacity" not in meta:  # written before files recorded their configuration: nothing to compare
        return
    if meta["capacity"] != capacity:
        raise ValueError(f"capacity: shard {index}'s files in {folder} hold {meta['capacity']} transitions per "
                         f"shard, this job asks for {capacity}; resume=True continues a job with its own "
                         f"configuration (the same capacity, num_shards and sampler)")
    config = json.loads(json.dumps(sampler.config()))  # as the file holds it (json's types)
    if meta["sampler"] != sampler.name or meta["config"] != config:
        differ = sorted(key for key in {**meta["config"], **config} if meta["config"].get(key) != config.get(key))
        raise ValueError(f"sampler: shard {index}'s files in {folder} use {meta['sampler']!r} {meta['config']}, "
                         f"this job asks for {sampler.name!r} {config}"
                         + (f" (differing in {', '.join(differ)})" if meta["sampler"] == sampler.name else "")
                         + "; resume=True continues a job with its own configuration")


def _max_accepted(buf: ReplayBuffer) -> float:
    # Proportional caps each mass so that its own sum of leaves stays finite, so the cap depends on the
    # shard's capacity; computed once per buffer (a pow and a few nextafter steps), not per reply
    return float(buf.sampler.max_accepted_priority) if isinstance(buf.sampler, Proportional) else float("inf")


def _node_id() -> str | None:
    """The id of the Ray node this process runs on (None when Ray is not initialised here; never starts Ray)."""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _restarted() -> bool:
    """Whether this process is a Ray actor that Ray restarted (False outside an actor; never starts Ray)."""
    if not ray.is_initialized():
        return False
    ctx = ray.get_runtime_context()
    return ctx.worker.mode == ray.WORKER_MODE and bool(ctx.was_current_actor_reconstructed)


class ShardedReplay:
    """A replay memory of ``num_shards`` Ray actors, each a :class:`Shard`, sampled as one buffer.

    Args:
        num_shards: K >= 1 actors.
        capacity: total transitions kept (each shard keeps capacity / K, rounded up).
        sampler: an unbound ``perx.Uniform()``, ``perx.Proportional(...)`` or ``perx.LAP(...)``; every
            shard gets a copy (default uniform).
        seed: seeds the split of each batch between the shards and the shards' samplers (None or an int >= 0).
        checkpoint_dir / checkpoint_every / resume: see :class:`Shard`; a shard that dies is restarted by
            Ray (``max_restarts``) and restores its last checkpoint; calls in flight are retried.
        max_restarts: how often Ray restarts a shard (-1: always).
        num_cpus: CPUs Ray reserves for each shard actor (they mostly wait; default 0).
        rate_limiter: a :class:`perx.distributed.RateLimiter` (samples per insert within a band): sampling
            waits until the writers have inserted enough (:attr:`sample_timeout` seconds at most, then
            TimeoutError), and writers' drivers ask :meth:`can_insert` before inserting more. None: no limit.
        sample_timeout: seconds a sample may wait for the rate limiter (None: for ever).
        scheduling_strategy: where Ray places the shard actors: ``"SPREAD"`` (default: over the cluster's
            nodes, so their memory and their network traffic are spread too; the same as ``"DEFAULT"`` on one
            node), ``"DEFAULT"``, or any Ray scheduling strategy object (a placement group's, a node affinity).
            A shard restarted after its node died goes wherever the strategy allows (SPREAD: any live node).
        memory: bytes of Ray's ``memory`` resource each shard reserves (0: none), so that Ray places no more
            shards on a node than its memory holds; about the shard's ``buffer.nbytes`` (Ape-X estimates it).
        resources: custom Ray resources each shard needs (e.g. ``{"replay_node": 1}`` to keep shards on nodes
            that offer them).
        single_shard_batches: draw each batch from one shard, chosen with probability M_k / M (its share of
            the mass): one sample call and one priority-update call per batch instead of one per shard. Each
            draw's P(i) = (M_k / M)(m_i / M_k) = m_i / M stays exact, but the draws of a batch are no longer
            independent across shards, and stratification spans only the chosen shard's mass. IS weights keep
            their closed form; buffer-wide normalisation takes the other shards' totals from their latest
            replies. Default False: every shard draws its share of every batch.

    The learner's side: :meth:`sample` (reads the totals, then samples: the union's exact P(i)),
    :meth:`sample_async` (pipelined: keep several in flight), :meth:`update_priorities` (sent without
    waiting). Actors write straight to a shard: ``replay.shards[k].add.remote(fields, td_errors)``.
    Every sample must be called from one process (the learner); any process may add.
    """

    rate_limiter: RateLimiter | None = None
    sample_timeout: float | None = None
    single_shard_batches = False
    _field_specs: dict | None = None
    _stat_refs: list = []  # noqa: RUF012 - replaced per instance before any use
    _batches_since_stats = 0

    def __init__(self, num_shards: int, capacity: int, sampler: Sampler | None = None, *, seed: int | None = None,
                 checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 0, resume: bool = False,
                 max_restarts: int = -1, num_cpus: float = 0.0, rate_limiter: RateLimiter | None = None,
                 sample_timeout: float | None = None, single_shard_batches: bool = False,
                 scheduling_strategy: Any = "SPREAD", memory: int = 0,
                 resources: Mapping[str, float] | None = None) -> None:
        num_shards = check_positive_int(num_shards, "num_shards")
        placement = _check_placement(scheduling_strategy, memory, resources)
        if num_shards > MAX_SHARDS:  # the shard bits of a global id
            raise ValueError(f"num_shards: at most {MAX_SHARDS}, got {num_shards!r}")
        capacity = _check_capacity(capacity, num_shards)
        if type(checkpoint_every) is not int or checkpoint_every < 0:
            raise ValueError(f"checkpoint_every: an int >= 0, got {short(checkpoint_every)}")
        sampler = _check_shard_sampler(sampler)
        seed = _check_seed(seed)
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise TypeError(f"rate_limiter: a perx.distributed.RateLimiter or None, got {short(rate_limiter)}")
        if sample_timeout is not None:
            sample_timeout = check_real(sample_timeout, "sample_timeout", low=0.0)
        if not isinstance(single_shard_batches, bool):
            raise TypeError(f"single_shard_batches: a bool, got {short(single_shard_batches)}")
        if not ray.is_initialized():
            raise RuntimeError("ShardedReplay: call ray.init(...) first (a local cluster or address=...)")
        self.num_shards = num_shards
        seeds = self._configure(capacity, sampler, seed)
        store = None if checkpoint_dir is None else CheckpointStore(checkpoint_dir)
        folder = None if store is None else store.location
        if resume and store is not None:  # before any actor exists: a mismatch must not start a job
            for k in range(num_shards):
                if store.exists(f"shard-{k}.json"):
                    _check_resumable(store.read_json(f"shard-{k}.json"), k, folder, self.shard_capacity,
                                     self.prototype)
        #: This replay's token: a shard that finds files of its own job knows Ray restarted it.
        self.job = os.urandom(8).hex()
        meta_dir = str(Path(tempfile.gettempdir()) / "perx-shards" / self.job)
        actor = ray.remote(Shard).options(max_restarts=max_restarts, max_task_retries=-1, num_cpus=num_cpus,
                                          **placement)
        #: The shard actors' handles: writers call ``shards[k].add.remote(fields, td_errors)``.
        self.shards = [actor.remote(k, self.shard_capacity, self.prototype, seed=seeds[k], checkpoint_dir=folder,
                                    checkpoint_every=checkpoint_every, resume=resume, job=self.job,
                                    meta_dir=meta_dir)
                       for k in range(num_shards)]
        self._stats: list[dict[str, Any] | None] = [None] * num_shards
        self._updates: list[tuple[int, Any]] = []
        #: Counts of priority updates the shards applied and skipped as stale (from replies received).
        self.applied = 0
        self.skipped = 0
        #: Update calls lost with a shard that was not restarted, and calls a shard refused.
        self.lost_updates = 0
        self.failed_updates = 0
        #: One record per shard restart seen: shard, incarnation, the checkpoint's next id, and how many
        #: transitions the learner had seen that the checkpoint lacks (a lower bound of what was lost).
        self.restarts: list[dict[str, Any]] = []
        #: Per shard, the instance tokens of its processes that a restart replaced (their late replies are old).
        self._replaced: list[set[str]] = [set() for _ in range(num_shards)]
        #: Samples per insert held within a band (None: no limit); see :meth:`can_insert`.
        self.rate_limiter = rate_limiter
        self.sample_timeout = sample_timeout
        self.single_shard_batches = single_shard_batches
        self._stat_refs = []
        self._batches_since_stats = 0
        self.refresh()

    def _configure(self, capacity: int, sampler: Sampler, seed: int | None) -> list[int]:
        # the arguments are validated by the callers, so nothing below can fail half way
        self.prototype = sampler
        self.shard_capacity = -(-capacity // self.num_shards)
        seeds = np.random.SeedSequence(seed).spawn(self.num_shards + 1)
        self._rng = np.random.default_rng(seeds[0])
        cfg = self.prototype.config()
        self.stratified = bool(cfg.get("stratified", False))
        self.importance_sampling = isinstance(self.prototype, Proportional) and self.prototype.importance_sampling
        self.batch_normalized = cfg.get("normalize") == "batch"
        return [int(s.generate_state(1)[0]) for s in seeds[1:]]

    def reset(self, capacity: int, sampler: Sampler | None = None, *, seed: int | None = None) -> None:
        """Empty every shard and start over with a new capacity and sampler, on the same actors (no new
        processes). Ids issued before are stale afterwards; counters and restart records are cleared."""
        capacity = _check_capacity(capacity, self.num_shards)
        sampler = _check_shard_sampler(sampler)
        seed = _check_seed(seed)  # every argument before anything changes
        self.flush()
        seeds = self._configure(capacity, sampler, seed)
        replies = ray.get([sh.reset.remote(self.shard_capacity, sampler, seeds[k]) for k, sh in enumerate(self.shards)])
        for k, stats in enumerate(replies):
            old = self._stats[k]
            if old is not None and old["instance"] != stats["instance"]:  # restarted since its last reply
                self._replaced[k].add(old["instance"])
        self._stats = list(replies)
        self._field_specs = None  # the next batch shows the new fields
        self.applied = self.skipped = self.lost_updates = self.failed_updates = 0
        self.restarts = []

    # -- totals --------------------------------------------------------------------------------------
    def _note(self, stats: dict[str, Any]) -> None:
        k = stats["shard"]
        old = self._stats[k]
        if old is not None and stats["instance"] != old["instance"]:
            # Another process. Incarnations cannot tell which is newer (one restarted where its incarnation
            # file is not draws a random one, maybe lower), but Ray restarts an actor only after its process
            # died: a process the learner has not seen replaced the one it had, and a reply of one already
            # replaced is late (collected after its successor's).
            if stats["instance"] in self._replaced[k]:
                return
            self._replaced[k].add(old["instance"])
            restored = stats["restored_next_id"] or 0
            grew = stats["incarnation"] - old["incarnation"]
            self.restarts.append({"shard": k, "incarnation": stats["incarnation"], "restored_next_id": restored,
                                  # restarts since the last reply seen: None when unknown (at least one)
                                  "restarts": grew if grew > 0 and not stats["incarnation_drawn"] else None,
                                  "seen_next_id": old["next_id"],
                                  "lost_at_least": max(0, old["next_id"] - restored), "time": time.time()})
            self._stats[k] = stats
            return
        # one process: its version grows with every change (reset() included), and replies can arrive out of
        # order (updates are collected late): keep the newest state
        if old is None or stats["version"] >= old["version"]:
            self._stats[k] = stats

    def refresh(self) -> list[dict[str, Any]]:
        """Read every shard's stats now (one round trip); returns them."""
        for stats in _get_retrying(lambda k: self.shards[k].stats.remote(), range(self.num_shards)):
            self._note(stats)
        return list(self._stats)

    def __len__(self) -> int:
        """Transitions stored, as of the latest replies."""
        return sum(s["size"] for s in self._stats)

    @property
    def stats(self) -> list[dict[str, Any]]:
        """The latest stats of every shard (as of the last reply from each)."""
        return list(self._stats)

    @property
    def shard_nodes(self) -> list[str | None]:
        """The Ray node id of every shard, as of the last reply from each (a restarted shard may have moved)."""
        return [s.get("node") if s is not None else None for s in self._stats]

    # -- sampling ------------------------------------------------------------------------------------
    def _counts(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        totals = np.array([s["total"] for s in self._stats])
        if not totals.max() > 0.0:
            raise ValueError("sample: the replay is empty (or every priority is 0); add transitions first")
        # Each shard keeps its own total finite, but K of them may still sum past float64's maximum: scale by
        # the largest one's power of two (exact), so the sum is at most K and q_k = M_k / M keeps full precision
        totals = np.ldexp(totals, -np.frexp(totals.max())[1])
        grand = totals.sum()
        if self.single_shard_batches:  # one shard for the whole batch, with probability M_k / M
            k = int(np.searchsorted(np.cumsum(totals), self._rng.random() * grand, side="right"))
            k = min(k, int(np.flatnonzero(totals > 0)[-1]))
            counts = np.zeros(self.num_shards, np.int64)
            counts[k] = batch_size
            return counts, totals / grand
        if self.stratified:  # one point in each of B equal ranges of the global mass (000 App. B.2.1)
            points = (np.arange(batch_size) + self._rng.random(batch_size)) * (grand / batch_size)
        else:
            points = self._rng.random(batch_size) * grand
        k = np.searchsorted(np.cumsum(totals), points, side="right")
        k = np.minimum(k, np.flatnonzero(totals > 0)[-1])  # rounding at the top end
        return np.bincount(k, minlength=self.num_shards), totals / grand

    def sample_async(self, batch_size: int, beta: float = 1.0, *, out: Batch | Mapping | None = None
                     ) -> PendingBatch:
        """Start drawing a batch; ``.result()`` returns the :class:`perx.Batch`. Keep a few in flight.

        The split between shards uses the totals of the latest replies (one round old when pipelined).
        ``out``: see :meth:`sample`.
        """
        batch_size = check_batch_size(batch_size)
        beta = check_real(beta, "beta", low=0.0, high=1.0)
        dest = None if out is None else _check_out(out, batch_size, self._field_specs)
        if self.rate_limiter is not None:
            self._wait_to_sample(batch_size)
        pending = self._draw(batch_size, beta)
        # checked against the fields' shapes now if a batch has shown them, else when the replies arrive
        pending.out, pending.out_checked = dest, self._field_specs is not None
        return pending

    def _draw(self, batch_size: int, beta: float) -> PendingBatch:
        """Send the sample calls of one batch (the rate limiter already charged, if any)."""
        if self.single_shard_batches:
            self._refresh_in_background()
        counts, q = self._counts(batch_size)
        # every shard draws its share (0 included: its reply refreshes its totals), or only the one chosen
        keys = np.flatnonzero(counts).tolist() if self.single_shard_batches else list(range(self.num_shards))
        refs = [self.shards[k].sample.remote(int(counts[k])) for k in keys]
        return PendingBatch(self, refs, counts, q, beta, keys)

    def _refresh_in_background(self) -> None:
        """Single-shard batches call one shard, so the others' totals would go stale (and a shard seen empty
        would never be chosen): every ``num_shards`` batches, ask every shard for its stats without waiting,
        and note the replies that have come by the next batch."""
        if self._stat_refs:
            ready, self._stat_refs = ray.wait(self._stat_refs, num_returns=len(self._stat_refs), timeout=0)
            for ref in ready:
                try:
                    self._note(ray.get(ref))
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                    pass  # a restarting shard: its next reply will say so
        self._batches_since_stats += 1
        if not self._stat_refs and self._batches_since_stats >= self.num_shards:
            self._stat_refs = [sh.stats.remote() for sh in self.shards]
            self._batches_since_stats = 0

    def _inserted(self) -> int:
        """Transitions the writers have inserted in all, as of the latest replies (each shard's next id)."""
        return sum(s["next_id"] for s in self._stats if s is not None)

    def _wait_to_sample(self, batch_size: int) -> None:
        limiter = self.rate_limiter
        limiter.inserted_to(self._inserted())
        start = time.monotonic()
        while not limiter.can_sample(batch_size):
            if self.sample_timeout is not None and time.monotonic() - start > self.sample_timeout:
                raise TimeoutError(f"sample: the rate limiter held a sample of {batch_size} for "
                                   f"{self.sample_timeout:g} s (sample_timeout): {limiter.state()}")
            time.sleep(0.002)
            self.refresh()
            limiter.inserted_to(self._inserted())
        limiter.sampled_more(batch_size)

    def can_sample(self, n: int) -> bool:
        """Whether the rate limiter lets a sample of ``n`` go now (always True without one), by the latest
        replies; :meth:`sample_async` waits for this."""
        if self.rate_limiter is None:
            return True
        self.rate_limiter.inserted_to(self._inserted())
        return self.rate_limiter.can_sample(check_positive_int(n, "n"))

    def can_insert(self, n: int, pending: int = 0) -> bool:
        """Whether the rate limiter lets writers insert ``n`` more transitions now, ``pending`` being already on
        their way (always True without one), by the latest replies (call :meth:`refresh` for fresh counts). A
        driver that starts the writers' work (as Ape-X's learner starts each actor's ``collect``) asks
        before starting more."""
        if self.rate_limiter is None:
            return True
        self.rate_limiter.inserted_to(self._inserted())
        return self.rate_limiter.can_insert(check_positive_int(n, "n"), int(pending))

    def sample(self, batch_size: int, beta: float = 1.0, *, out: Batch | Mapping | None = None) -> Batch:
        """Read the shards' totals, then draw a batch: ``batch.probabilities`` are the union's P(i) =
        m_i / sum of all masses and ``batch.weights`` its IS weights (000 eq. 1 and Sec. 3.4), when no
        one writes between the two round trips.

        ``out``: a batch returned before (its field arrays are reused) or a dict of preallocated arrays, one
        per field (a dict field: a dict of them), each ``[batch_size, *field shape]`` of the field's dtype
        and writable, e.g. pinned memory for a GPU learner. The shards' replies are copied straight into
        them (one copy, from Ray's object store; without ``out`` the same copy goes to new arrays). Checked
        before anything is drawn once a batch has shown the fields' shapes; on the first batch a mismatch is
        found only as the replies arrive (ValueError naming the field; the draws are spent, nothing else
        changes).
        """
        self.refresh()
        return self.sample_async(batch_size, beta, out=out).result()

    def _assemble(self, replies: Sequence[tuple], counts: np.ndarray, q: np.ndarray, beta: float,
                  keys: Sequence[int], out: dict | None = None, out_checked: bool = False) -> Batch:
        datas, ids, probs, p_min = [], [], [], np.inf
        for k, (data, gids, local_p, stats) in zip(keys, replies, strict=True):
            self._note(stats)
            if q[k] > 0.0 and stats["total"] > 0.0:
                p_min = min(p_min, q[k] * stats["min"] / stats["total"])
            if data is not None:
                datas.append(data)
                ids.append(gids)
                probs.append(q[k] * local_p)
        if len(keys) < self.num_shards:  # shards not called: their smallest P from their latest replies
            for k in set(range(self.num_shards)) - set(keys):
                st = self._stats[k]
                if q[k] > 0.0 and st is not None and st["total"] > 0.0:
                    p_min = min(p_min, q[k] * st["min"] / st["total"])
        if not datas:  # every shard chosen was emptied by a restart without a checkpoint
            raise ValueError("sample: the shards chosen had nothing stored (restarted without a checkpoint?)")
        if self._field_specs is None:  # the fields' shapes and dtypes, for checking ``out`` before drawing
            self._field_specs = {name: _spec(datas[0][name]) for name in datas[0]}
        if out is not None and not out_checked:
            _check_out(out, int(counts.sum()), self._field_specs)
        data = {name: _concat([d[name] for d in datas], None if out is None else out[name]) for name in datas[0]}
        p = np.concatenate(probs)
        if self.importance_sampling and beta > 0.0:
            ref = p.min() if self.batch_normalized else p_min
            # w_i = (N P_i)^-beta / max_j (N P_j)^-beta = (P_i / P_min)^-beta (000 Sec. 3.4)
            weights = np.exp(-beta * (np.log(p) - np.log(ref)))
        else:
            weights = np.ones(len(p))
        return Batch(data, np.concatenate(ids), weights, p)

    # -- priorities ----------------------------------------------------------------------------------
    def update_priorities(self, indices, td_errors, *, raw: bool = False, wait: bool = False) -> int | None:
        """Send new TD errors (or raw priorities with ``raw``) of sampled ids to their shards, without
        waiting (``wait=True`` waits for every update sent so far and returns how many of this call's ids
        were applied). Stale ids are skipped by the
        shards and counted in :attr:`skipped`. Bad values raise here, before anything is sent, and so do
        priorities above a shard's ``max_accepted_priority`` (from its stats)."""
        ids = as_index_array(indices, "indices")
        values = _values(td_errors, "priorities" if raw else "td_errors", len(ids))
        # global ids carry shard bits (encode_ids), so their range is checked here, not by the core's upper=
        if (ids < 0).any():
            raise ValueError(f"indices: ids are >= 0, got {short(ids)}")
        shard = ids & _SHARD_MASK
        if len(ids) and shard.max() >= self.num_shards:
            raise ValueError(f"indices: id {int(ids[shard >= self.num_shards][0])} names shard "
                             f"{int(shard[shard >= self.num_shards][0])} of {self.num_shards}")
        self._check_caps(values, shard, raw)
        order = np.argsort(shard, kind="stable")  # keeps each shard's updates in order: the last one wins
        bounds = np.searchsorted(shard[order], np.arange(self.num_shards + 1))
        sent = set()
        for k in range(self.num_shards):
            part = order[bounds[k]:bounds[k + 1]]
            if len(part):
                ref = self.shards[k].update.remote(ids[part], values[part], raw)
                self._updates.append((k, ref))
                sent.add(ref)
        if wait:
            # a flush also collects earlier updates sent without waiting: count only this call's replies
            return self._collect_updates(block=True, count=sent)
        self._collect_updates(block=False)
        return None

    def _check_caps(self, values: np.ndarray, shard: np.ndarray, raw: bool) -> None:
        """Refuse priorities above their shard's cap here: sent, one shard would refuse its part while the
        others apply theirs, leaving the update half applied."""
        if not isinstance(self.prototype, Proportional) or not len(values):
            return
        p = values if raw else self.prototype.priority(values)  # the shards' priority function (same config)
        caps = np.array([s["max_accepted_priority"] for s in self._stats])[shard]
        bad = ~(p <= caps)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{'priorities' if raw else 'td_errors'}: the value {float(values[i])!r} at position "
                             f"{i} gives priority {float(p[i])!r}, above {float(caps[i])!r}, the largest shard "
                             f"{int(shard[i])} accepts (its sum of masses p**alpha must stay finite); nothing was "
                             f"sent")

    def _collect_updates(self, block: bool, count: set | None = None) -> int:
        """Account for the update replies that have arrived (every one with ``block``); returns how many
        ids the replies to the calls in ``count`` applied."""
        if not self._updates:
            return 0
        refs = [r for _, r in self._updates]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=None if block else 0)
        if not ready:
            return 0
        counted = 0
        done = set(ready)
        self._updates = [(k, ref) for k, ref in self._updates if ref not in done]
        error = None
        for ref in ready:
            try:
                applied, skipped, stats = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self.lost_updates += 1  # the shard died for good with the update (no restarts left)
                continue
            except ray.exceptions.RayTaskError as err:  # e.g. an id that was never issued
                self.failed_updates += 1
                error = error or err
                continue
            self.applied += applied
            self.skipped += skipped
            if count is not None and ref in count:
                counted += applied
            self._note(stats)
        if error is not None:  # raised once, after every reply received has been accounted for
            raise ValueError(f"update_priorities: a shard refused an update: {error.cause!r}") from error
        return counted

    def flush(self) -> None:
        """Wait for every priority update sent so far."""
        self._collect_updates(block=True)

    def checkpoint(self) -> list[str | None]:
        """Every shard saves its buffer now (atomic); returns the paths."""
        return ray.get([s.checkpoint.remote() for s in self.shards])

    def add(self, shard: int | None = None, td_errors=None, priorities=None, **fields: Any) -> np.ndarray:
        """Store a batch of transitions in one shard (round-robin when ``shard`` is None) and wait;
        returns their global ids. Actors should call the shard actors directly, without waiting."""
        if shard is None:
            shard = self._next_shard = (getattr(self, "_next_shard", -1) + 1) % self.num_shards
        elif isinstance(shard, bool) or not isinstance(shard, (int, np.integer)) or not 0 <= shard < self.num_shards:
            # -1 or True would index self.shards (shard K-1, shard 1) instead of being refused
            raise ValueError(f"shard: an int in [0, {self.num_shards}), got {short(shard)}")
        stats = ray.get(self.shards[shard].add.remote(fields, td_errors, priorities, return_ids=True))
        ids = stats.pop("ids")
        self._note(stats)
        return ids

    def close(self) -> None:
        """Kill the shard actors (their checkpoints stay on disk), after waiting for the updates sent; an
        update a shard refused is raised after the actors are killed, not instead of it."""
        try:
            self.flush()
        finally:
            for s in self.shards:
                ray.kill(s, no_restart=True)


class PendingBatch:
    """A batch being drawn by the shards; :meth:`result` waits for it."""

    def __init__(self, replay: ShardedReplay, refs: list, counts: np.ndarray, q: np.ndarray, beta: float,
                 keys: Sequence[int] | None = None) -> None:
        self.replay, self.refs, self.counts, self.q, self.beta = replay, refs, counts, q, beta
        #: Preallocated destination arrays (``sample(out=)``), or None, and whether they were checked against
        #: the fields' shapes already.
        self.out: dict | None = None
        self.out_checked = False
        #: The shards called, in the order of ``refs``.
        self.keys = list(range(replay.num_shards)) if keys is None else list(keys)

    def ready(self) -> bool:
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def result(self) -> Batch:
        replay, pending = self.replay, self
        for attempt in range(_DRAWS):
            if attempt:
                # a shard chosen by the split had lost its mass (restarted empty, or priorities set to 0):
                # its draws cannot be made, and dropping them would bias the rest, so the batch is drawn
                # again from fresh totals
                replay.refresh()
                pending = replay._draw(int(self.counts.sum()), self.beta)  # charged once, by the first draw
            replies = _get_retrying(lambda k, p=pending: replay.shards[k].sample.remote(int(p.counts[k])),
                                    pending.keys, first=pending.refs)
            short = [k for k, r in zip(pending.keys, replies, strict=True) if len(r[1]) < pending.counts[k]]
            if not short:
                return replay._assemble(replies, pending.counts, pending.q, pending.beta, pending.keys, self.out,
                                        self.out_checked)
            for r in replies:
                replay._note(r[3])
        raise RuntimeError(f"sample: {_DRAWS} draws in a row found shards chosen by the split without the mass "
                           f"their latest totals promised (last: shards {short}); they keep losing it (restarting "
                           f"empty, or priorities set to 0 meanwhile), or their totals are misread")


#: Tries of one batch: a shard that lost its mass after the learner read its total is drawn again from
#: fresh totals, but a shard that never delivers must end in an error, not in endless redraws.
_DRAWS = 5


def _get_retrying(submit, keys, first: list | None = None, attempts: int = 50) -> list:
    """ray.get of one call per key; a call whose actor was unavailable (restarting) is submitted again."""
    keys = list(keys)
    refs = list(first) if first is not None else [submit(k) for k in keys]
    out: list[Any] = [None] * len(keys)
    todo = list(range(len(keys)))
    for attempt in range(attempts):
        failed = []
        for i in todo:
            try:
                out[i] = ray.get(refs[i])
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
                failed.append(i)
        if not failed:
            return out
        time.sleep(min(0.05 * 2 ** attempt, 1.0))
        for i in failed:
            refs[i] = submit(keys[i])
        todo = failed
    raise RuntimeError(f"ShardedReplay: shards {[keys[i] for i in todo]} stayed unavailable after {attempts} tries")


def _concat(parts: list, out: Any = None) -> np.ndarray | dict:
    """The shards' arrays of one field, concatenated (a dict field: key by key) into ``out`` or a new array.
    Always a writable copy, even from one shard: Ray hands large arrays over read-only, straight from its
    object store."""
    if isinstance(parts[0], dict):
        return {k: _concat([p[k] for p in parts], None if out is None else out[k]) for k in parts[0]}
    return np.concatenate(parts, out=out)


def _spec(value: Any) -> Any:
    """(trailing shape, dtype) of one field's array (a dict field: key by key)."""
    if isinstance(value, dict):
        return {k: _spec(v) for k, v in value.items()}
    return (tuple(value.shape[1:]), np.dtype(value.dtype))


def _check_out(out: object, batch_size: int, specs: dict | None) -> dict:
    """``out`` of a sample as a dict of writable arrays of ``batch_size`` rows (TypeError / ValueError naming
    ``out`` and the field), matching ``specs`` (the fields' shapes and dtypes) when known."""
    data = out.data if isinstance(out, Batch) else out
    if not isinstance(data, Mapping):
        raise TypeError(f"out: a perx.Batch or a dict of arrays, one per field, got {short(out)}")

    def check(name: str, value: Any, spec: Any) -> None:
        if isinstance(spec, dict) or (spec is None and isinstance(value, Mapping)):
            if not isinstance(value, Mapping) or (spec is not None and set(value) != set(spec)):
                raise ValueError(f"out[{name}]: a dict with keys {sorted(spec or {})}, got {short(value)}")
            for k, v in value.items():
                check(f"{name}][{k!r}", v, None if spec is None else spec[k])
            return
        if not isinstance(value, np.ndarray) or value.ndim < 1 or len(value) != batch_size:
            raise ValueError(f"out[{name}]: an array of {batch_size} rows, got {short(value)}")
        if not value.flags.writeable:
            raise ValueError(f"out[{name}]: a writable array, got a read-only one")
        if spec is not None and (tuple(value.shape[1:]), value.dtype) != spec:
            raise ValueError(f"out[{name}]: shape [{batch_size}, {', '.join(map(str, spec[0]))}] of {spec[1]}, "
                             f"got {list(value.shape)} of {value.dtype}")

    if specs is not None and set(data) != set(specs):
        raise ValueError(f"out: one array per field {sorted(specs)}, got {sorted(data)}")
    for name, value in data.items():
        check(repr(name), value, None if specs is None else specs[name])
    return dict(data)
