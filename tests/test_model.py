"""Model-based test: long random sequences of every public operation, for every sampler, against a small
pure-Python reference model of what the buffer must hold and report.

A seeded random driver (not Hypothesis' stateful machine: a failure is reproduced by its seed alone).
Each step picks add, extend (sometimes larger than the capacity), sample, update (with stale and duplicate
ids), set_priorities, a refused call of several kinds, or save + load, and checks the result against the
model; every few steps the whole state is compared.
"""

import math

import numpy as np
import pytest

import perx
from perx.samplers import _greedy, _heap
from perx.samplers.rank import segment_probabilities
from tests.conftest import SAMPLERS

FIELDS = {"obs": ((2,), np.float32), "action": ((), np.int16), "reward": ((), np.float64), "done": ((), bool)}


def rows(rng, start, n):
    k = np.arange(start, start + n)
    return {"obs": np.stack([k, rng.standard_normal(n)], axis=1).astype(np.float32),
            "action": (k % 300).astype(np.int16), "reward": rng.standard_normal(n), "done": rng.random(n) < 0.2}


class Model:
    """What the buffer must hold: the rows and priorities of the live ids, the historical maximum."""

    def __init__(self, sampler, capacity):
        self.capacity = capacity
        self.next_id = 0
        self.rows = {}  # id -> {field: value}
        self.prio = {}  # id -> raw priority (Proportional) or key (+inf until replayed; heap samplers)
        self.kind = sampler.name
        if self.kind == "Hybrid":  # each component keeps its own priorities: one model per component
            self.parts = [Model(c, capacity) for c in sampler.components]
        if self.kind == "Proportional":
            self.alpha, self.eps, self.floor = sampler.alpha, sampler.eps, sampler.min_priority
            self.initial = max(1.0, self.eps, self.floor)
            self.top = self.initial  # historical maximum
            self.buffer_max = sampler.max_priority_mode == "buffer"

    @property
    def live(self):
        return range(max(0, self.next_id - self.capacity), self.next_id)

    def new_priority(self, n):
        if self.kind != "Proportional":
            return np.inf
        if not self.buffer_max:
            return self.top
        staying = [i for i in self.live if i >= self.next_id + n - self.capacity]
        if not staying:
            return self.initial
        return max(max(self.prio[i] for i in staying), max(self.eps, self.floor))

    def extend(self, data, n):
        for part in getattr(self, "parts", ()):
            part.extend(data, n)
        p = self.new_priority(n)
        for j in range(n):
            i = self.next_id + j
            self.rows[i] = {k: v[j] for k, v in data.items()}
            self.prio[i] = p
        self.next_id += n
        for i in list(self.rows):
            if i < self.next_id - self.capacity:
                del self.rows[i], self.prio[i]

    def update(self, ids, values, raw):
        for part in getattr(self, "parts", ()):
            part.update(ids, values, raw)
        count = 0
        for i, v in zip(ids.tolist(), values.tolist(), strict=True):
            if i not in self.rows:
                continue
            count += 1
            if self.kind == "Proportional":
                p = v if raw else max(abs(v) + self.eps, self.floor)
                self.top = max(self.top, p)
            else:
                p = v if raw else abs(v)
            self.prio[i] = p
        return count if self.kind not in ("Uniform", "Hybrid") else sum(i in self.rows for i in ids.tolist())

    def masses(self):
        return {i: (1.0 if self.alpha == 0 else p**self.alpha) for i, p in self.prio.items()}

    def order(self):
        """Live ids in exact rank order: key descending, then id ascending."""
        return sorted(self.rows, key=lambda i: (-self.prio[i], i))


def check_state(buf, model, s=None):
    assert buf.next_index == model.next_id and len(buf) == len(model.rows)
    ids = np.array(sorted(model.rows), np.int64)
    if not len(ids):
        return
    slots = ids % buf.capacity
    if s is None:
        for name, arr in buf._storage.data.items():
            np.testing.assert_array_equal(arr[slots], np.array([model.rows[i][name] for i in ids.tolist()]))
        s = buf.sampler
    if model.kind == "Hybrid":
        for comp, part in zip(s.components, model.parts, strict=True):
            check_state(buf, part, comp)
        return
    expected = np.array([model.prio[i] for i in ids.tolist()])
    if model.kind == "Proportional":
        np.testing.assert_array_equal(s.priorities(slots), expected)
        mass = model.masses()
        total = math.fsum(mass.values())
        if total > 0:
            np.testing.assert_allclose(s.probabilities(slots, len(ids)), [mass[i] / total for i in ids.tolist()],
                                   rtol=1e-12)
        if not model.buffer_max:
            assert s.max_priority == model.top
        for now, rebuilt in zip((s._mass, s._heap), s._rebuilt(len(buf)), strict=True):
            np.testing.assert_array_equal(now, rebuilt)
    elif model.kind in ("RankBased", "Greedy"):
        np.testing.assert_array_equal(s.keys(slots), expected)
        if getattr(s, "exact", False):
            true_rank = {i: r for r, i in enumerate(model.order())}
            np.testing.assert_array_equal(s.ranks(slots), [true_rank[i] for i in ids.tolist()])
        elif model.kind == "Greedy":
            _greedy.check(*s._arrays(), buf.capacity)
        else:
            assert _heap.is_heap(s._keys, s._ids, s._pos, len(buf), buf.capacity)


def check_batch(buf, model, batch, size, beta):
    assert ((batch.indices >= model.next_id - len(model.rows)) & (batch.indices < model.next_id)).all()
    for name in batch:
        np.testing.assert_array_equal(batch[name], np.array([model.rows[i][name] for i in batch.indices.tolist()]))
    s = buf.sampler
    if model.kind == "Uniform":
        assert (batch.probabilities == 1 / len(model.rows)).all() and (batch.weights == 1).all()
    elif model.kind == "Proportional":
        mass = model.masses()
        total = math.fsum(mass.values())
        p = np.array([mass[i] / total for i in batch.indices.tolist()])
        np.testing.assert_allclose(batch.probabilities, p, rtol=1e-12)
        if not s.importance_sampling or beta == 0:
            assert (batch.weights == 1).all()
        else:
            positive = [m for m in mass.values() if m > 0]
            ref = min(mass[i] for i in batch.indices.tolist()) if s.normalize == "batch" else min(positive)
            w = [(mass[i] / ref) ** -beta for i in batch.indices.tolist()]
            np.testing.assert_allclose(batch.weights, w, rtol=1e-12)
    elif model.kind == "Greedy":
        np.testing.assert_array_equal(batch.indices, model.order()[:size])
    elif model.kind == "Hybrid":  # the mixture of the components' P(i) with shares k_c / B, batch-normalised weights
        p = np.zeros(size)
        if s.mixing == "random":  # each draw picks component c with probability f_c
            for comp, part, f in zip(s.components, model.parts, s.fractions, strict=True):
                p += f * component_probabilities(buf, part, comp, batch.indices, None)
        for comp, part, kc in zip(s.components, model.parts, s.counts(size), strict=True):
            if kc and s.mixing == "shares":
                p += kc / size * component_probabilities(buf, part, comp, batch.indices, int(kc))
        np.testing.assert_allclose(batch.probabilities, p, rtol=1e-12)
        np.testing.assert_allclose(batch.weights, (p / p.min()) ** -beta, rtol=1e-12)
    else:  # RankBased: reported probabilities are the segment scheme's at the current positions
        positions = s.ranks(batch.indices % buf.capacity)
        k = size if s.n_segments is None else s.n_segments
        if len(model.rows) >= k:
            lo, hi, _, _ = s.boundaries(len(model.rows), k)
            np.testing.assert_array_equal(batch.probabilities, segment_probabilities(lo, hi, positions))
        if s.exact:
            true_rank = {i: r for r, i in enumerate(model.order())}
            np.testing.assert_array_equal(positions, [true_rank[i] for i in batch.indices.tolist()])


def component_probabilities(buf, model, s, ids, k):
    """P(i) of a component sampler in a batch of k draws: from the model where it knows them (uniform,
    proportional masses), else the sampler's segment scheme at its current positions (rank-based)."""
    if model.kind == "Uniform":
        return np.full(len(ids), 1 / len(model.rows))
    if model.kind == "Proportional":
        mass = model.masses()
        total = math.fsum(mass.values())
        return np.array([mass[i] / total for i in ids.tolist()])
    return s.probabilities(ids % buf.capacity, len(model.rows), k)


def drive(name, seed, steps, tmp_path):
    rng = np.random.default_rng(seed)
    capacity = int(rng.choice([1, 2, 7, 16, 33]))
    buf = perx.ReplayBuffer(capacity, SAMPLERS[name](), seed=seed, spec=FIELDS)
    model = Model(buf.sampler, capacity)
    issued = []  # batches of ids handed out earlier (for stale updates)
    for step in range(steps):
        op = rng.choice(["add", "extend", "sample", "update", "set", "bad", "save"],
                        p=[0.15, 0.15, 0.25, 0.25, 0.08, 0.08, 0.04])
        if op == "add":
            data = rows(rng, model.next_id, 1)
            ids = buf.add(**{k: v[0] for k, v in data.items()})
            assert ids.tolist() == [model.next_id]
            model.extend(data, 1)
            issued.append(ids)
        elif op == "extend":
            n = int(rng.integers(0, 2 * capacity + 2))
            data = rows(rng, model.next_id, n)
            ids = buf.extend(**data)
            assert ids.tolist() == list(range(model.next_id, model.next_id + n))
            model.extend(data, n)
            issued.append(ids)
        elif op == "sample" and model.rows:
            size = int(rng.integers(1, 2 * len(model.rows) + 1))
            if model.kind == "Greedy":
                size = min(size, len(model.rows))
            beta = float(rng.choice([0.0, 0.4, 1.0]))
            parts = getattr(model, "parts", [model])
            drawn = ([1] * len(parts) if buf.sampler.mixing == "random" else buf.sampler.counts(size)) \
                if model.kind == "Hybrid" else [1]  # components that may draw
            if any(k and m.kind == "Proportional" and not any(m.masses().values())
                   for m, k in zip(parts, drawn, strict=True)):
                with pytest.raises(ValueError, match="priority 0"):  # set_priorities put every one at 0
                    buf.sample(size, beta=beta)
                continue
            batch = buf.sample(size, beta=beta)
            check_batch(buf, model, batch, size, beta)
            issued.append(batch.indices)
        elif op in ("update", "set") and issued:
            ids = np.concatenate([issued[int(j)] for j in rng.integers(0, len(issued), 2)])
            ids = ids[rng.integers(0, len(ids), rng.integers(1, len(ids) + 2))] if len(ids) else ids
            raw = op == "set"
            values = np.abs(rng.standard_normal(len(ids))) if raw else rng.standard_normal(len(ids)) * 3
            if rng.random() < 0.2:
                values[:] = 0.0
            call = buf.set_priorities if raw else buf.update_priorities
            assert call(ids, values) == model.update(ids, values, raw)
        elif op == "bad" and model.next_id:
            before = buf.sampler.state_dict()
            kind = rng.integers(0, 4)
            with pytest.raises((ValueError, TypeError)):
                if kind == 0:
                    buf.update_priorities([model.next_id - 1, model.next_id], [1.0, 2.0])  # never issued
                elif kind == 1:
                    buf.update_priorities([model.next_id - 1], [np.nan])
                elif kind == 2:
                    data = rows(rng, model.next_id, 3)
                    data["action"] = data["action"].astype(np.int64)
                    data["action"][1] = 40_000  # does not fit the int16 field
                    buf.extend(**data)
                else:
                    buf.set_priorities([model.next_id - 1], [-1.0])
            after = buf.sampler.state_dict()
            assert repr(before[0]) == repr(after[0])
            for key in before[1]:
                np.testing.assert_array_equal(before[1][key], after[1][key])
        elif op == "save":
            path = tmp_path / f"{name}-{seed}.npz"
            buf.save(path)
            twin = perx.ReplayBuffer.load(path)
            check_state(twin, model)
            massless = any(m.kind == "Proportional" and not any(m.masses().values())
                           for m in getattr(model, "parts", [model]))
            if model.rows and model.kind != "Greedy" and not massless:
                size = int(rng.integers(1, 9))
                a, b = buf.sample(size, beta=0.5), twin.sample(size, beta=0.5)
                np.testing.assert_array_equal(a.indices, b.indices)
                np.testing.assert_array_equal(a.weights, b.weights)
            buf = twin  # carry on with the loaded one
        if step % 10 == 0:
            check_state(buf, model)
    check_state(buf, model)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_random_operation_sequences_match_the_model(name, seed, tmp_path):
    drive(name, seed, 300, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(110, 118))
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_long_random_operation_sequences_match_the_model(name, seed, tmp_path):
    drive(name, seed, 2000, tmp_path)
