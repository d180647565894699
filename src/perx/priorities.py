"""Priority variants of 000 Appendix A, as configuration between a learner's TD errors and the buffer.

A :class:`Prioritizer` replaces ``buf.update_priorities``; its rules map the TD errors to priorities::

    prio = perx.Prioritizer(buf, perx.priorities.LearningProgress(), perx.priorities.Asymmetric(2.0))
    batch = buf.sample(32, beta)
    ...                                   # compute td_errors for the batch
    prio.update(batch.indices, td_errors)  # instead of buf.update_priorities(batch.indices, td_errors)

One update of ids with TD errors delta:

1. e = |delta|, then each rule in order maps e (``LearningProgress``, ``Asymmetric``, ``ReturnBoost``,
   ``Staleness``); rules may read delta's sign and per-transition state;
2. e is written with ``buf.update_priorities``, so the sampler applies its own priority function
   (``max(e + eps, min_priority)`` for ``perx.Proportional`` and ``perx.LAP``, e itself for the heap samplers,
   each component's own for a ``perx.Hybrid``);
3. the rules record what they need for the next replay, and ``PredecessorBoost`` raises the priorities of
   the replayed transitions' predecessors.

Everything is validated before anything changes: bad input raises and leaves buffer and rules as they were.
Per-transition state is kept per slot with the id that owns it, so a slot reused by a new transition starts
fresh (stale-safe), and stale ids are skipped as by the buffer.

Works with every sampler except where a rule says otherwise (``Staleness`` needs an order-based sampler and
must be the last magnitude rule; ``PredecessorBoost`` needs one priority per transition: not ``Uniform`` or
``Hybrid``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from perx.buffer import ReplayBuffer
from perx.validation import _short, as_index_array, as_value_array, check_real

__all__ = [
    "Asymmetric",
    "LearningProgress",
    "PredecessorBoost",
    "Prioritizer",
    "PriorityRule",
    "ReturnBoost",
    "Staleness",
]


@dataclass
class Update:
    """One update as the rules see it: ids and slots (int64 [B]), TD errors (float64 [B]), which ids are
    live (bool [B]) and the prioritizer's clock (updates so far, plus the target-copy bonus)."""

    ids: np.ndarray
    slots: np.ndarray
    td: np.ndarray
    live: np.ndarray
    clock: float


class PriorityRule:
    """Base of the rules. ``apply`` must not change state; ``commit`` records after the write succeeded."""

    def bind(self, prioritizer: Prioritizer) -> None:
        """Called once by the :class:`Prioritizer`; allocate per-slot state here."""

    def apply(self, u: Update, e: np.ndarray) -> np.ndarray:
        """The new magnitude (float64 [B], >= 0) from the incoming one ``e``. Pure."""
        return e

    def commit(self, u: Update, e_in: np.ndarray, e_out: np.ndarray) -> None:
        """Record state for the live ids of an update that was written."""

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        self.check_state(arrays)
        for name, arr in self.state_dict().items():
            arr[...] = arrays[name]

    def check_state(self, arrays: dict[str, np.ndarray]) -> None:
        """ValueError unless ``arrays`` has exactly this rule's arrays, shapes and dtypes. Changes nothing."""
        if not isinstance(arrays, dict):
            raise ValueError(f"{type(self).__name__} state: expected a dict of arrays, got {_short(arrays)}")
        expected = self.state_dict()
        if set(arrays) != set(expected):
            raise ValueError(f"{type(self).__name__} state: expected arrays {sorted(expected)}, got {sorted(arrays)}")
        for name, arr in expected.items():
            got = np.asarray(arrays[name])
            if got.shape != arr.shape or got.dtype != arr.dtype:
                raise ValueError(f"{type(self).__name__} state[{name!r}]: expected {arr.dtype}{list(arr.shape)}, "
                                 f"got {got.dtype}{list(got.shape)}")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class _PerSlot(PriorityRule):
    """Per-slot state owned by an id: ``_owner[slot] == id`` marks the state as that transition's."""

    def bind(self, prioritizer: Prioritizer) -> None:
        self._owner = np.full(prioritizer.buffer.capacity, -1, np.int64)

    def known(self, u: Update) -> np.ndarray:
        return self._owner[u.slots] == u.ids

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"owner": self._owner}


class LearningProgress(_PerSlot):
    """Priority from the change of the error between replays (000 App. A and its footnote 3).

    Default: e_new = | e_now - e_at_last_replay |, the magnitude of the change in |delta| since the
    transition was last replayed ("its derivative"); at a transition's first replay there is no earlier
    value and e_new = e_now.

    ``sign_rule=True`` (footnote 3, RProp-style, Riedmiller 1994): the priority is multiplied by ``increase``
    while consecutive TD errors of the transition have the same sign and by ``decrease`` when the sign
    flips (unchanged if either is 0), clipped to ``bounds``; the first replay starts from e_now.

    Args:
        sign_rule: use the RProp-style rule instead of the difference.
        increase / decrease: factors of the sign rule, increase >= 1 >= decrease > 0 (RProp: 1.2, 0.5).
        bounds: (low, high) of the sign rule's priority, 0 <= low <= high.

    Cost: O(B); 17 bytes per slot (owner id, last e, last sign), 25 with the sign rule.
    """

    def __init__(self, *, sign_rule: bool = False, increase: float = 1.2, decrease: float = 0.5,
                 bounds: tuple[float, float] = (1e-6, 50.0)) -> None:
        if not isinstance(sign_rule, bool):
            raise TypeError(f"sign_rule: expected a bool, got {_short(sign_rule)}")
        self.sign_rule = sign_rule
        self.increase = check_real(increase, "increase", low=1.0)
        self.decrease = check_real(decrease, "decrease", low=0.0, high=1.0)
        if self.decrease <= 0:
            raise ValueError(f"decrease: must be > 0, got {decrease!r}")
        if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
            raise ValueError(f"bounds: expected (low, high), got {_short(bounds)}")
        low, high = (check_real(b, f"bounds[{k}]", low=0.0) for k, b in enumerate(bounds))
        if low > high:
            raise ValueError(f"bounds: low {low!r} > high {high!r}")
        self.bounds = (low, high)

    def bind(self, prioritizer: Prioritizer) -> None:
        super().bind(prioritizer)
        cap = prioritizer.buffer.capacity
        self._last = np.zeros(cap)  # the incoming magnitude at the last replay
        self._sign = np.zeros(cap, np.int8)  # sign of delta at the last replay
        self._out = np.zeros(cap) if self.sign_rule else np.zeros(0)  # the priority the rule gave then

    def apply(self, u: Update, e: np.ndarray) -> np.ndarray:
        known = self.known(u)
        if not self.sign_rule:
            return np.where(known, np.abs(e - self._last[u.slots]), e)
        turn = np.sign(u.td).astype(np.int8) * self._sign[u.slots]
        factor = np.where(turn > 0, self.increase, np.where(turn < 0, self.decrease, 1.0))
        low, high = self.bounds
        return np.where(known, np.clip(self._out[u.slots] * factor, low, high), e)

    def commit(self, u: Update, e_in: np.ndarray, e_out: np.ndarray) -> None:
        s, live = u.slots[u.live], u.live
        self._owner[s] = u.ids[live]
        self._last[s] = e_in[live]
        self._sign[s] = np.sign(u.td[live]).astype(np.int8)
        if self.sign_rule:
            self._out[s] = e_out[live]

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"owner": self._owner, "last": self._last, "sign": self._sign, "out": self._out}


class Asymmetric(PriorityRule):
    """Positive TD errors weighted more than negative ones of equal size (000 App. A, "Anna Karenina"):
    e_new = positive * e where delta > 0, negative * e where delta < 0. Stateless, O(B).

    With delta = target - Q(s, a), a positive error means the outcome was better than expected.
    """

    def __init__(self, positive: float = 2.0, negative: float = 1.0) -> None:
        self.positive = check_real(positive, "positive", low=0.0)
        self.negative = check_real(negative, "negative", low=0.0)

    def apply(self, u: Update, e: np.ndarray) -> np.ndarray:
        return e * np.where(u.td > 0, self.positive, np.where(u.td < 0, self.negative, 1.0))


class ReturnBoost(_PerSlot):
    """A transition's priority raised by its observed return (000 App. A, episodic return):
    e_new = e + scale * max(G, 0), with G recorded by :meth:`Prioritizer.record_episode` once the
    episode is over: each step's discounted return-to-go (default) or, with ``episode=True``, the whole
    episode's return for every step of it. Transitions without a recorded return are unchanged; negative
    returns add nothing (shift the rewards if an environment's returns are all negative).

    Cost: O(B) per update, O(T) per recorded episode of T steps; 16 bytes per slot.
    """

    def __init__(self, scale: float = 1.0, *, episode: bool = False) -> None:
        self.scale = check_real(scale, "scale", low=0.0)
        if not isinstance(episode, bool):
            raise TypeError(f"episode: expected a bool, got {_short(episode)}")
        self.episode = episode

    def bind(self, prioritizer: Prioritizer) -> None:
        super().bind(prioritizer)
        self._bonus = np.zeros(prioritizer.buffer.capacity)

    def record(self, ids: np.ndarray, live: np.ndarray, rewards: np.ndarray, gamma: float) -> None:
        g = np.empty(len(rewards))
        acc = 0.0
        for t in range(len(rewards) - 1, -1, -1):  # return-to-go, backwards
            acc = rewards[t] + gamma * acc
            g[t] = acc
        if self.episode and len(g):
            g[:] = g[0]
        slots = ids[live] % len(self._owner)
        self._owner[slots] = ids[live]
        self._bonus[slots] = self.scale * np.maximum(g[live], 0.0)

    def apply(self, u: Update, e: np.ndarray) -> np.ndarray:
        return e + np.where(self.known(u), self._bonus[u.slots], 0.0)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"owner": self._owner, "bonus": self._bonus}


class Staleness(PriorityRule):
    """A bonus growing linearly with the time since a transition's last replay (000 App. A, footnote 4).

    The bonus rate * (t - t_i) of every transition grows at the same rate, so it need not be rewritten each
    step: each new priority is written as e - rate * t (the footnote's trick), shifted by the constant
    rate * horizon to stay >= 0: e_new = e + rate * (horizon - t). Only the *order* of these values is
    the order of e_i + rate * (t - t_i), so the trick is exact for order-based samplers
    (``perx.RankBased``, ``perx.Greedy``), and those are the ones accepted. Proportional sampling is not
    shift-invariant (P(i) = m_i / sum m changes when every mass moves by the same amount, and masses must
    stay positive), so the constant shift would be part of the distribution; ``perx.Proportional`` is refused.

    The clock t counts the prioritizer's updates; :meth:`Prioritizer.target_updated` (call it when the
    target network is copied) advances it by ``target_bonus`` times the updates since the last copy, the
    footnote's extra bonus for the uncertainty a new target brings.

    Args:
        rate: bonus per clock tick, > 0, in units of |delta|.
        horizon: the largest clock value allowed (ValueError past it); priorities are resolved to about
            rate * horizon * 2.2e-16, so keep it near the training length.
        target_bonus: clock ticks added per update since the last target copy, >= 0.
    """

    ORDER_BASED = ("RankBased", "Greedy")

    def __init__(self, rate: float, *, horizon: float = 1e9, target_bonus: float = 1.0) -> None:
        self.rate = check_real(rate, "rate", low=0.0)
        if self.rate <= 0:
            raise ValueError(f"rate: must be > 0, got {rate!r}")
        self.horizon = check_real(horizon, "horizon", low=1.0)
        self.target_bonus = check_real(target_bonus, "target_bonus", low=0.0)

    def bind(self, prioritizer: Prioritizer) -> None:
        name = prioritizer.buffer.sampler.name
        if name not in self.ORDER_BASED:
            raise ValueError(f"sampler: Staleness is exact only for order-based samplers {self.ORDER_BASED}, got "
                             f"{name}: proportional sampling is not invariant to the common shift the footnote's "
                             f"trick relies on")

    def apply(self, u: Update, e: np.ndarray) -> np.ndarray:
        if u.clock > self.horizon:
            raise ValueError(f"horizon: the clock {u.clock!r} passed the Staleness horizon {self.horizon!r}; "
                             f"create the rule with a larger horizon")
        return e + self.rate * (self.horizon - u.clock)


class PredecessorBoost(PriorityRule):
    """After each update, add ``fraction * |delta|`` of each replayed transition to its predecessor's priority,
    unless the predecessor ended an episode (000 App. A: information trickles backwards like an
    eligibility trace). Predecessors come from ``buf.predecessors`` (recorded links with
    ``perx.Episodes``, otherwise the previous id of a single stream); predecessors no longer stored are
    skipped, and so are those at +inf (not yet replayed by a heap sampler: already above every replayed
    one). Several replayed successors of one predecessor add up. Cost: O(B) plus one priority write.
    """

    def __init__(self, fraction: float = 1.0) -> None:
        self.fraction = check_real(fraction, "fraction", low=0.0)

    def bind(self, prioritizer: Prioritizer) -> None:
        name = prioritizer.buffer.sampler.name
        if name in ("Uniform", "Hybrid"):
            raise ValueError(f"sampler: PredecessorBoost needs a sampler that keeps one priority per transition, "
                             f"got {name} (a Hybrid's components may keep priorities on different scales)")

    def plan(self, prioritizer: Prioritizer, u: Update, written: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(predecessor ids, their boosted priorities) after this update's ``written`` priorities."""
        buf = prioritizer.buffer
        ids = u.ids[u.live]
        if not len(ids):
            return np.empty(0, np.int64), np.empty(0)
        pred = buf.predecessors(ids)
        has = pred >= 0
        if not has.any():
            return np.empty(0, np.int64), np.empty(0)
        targets, inverse = np.unique(pred[has], return_inverse=True)
        add = np.zeros(len(targets))
        np.add.at(add, inverse, self.fraction * np.abs(u.td[u.live][has]))
        current = buf.priorities(targets)
        # a predecessor replayed in this same update: its priority is the one being written now
        last = {int(i): float(p) for i, p in zip(ids, written[u.live], strict=True)}
        for k, t in enumerate(targets):
            if int(t) in last:
                current[k] = last[int(t)]
        keep = np.isfinite(current)
        with np.errstate(over="ignore"):  # an overflow to inf is refused by the caller, naming td_errors
            return targets[keep], current[keep] + add[keep]


class Prioritizer:
    """Computes priorities from TD errors through ``rules`` and writes them to ``buffer``.

    Args:
        buffer: a :class:`perx.ReplayBuffer` with any sampler (see each rule for limits).
        *rules: :class:`PriorityRule` objects, applied in order to e = |delta| (``PredecessorBoost``
            acts after the write, wherever it is listed).

    Attributes:
        clock: updates so far (plus ``target_updated`` bonuses), read by ``Staleness``.
    """

    def __init__(self, buffer: ReplayBuffer, *rules: PriorityRule) -> None:
        if not isinstance(buffer, ReplayBuffer):
            raise TypeError(f"buffer: expected a perx.ReplayBuffer, got {_short(buffer)}")
        for k, rule in enumerate(rules):
            if not isinstance(rule, PriorityRule):
                raise TypeError(f"rules[{k}]: expected a perx.priorities rule, got {_short(rule)}")
        if len({id(r) for r in rules}) != len(rules):
            raise ValueError("rules: the same rule object appears twice")
        if sum(isinstance(r, PredecessorBoost) for r in rules) > 1:
            raise ValueError("rules: at most one PredecessorBoost (give it the sum of the fractions)")
        magnitude = [r for r in rules if not isinstance(r, PredecessorBoost)]
        stale = [k for k, r in enumerate(magnitude) if isinstance(r, Staleness)]
        if stale and stale[0] != len(magnitude) - 1:
            raise ValueError(f"rules: Staleness must be the last rule that maps the magnitude (its constant shift "
                             f"keeps the order only if nothing scales it afterwards); got {list(rules)}")
        self.buffer = buffer
        self.rules = tuple(rules)
        self.clock = 0.0
        self._since_target = 0
        for rule in rules:
            rule.bind(self)

    def __repr__(self) -> str:
        return f"Prioritizer({', '.join(map(repr, self.rules))})"

    def priority(self, e: np.ndarray) -> np.ndarray:
        """The priority the sampler stores for the magnitude e (its own eps and floor), or e if it has no
        priority function (heap samplers store e; a Hybrid applies each component's own)."""
        fn = getattr(self.buffer.sampler, "priority", None)
        return fn(e) if fn is not None else e

    def _prepare(self, indices, td_errors) -> Update:
        ids = as_index_array(indices, "indices")
        td = as_value_array(td_errors, "td_errors", length=len(ids))
        if not np.isfinite(td).all():
            pos = int(np.flatnonzero(~np.isfinite(td))[0])
            raise ValueError(f"td_errors: must be finite; got {td[pos]!r} at position {pos}")
        nid = self.buffer.next_index
        bad = (ids < 0) | (ids >= nid)
        if bad.any():
            raise ValueError(f"indices: {int(ids[bad][0])} was never issued by this buffer; issued ids are "
                             f"0..{nid - 1}")
        live = ids >= nid - self.buffer.capacity
        return Update(ids, ids % self.buffer.capacity, td, live, self.clock)

    def compute(self, indices, td_errors) -> np.ndarray:
        """The priorities :meth:`update` would store (float64 [B]); changes nothing."""
        u = self._prepare(indices, td_errors)
        return self.priority(self._magnitudes(u)[-1])

    def _magnitudes(self, u: Update) -> list[np.ndarray]:
        es = [np.abs(u.td)]
        for rule in self.rules:
            e = np.asarray(rule.apply(u, es[-1]), dtype=np.float64)
            if e.shape != u.td.shape or not (np.isfinite(e) & (e >= 0)).all():
                raise ValueError(f"{rule!r}: produced invalid magnitudes {_short(e)} (need finite values >= 0)")
            es.append(e)
        return es

    def update(self, indices, td_errors) -> int:
        """Write the priorities of ``indices`` from ``td_errors`` (float [B], finite; any sign).

        Returns how many were applied (stale ids are skipped). On any error nothing changes.
        """
        u = self._prepare(indices, td_errors)
        es = self._magnitudes(u)
        boosts = [r.plan(self, u, self.priority(es[-1])) for r in self.rules if isinstance(r, PredecessorBoost)]
        limit = getattr(self.buffer.sampler, "max_accepted_priority", np.inf)
        for _, values in boosts:  # checked before anything is written
            if len(values) and not (np.isfinite(values) & (values <= limit)).all():
                raise ValueError(f"td_errors: a predecessor's boosted priority {float(values.max())!r} is not finite "
                                 f"or exceeds the largest the sampler accepts ({limit!r}); nothing was changed")
        # the magnitudes go through the sampler's own priority function (each component's, for a Hybrid);
        # a refused write raises here, before any rule records anything
        n = self.buffer.update_priorities(u.ids, es[-1])
        for k, rule in enumerate(self.rules):
            rule.commit(u, es[k], es[k + 1])
        for targets, values in boosts:
            if len(targets):
                self.buffer.set_priorities(targets, values)
        self.clock += 1.0
        self._since_target += 1
        return n

    def target_updated(self) -> None:
        """The target network was copied: advance the clock by ``target_bonus`` x the updates since the last
        copy for each ``Staleness`` rule's sake (000 App. A footnote 4)."""
        bonus = max((r.target_bonus for r in self.rules if isinstance(r, Staleness)), default=0.0)
        self.clock += bonus * self._since_target
        self._since_target = 0

    def record_episode(self, indices, rewards, *, gamma: float = 1.0) -> None:
        """Give the steps of one finished episode (ids in time order, their rewards) to the ``ReturnBoost``
        rules. Ids already overwritten are skipped."""
        ids = as_index_array(indices, "indices")
        r = as_value_array(rewards, "rewards", length=len(ids))
        gamma = check_real(gamma, "gamma", low=0.0, high=1.0)
        if not np.isfinite(r).all():
            raise ValueError(f"rewards: must be finite, got {_short(r)}")
        if len(ids) > 1 and not (np.diff(ids) > 0).all():
            raise ValueError(f"indices: an episode's ids must increase with time, got {_short(ids)}")
        nid = self.buffer.next_index
        if len(ids) and (ids.min() < 0 or ids.max() >= nid):
            raise ValueError(f"indices: ids must have been issued (0..{nid - 1}), got {_short(ids)}")
        live = ids >= nid - self.buffer.capacity
        for rule in self.rules:
            if isinstance(rule, ReturnBoost):
                rule.record(ids, live, r, gamma)

    def state_dict(self) -> dict[str, Any]:
        """The clock and every rule's arrays (save them with ``np.savez`` beside the buffer)."""
        return {"clock": self.clock, "since_target": self._since_target,
                "rules": [rule.state_dict() for rule in self.rules]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rules = state.get("rules") if isinstance(state, dict) else None
        if not isinstance(rules, list) or len(rules) != len(self.rules):
            raise ValueError(f"state: expected {len(self.rules)} rule states, got {_short(rules)}")
        clock = check_real(state.get("clock"), "clock", low=0.0)
        since = state.get("since_target")
        if not isinstance(since, (int, np.integer)) or since < 0:
            raise ValueError(f"since_target: expected an int >= 0, got {_short(since)}")
        for rule, arrays in zip(self.rules, rules, strict=True):
            rule.check_state(arrays)
        for rule, arrays in zip(self.rules, rules, strict=True):
            rule.load_state_dict(arrays)
        self.clock, self._since_target = clock, int(since)
