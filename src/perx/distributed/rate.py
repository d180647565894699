"""A samples-per-insert rate limiter (the rule of Reverb's ``SampleToInsertRatio``), for :class:`ShardedReplay`.

It keeps the transitions sampled close to ``samples_per_insert`` times the transitions inserted after the
first ``min_size_to_sample``, whatever the speeds of the writers and the learner: with

    credit = samples_per_insert * (inserted - min_size_to_sample) - sampled

a sample of n transitions may go when ``inserted >= min_size_to_sample`` and ``credit - n >= -error_buffer``,
and an insert of m when ``inserted < min_size_to_sample`` or ``credit + samples_per_insert * m <=
error_buffer``. So after the start, credit stays in [-error_buffer, error_buffer]: the faster side waits.
Some side can always go when ``2 * error_buffer >= n + samples_per_insert * m`` (each call checks its own
size and the largest of the other side asked about so far against this, and raises ValueError when the band
is too narrow). Pure Python, no Ray: the driver asks it, and :class:`ShardedReplay` blocks its
samples on it.
"""

from __future__ import annotations

import math
import numbers

from perx.validation import short


class RateLimiter:
    """Samples per insert held within a band; see the module docstring.

    Args:
        samples_per_insert: transitions sampled per transition inserted (> 0), e.g. a replay ratio of 32.
        min_size_to_sample: transitions inserted before the first sample (>= 1).
        error_buffer: half-width of the band, in sampled transitions (> 0).
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int = 1, error_buffer: float = 1024.0) -> None:
        for name, v in (("samples_per_insert", samples_per_insert), ("error_buffer", error_buffer)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name}: a finite number > 0, got {short(v)}")
        if type(min_size_to_sample) is not int or min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample: an int >= 1, got {short(min_size_to_sample)}")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = min_size_to_sample
        self.error_buffer = float(error_buffer)
        #: Transitions inserted (as last told by :meth:`inserted_to`) and sampled (by :meth:`sampled_more`).
        self.inserted = 0
        self.sampled = 0
        self._largest = [0, 0]  # the largest sample and insert asked about: the band must hold both

    def credit(self) -> float:
        """samples_per_insert * (inserted - min_size_to_sample) - sampled."""
        return self.samples_per_insert * (self.inserted - self.min_size_to_sample) - self.sampled

    def _fits(self, n: int, m: int) -> None:
        self._largest = [max(self._largest[0], n), max(self._largest[1], m)]
        n, m = self._largest
        if 2 * self.error_buffer < n + self.samples_per_insert * m:
            raise ValueError(f"error_buffer: {self.error_buffer:g} is too narrow for samples of {n} and inserts of "
                             f"{m} at {self.samples_per_insert:g} samples per insert (needs 2 x error_buffer >= "
                             f"{n + self.samples_per_insert * m:g}); the two sides could block each other")

    def can_sample(self, n: int) -> bool:
        """Whether a sample of ``n`` transitions may go now."""
        self._fits(n, 0)
        return self.inserted >= self.min_size_to_sample and self.credit() - n >= -self.error_buffer

    def can_insert(self, m: int, pending: int = 0) -> bool:
        """Whether an insert of ``m`` transitions may go now, with ``pending`` more already on their way
        (started, not yet counted)."""
        self._fits(0, m)
        return self.inserted + pending < self.min_size_to_sample or (
            self.credit() + self.samples_per_insert * (m + pending) <= self.error_buffer)

    def inserted_to(self, total: int) -> None:
        """The writers have inserted ``total`` transitions in all (counts only grow: a smaller total, after a
        shard came back from an older checkpoint, is ignored)."""
        self.inserted = max(self.inserted, int(total))

    def sampled_more(self, n: int) -> None:
        """``n`` more transitions were sampled."""
        self.sampled += int(n)

    def state(self) -> dict[str, float]:
        return {"inserted": self.inserted, "sampled": self.sampled, "credit": self.credit(),
                "samples_per_insert": self.samples_per_insert, "min_size_to_sample": self.min_size_to_sample,
                "error_buffer": self.error_buffer}
