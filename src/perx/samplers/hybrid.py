"""Hybrid minibatches (000 Appendix A): a fixed share of each batch from one sampler, the rest from others.

With batch size B and shares f_c, component c draws k_c transitions (k_c = f_c B rounded by largest
remainder, so the k_c sum to B). A batch position picked at random then holds a draw from the mixture

    P(i) = sum_c (k_c / B) P_c(i),

and that is the probability ``batch.probabilities`` reports and the IS weights use: w_i = (N P(i))^-beta,
divided by the largest weight in the batch. Every component keeps its own priorities and generator; an
update is written to all of them.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from perx.samplers.base import Sampler, check_update, raise_bad_update, restore_rng, stored_priorities
from perx.samplers.proportional import Proportional
from perx.validation import _short, check_bool, check_choice, check_real
from perx.weights import importance_weights


class Hybrid(Sampler):
    """A mixture of samplers: share ``fractions[c]`` of every batch comes from ``components[c]``.

    Args:
        components: two or more unbound samplers (``perx.Proportional``, ``perx.RankBased``,
            ``perx.Uniform``, ``perx.LAP``, ...). ``perx.Greedy`` is refused: its draws are deterministic,
            so a mixture with it has no per-draw probability for IS weights.
        fractions: the share of each batch from each component, > 0, summing to 1.
        mixing: ``"shares"`` (default): component c draws k_c = f_c B of every batch, rounded by largest
            remainder, and P(i) = sum_c (k_c / B) P_c(i). ``"random"``: each draw picks its component at
            random with probability f_c (counts multinomial), P(i) = sum_c f_c P_c(i) exactly; the choice
            for small batches, where rounding would starve a component (with B = 1 the largest share
            would draw every time).
            A RankBased component then needs fixed ``segments``.
        normalize: only ``"batch"``: weights are divided by the batch's largest weight (the smallest
            probability over the whole buffer of a mixture has no cheap closed form).
        importance_sampling: IS weights for the mixture (default), whatever the components' own setting
            (a ``perx.LAP`` component alone has none); ``False`` returns weights of 1.
        seed: seeds the hybrid's generator and, through ``np.random.SeedSequence``, each component's.

    Example: ``perx.Hybrid([perx.Proportional(0.6), perx.Uniform()], [0.75, 0.25])`` draws 24 of a
    batch of 32 by priority and 8 uniformly (000 App. A: "some fraction of the elements of each
    minibatch sampled according to one priority measure and the rest according to another").

    Cost: the sum of the components' costs, plus one ``probabilities`` call per component for the
    mixture's P(i).
    """

    name = "Hybrid"

    def __init__(self, components: list, fractions: list, *, mixing: str = "shares", normalize: str = "batch",
                 importance_sampling: bool = True, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        if not isinstance(components, (list, tuple)) or len(components) < 2:
            raise ValueError(f"components: expected a list of two or more samplers, got {_short(components)}")
        built = []
        for c, comp in enumerate(components):
            if isinstance(comp, dict):  # from a saved configuration: {"name": ..., "config": {...}}
                cls = Sampler.registry.get(comp.get("name"))  # type: ignore[arg-type]  # any name: None if unknown
                if cls is None or not isinstance(comp.get("config"), dict):
                    raise ValueError(f"components[{c}]: unknown sampler description {_short(comp)}")
                comp = cls(**comp["config"])
            if not isinstance(comp, Sampler):
                raise TypeError(f"components[{c}]: expected a perx sampler, got {_short(comp)}")
            if comp.capacity is not None:
                raise ValueError(f"components[{c}]: {comp!r} is already bound to a buffer; pass a new sampler")
            if comp.name in ("Greedy", "Hybrid"):
                raise ValueError(f"components[{c}]: {comp.name} cannot be mixed (Greedy has no per-draw "
                                 f"probability; nest the shares of a Hybrid into one Hybrid instead)")
            built.append(comp)
        if len({id(c) for c in built}) != len(built):
            raise ValueError("components: the same sampler object appears twice; each needs its own")
        if not isinstance(fractions, (list, tuple, np.ndarray)) or len(fractions) != len(built):
            raise ValueError(f"fractions: expected {len(built)} shares, got {_short(fractions)}")
        f = np.array([check_real(x, f"fractions[{c}]", low=0.0, high=1.0) for c, x in enumerate(fractions)])
        if (f <= 0).any() or abs(f.sum() - 1.0) > 1e-9:
            raise ValueError(f"fractions: each share must be > 0 and they must sum to 1, got {list(f)}")
        self.mixing = check_choice(mixing, "mixing", ("shares", "random"))
        if self.mixing == "random":
            for c, comp in enumerate(built):
                if comp.name == "RankBased" and comp.n_segments is None:  # type: ignore[attr-defined]  # (by its name)
                    raise ValueError(f"components[{c}]: with mixing='random' a RankBased component needs a fixed "
                                     f"`segments`, so that its P(i) does not depend on how many draws it gets")
        self.components = built
        self.fractions = f / f.sum()
        self.normalize = check_choice(normalize, "normalize", ("batch",))
        self.importance_sampling = check_bool(importance_sampling, "importance_sampling")
        if seed is not None:
            self.reseed(seed)

    def config(self) -> dict[str, Any]:
        return {"components": [{"name": c.name, "config": c.config()} for c in self.components],
                "fractions": [float(x) for x in self.fractions], "mixing": self.mixing, "normalize": self.normalize,
                "importance_sampling": self.importance_sampling}

    def reseed(self, seed: int | None) -> None:
        seq = np.random.SeedSequence(seed)
        children = seq.spawn(len(self.components) + 1)
        self._rng = np.random.default_rng(children[0])
        for comp, child in zip(self.components, children[1:], strict=True):
            comp._rng = np.random.default_rng(child)

    def _bind(self, capacity: int) -> None:
        if self.capacity is None:  # (a bound Hybrid: the base class refuses it)
            for c, comp in enumerate(self.components):
                if comp.capacity is not None:  # bound to another buffer since this Hybrid was made
                    raise ValueError(f"components[{c}]: {comp!r} is already bound to a buffer; pass a new sampler")
        super()._bind(capacity)

    def _allocate(self, capacity: int) -> None:
        # All or nothing: a component that cannot allocate leaves every component as it was before (unbound,
        # no arrays), so the same sampler objects can be bound again, to a capacity that fits. Binding only
        # sets attributes, so each component's attributes from before put it back exactly.
        before = [dict(comp.__dict__) for comp in self.components]
        try:
            for comp in self.components:
                comp._bind(capacity)
        except BaseException:
            for comp, attrs in zip(self.components, before, strict=True):
                comp.__dict__.clear()
                comp.__dict__.update(attrs)
            raise

    def counts(self, batch_size: int) -> np.ndarray:
        """How many of a batch of ``batch_size`` each component draws (largest remainder; sums to B)."""
        exact = self.fractions * batch_size
        k = np.floor(exact).astype(np.int64)
        short = batch_size - int(k.sum())
        if short:
            order = np.argsort(-(exact - k), kind="stable")  # ties: the earlier component
            k[order[:short]] += 1
        return k

    # -- the hot path ------------------------------------------------------------------------------
    def on_add(self, slots, ids):
        for comp in self.components:
            comp.on_add(slots, ids)

    def sample(self, batch_size, beta, size, next_id):
        # A refused call leaves every generator (the Hybrid's and each component's) where it was, so the next
        # call draws what it would have drawn without the refused one. What can be checked is checked before
        # anything draws: the batch's arrays are allocated (a batch_size too large is named, as numpy refuses
        # it), and a proportional component with no mass refuses first. Anything else (a component failing
        # halfway) puts every generator back.
        try:
            slots = np.empty(batch_size, np.int64)
            ids = np.empty(batch_size, np.int64)
        except (MemoryError, ValueError, OverflowError) as err:
            kind = MemoryError if isinstance(err, MemoryError) else ValueError
            raise kind(f"batch_size: cannot allocate a batch of {batch_size} transitions ({type(err).__name__}: "
                       f"{err}); choose a smaller batch_size") from None
        shares = self.mixing == "shares"
        if shares:
            k = self.counts(batch_size)
            counts = k.tolist()
            drawing = [comp for comp, kc in zip(self.components, counts, strict=True) if kc > 0]
            needed = drawing
        else:  # the Hybrid's own generator splits the batch, and every component's P(i) is needed
            drawing = [self, *self.components]
            needed = self.components
        for comp in needed:
            if isinstance(comp, Proportional) and not comp._heap[1, 0] > 0.0:
                raise comp._no_mass(size, "sample")  # (what its own sample would raise, before drawing)
        marks = [s._mark() for s in drawing]
        try:
            if not shares:
                k = self._rng.multinomial(batch_size, self.fractions)
                counts = k.tolist()
            parts = [comp.sample(kc, beta, size, next_id)[:2]
                     for comp, kc in zip(self.components, counts, strict=True) if kc > 0]
            np.concatenate([p[0] for p in parts], out=slots)
            np.concatenate([p[1] for p in parts], out=ids)
            if shares:
                probs = self._mixture(slots, size, k, batch_size)
            else:  # each draw picks component c with probability f_c: P(i) = sum_c f_c P_c(i)
                probs = self.probabilities(slots, size, None)
            if self.importance_sampling:
                weights = importance_weights(probs, size, beta, normalize="batch")
            else:
                weights = np.ones(len(probs))
        except BaseException:
            for s, mark in zip(drawing, marks, strict=True):
                s._rewind(mark)
            raise
        return slots, ids, probs, weights

    def _mixture(self, slots, size, k, batch_size):
        probs = np.zeros(len(slots))
        for comp, kc in zip(self.components, k, strict=True):
            if kc > 0:
                probs += kc * comp.probabilities(slots, size, int(kc))
        # the k_c sum to B exactly; a sum of shares of 1 may still round a hair above 1
        return np.minimum(probs / batch_size, 1.0)

    def update(self, ids, values, next_id, *, raw):
        code = check_update(ids, values, next_id, self.capacity, raw)
        if code < 0:
            raise_bad_update(code, ids, values, next_id, raw)
        # A component that would refuse the values (an overflowing mass) must do so before any applies.
        for c, comp in enumerate(self.components):
            limit = getattr(comp, "max_accepted_priority", None)
            if limit is not None and len(values):
                p = values if raw else comp.priority(values)
                if not (p <= limit).all():
                    pos = int(np.flatnonzero(~(p <= limit))[0])
                    raise ValueError(f"{'priorities' if raw else 'td_errors'}: the value {values[pos]!r} at "
                                     f"position {pos} gives priority {p[pos]!r}, above the largest priority "
                                     f"{limit!r} that components[{c}] accepts")
        count = code
        for comp in self.components:
            count = comp.update(ids, values, next_id, raw=raw)
        return count

    def probabilities(self, slots, size, batch_size=None):
        """The mixture's per-draw P(i): shares k_c / B for ``batch_size`` B, or ``fractions`` when None (and
        always with ``mixing="random"``)."""
        if batch_size is None or self.mixing == "random":
            probs = np.zeros(len(slots))
            for comp, f in zip(self.components, self.fractions, strict=True):
                probs += f * comp.probabilities(slots, size, None)
            return np.minimum(probs, 1.0)  # shares summing to 1 may round a hair above it
        return self._mixture(slots, size, self.counts(batch_size), batch_size)

    @property
    def max_accepted_priority(self) -> float:
        """The smallest of the components' largest accepted priorities (inf if none has a limit)."""
        limits = [comp.max_accepted_priority for comp in self.components if hasattr(comp, "max_accepted_priority")]
        return min(limits, default=np.inf)

    @property
    def nbytes(self) -> int:
        return sum(comp.nbytes for comp in self.components)

    def priorities(self, slots: np.ndarray) -> np.ndarray:
        """Stored priorities of the first component that keeps them (every component gets each update)."""
        for comp in self.components:
            if hasattr(comp, "priorities") or hasattr(comp, "keys"):
                return stored_priorities(comp, slots)
        raise ValueError("priorities: no component of this Hybrid keeps priorities (all are Uniform)")

    # -- state ---------------------------------------------------------------------------------------
    def state_dict(self):
        meta, arrays = super().state_dict()
        meta["components"] = []
        for c, comp in enumerate(self.components):
            m, a = comp.state_dict()
            meta["components"].append(m)
            arrays.update({f"c{c}.{name}": arr for name, arr in a.items()})
        return meta, arrays

    def load_state_dict(self, meta, arrays, *, size, next_id):
        from perx.samplers.base import check_keys

        expected_meta, expected_arrays = self.state_dict()
        check_keys(meta, expected_meta, "sampler state")
        check_keys(arrays, expected_arrays, "sampler arrays")
        metas = meta["components"]
        if not isinstance(metas, list) or len(metas) != len(self.components):
            raise ValueError(f"components: expected {len(self.components)} saved states, got {_short(metas)}")
        rng = restore_rng(meta["rng"])
        # every component is checked (loaded into a copy) before any is changed
        loaded = []
        for c, comp in enumerate(self.components):
            prefix = f"c{c}."
            twin = copy.deepcopy(comp)
            twin._load_unguarded(metas[c], {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)},
                                 size=size, next_id=next_id)
            loaded.append(twin)
        for comp, twin in zip(self.components, loaded, strict=True):
            comp.__dict__.update(twin.__dict__)
        self._rng = rng
